"""How good an SAE is, by the usual measures, each a small function with its definition in its docstring.

Over ``n`` activation vectors ``x [n, d_in]``, their reconstructions ``x_hat`` and the
feature activations ``acts [n, d_sae]``:

- ``l0``: the mean number of active features per vector, ``mean_i #{f : acts[i, f] != 0}``;
- ``fraction_of_variance_explained``: ``1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2``
  (sums over all ``n`` vectors; ``mean(x)`` is the mean vector over them);
- ``dead_features``: the features with ``acts[:, f] == 0`` on every vector;
- ``ce_loss_recovered``: with ``L`` the model's next-token loss, ``(L_zero - L_spliced) /
  (L_zero - L_clean)``, where ``L_clean`` is the model's own loss, ``L_zero`` the loss with
  the activation the SAE replaces set to zero, and ``L_spliced`` the loss with the SAE's
  reconstruction in its place (no error term). 1 means the SAE loses nothing the model
  uses, 0 that it is no better than zero. Positions holding an excluded token (the BOS)
  keep their activation in both runs, as the splice's ``exclude_special_tokens`` does.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.core.losses import lm_loss
from interp_transformer.sae.data import keep_mask


def l0(acts: Float[Tensor, "n d_sae"]) -> float:
    """Mean number of nonzero features per row."""
    return float((acts != 0).sum(dim=-1).double().mean())


def fraction_of_variance_explained(x: Float[Tensor, "n d_in"], x_hat: Float[Tensor, "n d_in"]) -> float:
    """``1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`` over the rows of ``x``."""
    x, x_hat = x.double(), x_hat.double()
    residual = (x - x_hat).pow(2).sum()
    total = (x - x.mean(dim=0)).pow(2).sum()
    if total == 0:
        raise ValueError(
            "the activations do not vary (every row is the same): the fraction of variance explained is undefined"
        )
    return float(1 - residual / total)


def dead_features(acts: Float[Tensor, "n d_sae"]) -> Tensor:
    """``[d_sae]`` bool: True for a feature that is zero on every row."""
    return (acts != 0).sum(dim=0) == 0


@dataclass(frozen=True)
class CELossRecovered:
    """The next-token losses (nats) with the activation clean, zero-ablated and replaced by the SAE; the recovered
    fraction."""

    clean: float
    zero_ablated: float
    spliced: float

    @property
    def recovered(self) -> float:
        gap = self.zero_ablated - self.clean
        return float("nan") if gap == 0 else (self.zero_ablated - self.spliced) / gap


def _zero_where(mask: Tensor, head: int | None):
    """A hook setting the activation (one head's, for ``head``) to zero at the ``[batch, pos]`` positions in
    ``mask``."""

    def zero_ablate(activation: Tensor, hook) -> Tensor:
        ablated = activation.clone()
        target = ablated if head is None else ablated[..., head, :]
        target[mask.to(activation.device)] = 0.0
        return ablated

    return zero_ablate


@torch.no_grad()
def ce_loss_recovered(
    model, sae, tokens: Int[Tensor, "batch pos"], excluded_ids: Sequence[int] = (), batch_size: int = 8
) -> CELossRecovered:
    """``L_clean``, ``L_zero``, ``L_spliced`` over ``tokens`` (see the module docstring), each a mean over every
    predicted token."""
    if not model.capabilities.next_token_logits:
        raise ValueError("the CE loss recovered needs a model whose output is next-token logits")
    write_name = sae.hook_name_out or sae.hook_name
    excluded = list(excluded_ids)
    totals = torch.zeros(3, dtype=torch.float64)
    for batch in tokens.split(batch_size):
        ablate = _zero_where(keep_mask(batch, excluded), sae.cfg.hook_head_index)
        runs = (
            model(batch),
            model.run_with_hooks(batch, fwd_hooks=[(write_name, ablate)]),
            model.run_with_saes(batch, saes=[sae], exclude_special_tokens=excluded or False),
        )
        totals += torch.tensor([float(lm_loss(logits, batch)) * len(batch) for logits in runs], dtype=torch.float64)
    clean, zero_ablated, spliced = (totals / len(tokens)).tolist()
    return CELossRecovered(clean, zero_ablated, spliced)


@dataclass(frozen=True)
class SAEMetrics:
    """An SAE measured on ``n_tokens`` activation vectors (see the module docstring for each definition)."""

    n_tokens: int
    l0: float
    fraction_of_variance_explained: float
    mse: float  # mean over vectors of ||x - x_hat||^2
    dead_features: int
    d_sae: int
    ce_loss: CELossRecovered | None = None

    @property
    def dead_fraction(self) -> float:
        return self.dead_features / self.d_sae

    def to_dict(self) -> dict:
        out = asdict(self)
        out["dead_fraction"] = self.dead_fraction
        if self.ce_loss is not None:
            out["ce_loss"]["recovered"] = self.ce_loss.recovered
        return out

    def summary(self) -> str:
        line = (
            f"L0 {self.l0:.1f}, variance explained {self.fraction_of_variance_explained:.3f}, "
            f"dead features {self.dead_features}/{self.d_sae} ({self.n_tokens} tokens)"
        )
        if self.ce_loss is not None:
            ce = self.ce_loss
            line += (
                f"; CE loss clean {ce.clean:.3f}, spliced {ce.spliced:.3f}, zero-ablated {ce.zero_ablated:.3f}: "
                f"recovered {ce.recovered:.3f}"
            )
        return line


@torch.no_grad()
def measure(sae, x: Float[Tensor, "n d_in"], chunk: int = 4096) -> SAEMetrics:
    """L0, variance explained, MSE and dead features of ``sae`` on the activation vectors ``x`` (no CE loss)."""
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"measure needs activation vectors [n, d_in] with n >= 1, got shape {tuple(x.shape)}")
    acts, recons = [], []
    for rows in x.split(chunk):
        feature_acts, state = sae.encode_with_state(rows, hooked=False)
        acts.append(feature_acts)
        recons.append(sae.decode_with_state(feature_acts, state, hooked=False))
    acts_all, x_hat = torch.cat(acts), torch.cat(recons).to(x.dtype)
    return SAEMetrics(
        n_tokens=len(x),
        l0=l0(acts_all),
        fraction_of_variance_explained=fraction_of_variance_explained(x, x_hat),
        mse=float((x - x_hat).double().pow(2).sum(dim=-1).mean()),
        dead_features=int(dead_features(acts_all).sum()),
        d_sae=sae.d_sae,
    )


__all__ = [
    "CELossRecovered",
    "SAEMetrics",
    "ce_loss_recovered",
    "dead_features",
    "fraction_of_variance_explained",
    "l0",
    "measure",
]

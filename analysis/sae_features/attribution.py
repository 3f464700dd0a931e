"""Which features matter for one prediction: activation x gradient, and exact direct logit attribution.

On one prompt, with the SAE spliced in with its error term (so the model computes exactly
what it computes without it), for the metric ``m`` (default: ``logit(token) -
logit(incorrect_token)`` at position ``pos``):

**Activation x gradient.** ``acts[p, f] * dm/dacts[p, f]`` at every position ``p``: the
first-order change of ``m`` if feature ``f`` at ``p`` were switched off, through every path
(later layers included). As in SAELens the error term is held fixed (no gradient).

**Direct logit attribution (DLA).** With the final norm's scale ``s`` frozen to its value at
``pos`` and ``d = W_U[:, token] - W_U[:, incorrect_token]``, a vector ``v`` written at the SAE's
hook adds ``to_residual(v) . pull_back(d) / s`` to ``m`` directly (``writes``,
``analysis.readouts.attribution``). What the hook holds at ``pos`` splits exactly
(``writes.decoded_terms``), so::

    write = sum_f direct[f] + bias + skip + error

``direct[f]`` is the DLA of ``acts_f * m * directions[f]`` (feature ``f``'s write), ``bias`` of
the SAE's offset (``b_dec``), ``skip`` of a skip transcoder's ``x W_skip^T``, ``error`` of
what the SAE misses, and ``write`` the DLA of the hook's whole activation: for an SAE on
``hook_mlp_out`` it is ``LogitAttribution.mlp[layer]``; on a ``hook_resid_*``, the direct
contribution of the whole residual stream there.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.sae import SAE
from interp_transformer.sae.data import sae_input

from .. import _checks
from ..readouts.attribution import POST_NORM_INSTEAD
from .writes import decoded_terms, flat, residual_write

Metric = Callable[[Float[Tensor, "batch pos d_vocab"]], Tensor]


@dataclass
class FeatureAttribution:
    """Feature attributions on one prompt (module docstring); ``[pos, d_sae]`` per position, ``[d_sae]`` at ``pos``."""

    tokens: Int[Tensor, "pos"]
    pos: int
    token: int
    incorrect_token: int | None
    metric: float  # the metric on the prompt
    acts: Float[Tensor, "pos d_sae"]
    act_times_grad: Float[Tensor, "pos d_sae"]
    direct: Float[Tensor, "d_sae"]  # DLA of each feature's write at pos
    bias: float
    skip: float
    error: float
    write: float  # DLA of the hook's whole activation at pos

    def top_features(self, k: int = 10, by: str = "direct") -> list[tuple[int, float]]:
        """The ``k`` features of largest ``|value|``, as ``(feature, value)``, largest first.

        ``by="direct"``: DLA at ``pos``; ``by="act_times_grad"``: summed over positions.
        """
        scores = {"direct": self.direct, "act_times_grad": self.act_times_grad.sum(dim=0)}
        if by not in scores:
            raise ValueError(f"by must be one of {sorted(scores)}, got {by!r}")
        values = scores[by]
        order = values.abs().topk(min(k, len(values))).indices
        return [(int(f), float(values[f])) for f in order]


def _prompt(model, tokens) -> Tensor:
    if isinstance(tokens, str):
        tokens = model.to_tokens(tokens)
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens must be a str or an integer tensor [pos] or [1, pos], got {type(tokens).__name__}")
    tokens = tokens.unsqueeze(0) if tokens.ndim == 1 else tokens
    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(
            f"feature_attribution reads one prompt: tokens [pos] or [1, pos], got shape {tuple(tokens.shape)}"
        )
    return model.prepare_tokens(tokens)


def _run(model, sae: SAE, tokens: Tensor, metric: Metric) -> tuple[dict, Tensor, Tensor]:
    """One forward with the SAE spliced in (error term on): what the hooks saw, the metric, its gradient at the
    features."""
    seen = {}

    def keep(key):
        def hook(activation, hook):
            seen[key] = activation.detach()

        return hook

    def leaf(acts, hook):  # the features as a leaf of the graph: their gradient, and no other
        seen["acts"] = acts.detach().requires_grad_(True)
        return seen["acts"]

    before = [
        (sae.hook_name, keep("in")),
        (sae.hook_name_out or sae.hook_name, keep("out")),
        (model.act_name("scale"), keep("scale")),
    ]
    with torch.enable_grad(), model.hooks(fwd_hooks=before), model.saes([sae], use_error_term=True):
        logits = model.run_with_hooks(tokens, fwd_hooks=[(sae.hook_sae_acts_post.name, leaf)])
        value = metric(logits)
        if not isinstance(value, Tensor) or value.numel() != 1:
            raise ValueError(f"metric must return a scalar tensor, got {getattr(value, 'shape', type(value).__name__)}")
        (grad,) = torch.autograd.grad(value, seen["acts"], allow_unused=True)
    grad = torch.zeros_like(seen["acts"]) if grad is None else grad
    return seen, value.detach(), grad


def feature_attribution(
    model: _checks.AnyModel,
    sae: SAE,
    tokens: str | Int[Tensor, "pos"] | Int[Tensor, "1 pos"],
    token: int,
    incorrect_token: int | None = None,
    pos: int = -1,
    metric: Metric | None = None,
) -> FeatureAttribution:
    """Activation x gradient and exact DLA of ``sae``'s features on one prompt (module docstring).

    ``metric(logits) -> scalar`` replaces the default logit difference for activation x
    gradient; DLA always reads ``logit(token) - logit(incorrect_token)`` at ``pos``.
    """
    _checks.check_model(model)
    _checks.require(model, "linear_logits", "feature_attribution", POST_NORM_INSTEAD)
    write_map = residual_write(model, sae)
    tokens = _prompt(model, tokens)
    pos = int(_checks.positions(pos, 1, tokens.shape[1])[0])
    token_t = _checks.token_ids(model, token, 1, "token")
    incorrect_t = None if incorrect_token is None else _checks.token_ids(model, incorrect_token, 1, "incorrect_token")
    W_U = model.W_U
    direction = W_U[:, token_t[0]] - (W_U[:, incorrect_t[0]] if incorrect_t is not None else 0)
    if metric is None:

        def metric(logits):
            at = logits[0, pos]
            return at[token_t[0]] - (at[incorrect_t[0]] if incorrect_t is not None else 0)

    seen, value, grad = _run(model, sae, tokens, metric)
    with torch.no_grad():
        x_in, x_out = sae_input(sae, seen["in"][0, pos]), sae_input(sae, seen["out"][0, pos])
        terms = decoded_terms(sae, x_in, x_out)
        read = write_map.pull(model.final_norm.pull_back(direction)) / seen["scale"][0, pos, 0]  # [d_out]
        read = read.to(terms.output.dtype)
        direct = terms.acts * terms.multiplier * (terms.directions @ read)
        acts = seen["acts"].detach()[0]
        return FeatureAttribution(
            tokens=tokens[0],
            pos=pos,
            token=int(token_t[0]),
            incorrect_token=None if incorrect_t is None else int(incorrect_t[0]),
            metric=float(value),
            acts=acts,
            act_times_grad=acts * grad[0],
            direct=direct,
            bias=float(terms.offset @ read),
            skip=float(terms.skip @ read),
            error=float(terms.error @ read),
            write=float(flat(sae, x_out).to(read.dtype) @ read),
        )


__all__ = ["FeatureAttribution", "feature_attribution"]

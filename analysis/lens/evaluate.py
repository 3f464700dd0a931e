"""How well a lens reads each layer: KL to the model's final distribution and top-1 agreement, beside the logit lens.

For every held-out token and every block input ``l`` (``blocks.{l}.hook_resid_pre``)::

    KL_l   = mean over tokens of KL(final || lens_l)          (nats; 0: the lens reads the final prediction)
    top1_l = share of tokens where argmax lens_l = argmax final

for the tuned lens and for the logit lens (the same read-out with no translator). Both read the exact logits
(``translators.read_out``, the model's dtype): no cheaper matmul dtype enters an evaluation.
"""

from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..readouts.attribution import logit_lens_hook_names
from .data import LensContexts
from .objective import FinalDistribution
from .translators import TunedLens, read_out

KINDS = ("tuned", "logit")


@dataclass
class LensEvaluation:
    """Per layer (``layers``: the block inputs read), the mean KL (nats) and top-1 agreement of each lens."""

    layers: list[int]
    tuned_kl: list[float]
    logit_kl: list[float]
    tuned_top1: list[float]
    logit_top1: list[float]
    n_tokens: int
    description: str = ""

    def table(self) -> str:
        """A Markdown table, one row per layer."""
        rows = [
            "| layer | tuned lens KL | logit lens KL | tuned lens top-1 | logit lens top-1 |",
            "|---:|---:|---:|---:|---:|",
        ]
        for i, layer in enumerate(self.layers):
            rows.append(
                f"| {layer} | {self.tuned_kl[i]:.3f} | {self.logit_kl[i]:.3f} | {self.tuned_top1[i]:.3f} | "
                f"{self.logit_top1[i]:.3f} |"
            )
        return "\n".join(rows)

    def layers_where_tuned_wins(self) -> list[int]:
        """The layers whose tuned-lens KL is below the logit lens's."""
        return [layer for layer, t, g in zip(self.layers, self.tuned_kl, self.logit_kl) if t < g]

    def figure(self):
        from ..plots.lens import plot_lens_comparison

        return plot_lens_comparison(self)

    def to_dict(self) -> dict:
        return asdict(self)


def residuals_and_final(model, tokens: Tensor, first_position: int) -> tuple[list[Tensor], FinalDistribution]:
    """The residual entering every block, ``[N, d_model]`` each, and the model's final distribution at the same
    ``N`` tokens (positions from ``first_position`` on, contexts flattened)."""
    names = logit_lens_hook_names(model)[:-1]
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=names)
    d_model = model.cfg.d_model
    resid = [cache[name][:, first_position:].reshape(-1, d_model) for name in names]
    return resid, FinalDistribution.from_logits(logits[:, first_position:].reshape(-1, logits.shape[-1]))


def _kl_and_agreement(logits: Tensor, final: FinalDistribution) -> tuple[Tensor, Tensor]:
    log_q = logits.to(final.p.dtype).log_softmax(dim=-1)
    kl = final.p_log_p - (final.p * log_q).sum(-1)
    return kl, (logits.argmax(dim=-1) == final.top1)


@torch.no_grad()
def evaluate_lens(
    model,
    lens: TunedLens,
    contexts: LensContexts,
    *,
    batch_size: int = 8,
    chunk_tokens: int = 512,
    progress: bool = False,
    description: str | None = None,
) -> LensEvaluation:
    """``LensEvaluation`` of ``lens`` and of the logit lens on ``contexts`` (module docstring)."""
    lens.check_model(model)
    n_layers = len(lens)
    sums = {f"{kind}_{what}": torch.zeros(n_layers, dtype=torch.float64) for kind in KINDS for what in ("kl", "top1")}
    n_tokens = 0
    batches = contexts.tokens.split(batch_size)
    for tokens in tqdm(batches, desc="evaluating the lens", unit="batch", disable=not progress, leave=False):
        resid, final = residuals_and_final(model, tokens, contexts.first_position)
        n_tokens += final.top1.shape[0]
        for layer in range(n_layers):
            for start in range(0, final.top1.shape[0], chunk_tokens):
                rows = slice(start, start + chunk_tokens)
                h, target = resid[layer][rows], final[rows]
                for kind, logits in (("tuned", lens.logits(model, h, layer)), ("logit", read_out(model, h))):
                    kl, agree = _kl_and_agreement(logits, target)
                    sums[f"{kind}_kl"][layer] += kl.double().sum()
                    sums[f"{kind}_top1"][layer] += agree.double().sum()
    means = {key: (value / max(n_tokens, 1)).tolist() for key, value in sums.items()}
    return LensEvaluation(
        list(range(n_layers)), n_tokens=n_tokens, description=description or contexts.description, **means
    )


__all__ = ["LensEvaluation", "evaluate_lens", "residuals_and_final"]

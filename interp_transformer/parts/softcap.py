"""Soft-capping (Gemma 2): ``cap * tanh(x / cap)`` squashes attention scores or logits into ``(-cap, cap)``.

Two parts apply it, each hooking the values before and after the cap:

==========================  ===============================================================
``SoftCappedAttention``     ``hook_attn_scores_uncapped``: ``q . k * scale`` (masked keys
                            ``-inf``); ``hook_attn_scores``: ``cap * tanh(uncapped / cap)``
                            (masked keys still ``-inf``), which the softmax reads
``SoftCappedUnembed``       ``hook_logits_uncapped``: ``x W_U + b_U``; the output is
                            ``cap * tanh(uncapped / cap)``
==========================  ===============================================================

The cap is non-linear: a sum of contributions to an uncapped logit is not a sum of
contributions to the capped one. Direct logit attribution therefore attributes the
uncapped logit (``hook_logits_uncapped``) and says so; ``model.logit_softcap``
tells tools the cap is there.

PyTorch's fused attention kernel has no soft-capping, so ``SoftCappedAttention`` always
runs the explicit path (``uses_fused_path()`` is False), as Hugging Face's Gemma 2 runs
eager attention.
"""

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.attention import Attention
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.unembed import Unembed


def check_softcap(value) -> float:
    """``value`` as a float if it is a finite number > 0 (``ValueError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise ValueError(f"a soft-cap must be a finite number > 0, got {value!r}")
    return float(value)


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """``cap * tanh(x / cap)`` elementwise; ``-inf`` (a masked score) stays ``-inf``.

    Computed in place on one fresh tensor (``x`` is left as it is): the scores are the
    largest tensors of a forward, and each extra pass over them shows. Where a gradient will
    flow back through it, ``tanh`` keeps its output for the backward pass (not in place).
    """
    if torch.is_grad_enabled() and x.requires_grad:
        capped = torch.tanh(x / cap) * cap
    else:
        capped = torch.div(x, cap).tanh_().mul_(cap)
    return capped.masked_fill_(x.isneginf(), float("-inf"))


class SoftCappedAttention(Attention):
    """``Attention`` whose scores are soft-capped before the softmax: ``pattern = softmax(cap * tanh(scores / cap))``.

    Takes every argument ``Attention`` takes, plus ``softcap``. The hooks are Attention's,
    with ``hook_attn_scores_uncapped`` firing just before ``hook_attn_scores``.
    """

    def __init__(self, cfg, masks: Sequence[nn.Module] | None = None, *, softcap: float, **parts):
        super().__init__(cfg, masks, **parts)
        self.softcap = check_softcap(softcap)
        self.hook_attn_scores_uncapped = HookPoint()
        for name in ("hook_attn_scores", "hook_pattern", "hook_z"):  # registered in the order they fire
            self._modules[name] = self._modules.pop(name)

    def uses_fused_path(self) -> bool:
        """Always False: the fused kernel cannot soft-cap the scores."""
        return False

    def _attn_scores(self, q: Tensor, k: Tensor, layout: TokenLayout) -> Tensor:
        """``cap * tanh(uncapped / cap)`` of Attention's scores, ``hook_attn_scores_uncapped`` holding them before."""
        return soft_cap(self.hook_attn_scores_uncapped(super()._attn_scores(q, k, layout)), self.softcap)

    def extra_repr(self) -> str:
        return f"softcap={self.softcap}"


class SoftCappedUnembed(Unembed):
    """``logits = cap * tanh((x W_U + b_U) / cap)``; ``hook_logits_uncapped`` holds ``x W_U + b_U``."""

    def __init__(self, cfg, softcap: float):
        super().__init__(cfg)
        self.softcap = check_softcap(softcap)
        self.hook_logits_uncapped = HookPoint()

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return soft_cap(self.hook_logits_uncapped(super().forward(normalized)), self.softcap)

    def extra_repr(self) -> str:
        return f"softcap={self.softcap}"


__all__ = ["SoftCappedAttention", "SoftCappedUnembed", "check_softcap", "soft_cap"]

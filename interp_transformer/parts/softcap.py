"""Soft-capping (Gemma 2): ``cap * tanh(x / cap)`` squashes attention scores or logits into ``(-cap, cap)``.

Two parts take it as an option, each hooking the values before and after the cap:

================================  ===============================================================
``Attention(softcap=cap)``        ``hook_attn_scores_uncapped``: ``q . k * scale`` (+ a score
                                  bias; masked keys ``-inf``); ``hook_attn_scores``:
                                  ``cap * tanh(uncapped / cap)`` (masked keys still ``-inf``),
                                  which the softmax reads
``Unembed(cfg, softcap=cap)``     ``hook_logits_uncapped``: ``x W_U + b_U``; the output is
                                  ``cap * tanh(uncapped / cap)``
================================  ===============================================================

The cap is non-linear: a sum of contributions to an uncapped logit is not a sum of
contributions to the capped one. Direct logit attribution therefore attributes the
uncapped logit (``hook_logits_uncapped``) and says so; ``model.read_out.softcap``
tells tools the cap is there.

PyTorch's fused attention kernel has no soft-capping, so a capped ``Attention`` always
runs the explicit path (``uses_fused_path()`` is False), as Hugging Face's Gemma 2 runs
eager attention.
"""

import math

import torch
from torch import Tensor


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


__all__ = ["check_softcap", "soft_cap"]

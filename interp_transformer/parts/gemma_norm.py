"""Gemma's RMSNorm: the gain is ``1 + w_offset``, the offset stored as the checkpoint stores it (zero at init).

``normalized = x / scale * w`` with ``w = 1 + w_offset`` and ``scale = sqrt(mean(x^2) + eps)`` over the last axis (Gemma
1, 2 and 3, including Gemma 3's per-head q/k norms). It is a norm part of its
own, not an ``RMSNorm`` whose ``w`` was shifted at load time, so that its algebra is
stated once, here, and every tool reading through it (weight processing, direct logit
attribution, the cache's frozen-scale tools) gets the ``1 +`` right:

=============================  =============================================================
``w``                          ``1 + w_offset``, the gain (read-only, as ``RMSNorm.w`` reads)
``apply_frozen(x, scale)``     ``x / scale * w``
``normalize(x)``               the whole norm of ``x``, its scale from ``x``; no hook fires
``pull_back(d, scale)``        ``w * d / scale``
``bias_term(d)``               0: there is no bias
``fold_into(W, b_next, ...)``  ``W <- diag(w) W``; ``reset()`` then sets ``w_offset = 0`` (gain 1)
``removes_mean``               False, as for ``RMSNorm``: centring is refused
=============================  =============================================================

The parameter is ``w_offset`` (Hugging Face's ``weight``), not ``w``: TransformerLens stores
the gain ``1 + weight`` under ``w``, and a parameter of that name holding the offset would
let a TransformerLens Gemma state dict load without an error and compute the wrong thing.
Storing the offset, not the gain, also keeps it exact in half precision, where ``1 + w_offset``
rounded to bfloat16 would lose most of ``w_offset``'s bits.

Precision. Hugging Face computes Gemma's norms in float32 whatever the model's dtype and
rounds only the product ``x_hat * (1 + w)`` to it (the difference from Llama's norm it
calls out); this part does the same, and in float64 it stays in float64.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.rms_norm import RMSAlgebra


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype Gemma's norms compute in: float32 for half-precision inputs, the input's own dtype otherwise."""
    return torch.promote_types(dtype, torch.float32)


class GemmaRMSNorm(RMSAlgebra, nn.Module):
    """``normalized = x / sqrt(mean(x^2) + eps) * (1 + w_offset)`` over the last axis (see the module docstring).

    ``hook_scale`` is ``sqrt(mean(x^2) + eps)`` (``[batch, pos, 1]``, or ``[batch, pos,
    head_index, 1]`` over each head's ``d_head``); ``hook_normalized`` is the output, after
    the gain. The explicit formula is the reference and the only path producing the scale;
    while nothing observes ``hook_scale``, PyTorch's fused ``rms_norm`` computes the same
    formula. ``uses_fused_path()`` decides. ``hook_scale`` is in the dtype the norm computes
    in: the model's, or float32 for a half-precision model.
    """

    axis_sizes = {"d_model": "w_offset[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w_offset = nn.Parameter(torch.zeros(d_model))  # the gain is 1 + w_offset
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.use_fused_rms_norm = True  # set False to always run the explicit path

    @property
    def w(self) -> Float[Tensor, "d_model"]:
        """The gain ``1 + w_offset``: what the normalized input is multiplied by."""
        return 1 + self.w_offset

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        wide = x.to(compute_dtype(x.dtype))
        gain = 1 + self.w_offset.to(wide.dtype)
        if self.uses_fused_path():
            return self.hook_normalized(F.rms_norm(wide, gain.shape, gain, self.eps).to(x.dtype))
        scale = self.hook_scale((wide.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized((wide / scale * gain).to(x.dtype))

    # --- the algebra (see the module docstring; the rest is RMSAlgebra's) ------------------
    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole norm of ``x``, its scale computed from ``x`` itself; no hook fires."""
        wide = x.to(compute_dtype(x.dtype))
        gain = 1 + self.w_offset.to(wide.dtype)
        return F.rms_norm(wide, gain.shape, gain, self.eps).to(x.dtype)

    @torch.no_grad()
    def reset(self) -> None:
        """``w_offset = 0`` (gain 1): what the norm holds once folded into its readers."""
        self.w_offset.zero_()

    def extra_repr(self) -> str:
        return f"d_model={self.w_offset.shape[0]}, eps={self.eps}, gain=1+w_offset"


__all__ = ["GemmaRMSNorm", "compute_dtype"]

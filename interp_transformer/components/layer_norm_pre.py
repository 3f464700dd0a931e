"""``LayerNormPre``: LayerNorm without weight or bias, ``normalized = (x - mean(x)) / scale``.

What a LayerNorm becomes once its ``w`` and ``b`` are folded into the weights that read
it (TransformerLens' ``normalization_type="LNPre"``): centring and scaling, nothing to
learn. It follows the norm protocol of ``layer_norm.py`` (``apply_frozen``, ``normalize``,
``pull_back``, ``bias_term``, ``fold_into``, ``reset``, ``removes_mean``) and hooks
``hook_scale`` ``[batch, pos, 1]`` and ``hook_normalized``, like ``LayerNorm``.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from ..shape_checks import shape_checked


class LayerNormPre(nn.Module):
    """``normalized = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` over ``d_model``; no parameters.

    The explicit formula is the reference and the only path that produces ``hook_scale``;
    PyTorch's fused ``layer_norm`` (without affine parameters) runs while nothing observes the scale.
    """

    removes_mean = True

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.d_model = d_model
        self.eps = eps
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.use_fused_layer_norm = True  # set False to always run the explicit path

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scale."""
        return self.use_fused_layer_norm and not self.hook_scale.has_hooks()

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.uses_fused_path():
            return self.hook_normalized(F.layer_norm(x, (self.d_model,), None, None, self.eps))
        x = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale)

    # --- the norm algebra (see layer_norm.py) --------------------------------------------------
    def apply_frozen(self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]) -> Float[Tensor, "... d_model"]:
        """``(x - mean(x)) / scale``."""
        return (x - x.mean(dim=-1, keepdim=True)) / scale

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole normalization of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return F.layer_norm(x, (self.d_model,), None, None, self.eps)

    def pull_back(self, direction: Float[Tensor, "... d_model"], scale: Optional[Tensor] = None) -> Float[Tensor, "... d_model"]:
        """``g = (d - mean(d)) / scale``, so that ``apply_frozen(x, scale) . d = x . g``."""
        pulled = direction - direction.mean(dim=-1, keepdim=True)
        return pulled if scale is None else pulled / scale

    def bias_term(self, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """0: there is no bias."""
        return direction.new_zeros(direction.shape[:-1])

    @torch.no_grad()
    def fold_into(self, W: Tensor, b_next: Tensor, center: bool = True) -> None:
        """Nothing to fold; with ``center`` the reading weights lose their mean over ``d_model`` (which changes nothing)."""
        if center:
            W.sub_(W.mean(dim=-2, keepdim=True))

    def reset(self) -> None:
        """Nothing to reset: there are no parameters."""

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps}"

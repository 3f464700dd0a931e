"""Weightless norms: what a LayerNorm or an RMSNorm becomes once its weights are folded into its readers.

=================  ===========================================  ==========================================
part               ``normalized``                               TransformerLens' ``normalization_type``
=================  ===========================================  ==========================================
``LayerNormPre``   ``(x - mean(x)) / sqrt(var(x) + eps)``       ``"LNPre"``
``RMSNormPre``     ``x / sqrt(mean(x^2) + eps)``                ``"RMSPre"``
=================  ===========================================  ==========================================

Both follow the norm protocol of ``layer_norm.py`` (``apply_frozen``, ``normalize``,
``pull_back``, ``bias_term``, ``fold_into``, ``reset``, ``removes_mean``) with nothing to
learn, and hook ``hook_scale`` (``[batch, pos, 1]``) and ``hook_normalized``. The explicit
formula is the reference and the only path that produces the scale; PyTorch's fused
kernel (without weights) runs while nothing observes the scale, switched off as for
their weighted parents (``use_fused_layer_norm``, ``use_fused_rms_norm``).
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint


class _WeightlessNorm(nn.Module):
    """``normalized = centre(x) / scale``; subclasses say how they centre and which fused kernel computes it."""

    removes_mean: bool
    fused_switch: str  # the attribute that allows the fused kernel

    if TYPE_CHECKING:  # each subclass defines it

        def normalize(self, x: Tensor) -> Tensor: ...

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.d_model = d_model
        self.eps = eps
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        setattr(self, self.fused_switch, True)

    def _centre(self, x: Tensor) -> Tensor:
        return x - x.mean(dim=-1, keepdim=True) if self.removes_mean else x

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scale."""
        return getattr(self, self.fused_switch) and not self.hook_scale.has_hooks()

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        if self.uses_fused_path():
            return self.hook_normalized(self.normalize(x))
        x = self._centre(x)
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale)

    # --- the norm algebra (see layer_norm.py) --------------------------------------------------
    def apply_frozen(
        self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]
    ) -> Float[Tensor, "... d_model"]:
        """``centre(x) / scale``."""
        return self._centre(x) / scale

    def pull_back(
        self, direction: Float[Tensor, "... d_model"], scale: Tensor | None = None
    ) -> Float[Tensor, "... d_model"]:
        """``g = centre(d) / scale``, so that ``apply_frozen(x, scale) . d = x . g``."""
        pulled = self._centre(direction)
        return pulled if scale is None else pulled / scale

    def bias_term(self, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """0: there is no bias."""
        return direction.new_zeros(direction.shape[:-1])

    @torch.no_grad()
    def fold_into(self, W: Tensor, b_next: Tensor | None, center: bool = False) -> None:
        """Nothing to fold; with ``center`` (only where the norm removes the mean) the reading weights lose their
        mean."""
        if center and not self.removes_mean:
            raise ValueError(
                f"{type(self).__name__} cannot fold with center=True: it does not subtract the mean of its input"
            )
        if center:
            W.sub_(W.mean(dim=-2, keepdim=True))

    def reset(self) -> None:
        """Nothing to reset: there are no parameters."""

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps}"


class LayerNormPre(_WeightlessNorm):
    """``normalized = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)``: a LayerNorm without ``w`` and ``b``."""

    removes_mean = True
    fused_switch = "use_fused_layer_norm"

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole normalization of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return F.layer_norm(x, (self.d_model,), None, None, self.eps)


class RMSNormPre(_WeightlessNorm):
    """``normalized = x / sqrt(mean(x^2) + eps)``: an RMSNorm without ``w``; the mean of ``x`` stays."""

    removes_mean = False
    fused_switch = "use_fused_rms_norm"

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole normalization of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return F.rms_norm(x, (self.d_model,), None, self.eps)


__all__ = ["LayerNormPre", "RMSNormPre"]

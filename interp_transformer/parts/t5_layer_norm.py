"""T5's norm: RMSNorm whose mean square is accumulated in float32, whatever the activations' dtype.

``normalized = x * rsqrt(mean(x^2) + eps) * w``, with ``mean(x^2)`` and the reciprocal square
root taken in float32, as Mesh TensorFlow trained T5 and as Hugging Face's ``T5LayerNorm``
runs it. In a float32 model this is ``RMSNorm``; in a float64 copy the scale keeps float32
precision, so that the copy matches Hugging Face's float64 run to float64 rounding (an
exact float64 scale would differ from it by ~1e-7). ``hook_scale`` is ``1 / rsqrt(...)`` =
``sqrt(mean(x^2) + eps)`` in the activations' dtype; the algebra (``apply_frozen``,
``pull_back``, ``fold_into``, ...) is ``RMSNorm``'s.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts.rms_norm import RMSNorm


class T5LayerNorm(RMSNorm):
    """``x * rsqrt(mean(x^2) + eps) * w``, the mean square in float32 (see the module docstring)."""

    def uses_fused_path(self) -> bool:
        """The fused kernel accumulates in the input's dtype: it may run for float32 only, with the scale unobserved."""
        return super().uses_fused_path() and self.w.dtype == torch.float32

    def _inverse_scale(self, x: Tensor) -> Tensor:
        return torch.rsqrt(x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True) + self.eps)

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.uses_fused_path():
            return self.hook_normalized(F.rms_norm(x, self.w.shape, self.w, self.eps))
        scale = self.hook_scale(1.0 / self._inverse_scale(x).to(x.dtype))
        return self.hook_normalized(x / scale * self.w)

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole norm of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return x * self._inverse_scale(x).to(x.dtype) * self.w


__all__ = ["T5LayerNorm"]

"""``RMSNormPre``: RMSNorm without weight, ``normalized = x / sqrt(mean(x^2) + eps)``.

What an RMSNorm becomes once its ``w`` is folded into the weights that read it
(TransformerLens' ``normalization_type="RMSPre"``). It follows the norm protocol of
``layer_norm.py`` and hooks ``hook_scale`` ``[batch, pos, 1]`` and ``hook_normalized``.
Like ``RMSNorm`` it keeps the mean of its input (``removes_mean = False``).
"""

from typing import Optional

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from ..shape_checks import shape_checked


class RMSNormPre(nn.Module):
    """``normalized = x / sqrt(mean(x^2) + eps)`` over the last axis; no parameters.

    The explicit formula is the reference and the only path that produces ``hook_scale``;
    PyTorch's fused ``rms_norm`` (without weight) runs while nothing observes the scale.
    """

    removes_mean = False

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.d_model = d_model
        self.eps = eps
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.use_fused_rms_norm = True  # set False to always run the explicit path

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scale."""
        return self.use_fused_rms_norm and not self.hook_scale.has_hooks()

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        if self.uses_fused_path():
            return self.hook_normalized(F.rms_norm(x, (self.d_model,), None, self.eps))
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale)

    # --- the norm algebra (see layer_norm.py) --------------------------------------------------
    def apply_frozen(self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]) -> Float[Tensor, "... d_model"]:
        """``x / scale``."""
        return x / scale

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole normalization of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return F.rms_norm(x, (self.d_model,), None, self.eps)

    def pull_back(self, direction: Float[Tensor, "... d_model"], scale: Optional[Tensor] = None) -> Float[Tensor, "... d_model"]:
        """``g = d / scale``, so that ``apply_frozen(x, scale) . d = x . g``."""
        return direction if scale is None else direction / scale

    def bias_term(self, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """0: there is no bias."""
        return direction.new_zeros(direction.shape[:-1])

    def fold_into(self, W: Tensor, b_next: Optional[Tensor], center: bool = False) -> None:
        """Nothing to fold; ``center`` is refused (the mean of the input reaches the output)."""
        if center:
            raise ValueError("RMSNormPre cannot fold with center=True: it does not subtract the mean of its input")

    def reset(self) -> None:
        """Nothing to reset: there are no parameters."""

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps}"

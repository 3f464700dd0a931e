"""An RMSNorm over every head of the queries (or keys) at once: OLMo 2's and OLMo 3's q/k norms.

Qwen3 and Gemma 3 normalize each head's q and k over its own ``d_head`` (an ``RMSNorm`` of
width ``d_head``, one scale per head). OLMo 2 normalizes the whole projection, all heads
together, before it is split into heads::

    flat       = q arranged as [batch, pos, (head_index d_head)]
    scale      = sqrt(mean(flat^2) + eps)                      one per position, over every head
    normalized = flat / scale * w                              w: [(head_index d_head)]

so one head's normalized query depends on every head's projection through the shared scale.
``Attention`` takes it as ``q_norm``/``k_norm`` (the keys' has ``n_key_value_heads`` heads) and
applies it after ``hook_q``/``hook_k`` and before the rotation, as it does the per-head norms.

Hooks: ``hook_scale`` ``[batch, pos, 1]`` (``sqrt(mean(flat^2) + eps)``, one per position) and
``hook_normalized`` ``[batch, pos, head_index, d_head]`` (the output, after ``w``, split into
heads again). ``w`` is stored as Hugging Face stores it, ``[(head_index d_head)]``.

Its algebra reads the flat ``[..., (head_index d_head)]`` vectors, as an ``RMSNorm`` of that
width: ``apply_frozen(x, scale) = x / scale * w``, ``pull_back(d, scale) = w * d / scale``, no
bias. There is nothing to fold it into: it reads a projection, not the residual stream.
"""

from typing import Optional

import einops
import torch.nn.functional as F
import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from ..models.shape_checks import shape_checked

FLATTEN = "batch pos head_index d_head -> batch pos (head_index d_head)"
SPLIT = "batch pos (head_index d_head) -> batch pos head_index d_head"


class AllHeadsRMSNorm(nn.Module):
    """RMSNorm over ``(head_index d_head)`` together: ``normalized = flat / sqrt(mean(flat^2) + eps) * w``.

    The explicit formula is the reference and the only path that produces ``hook_scale``;
    while nothing hooks or caches the scale, PyTorch's fused ``rms_norm`` (the same formula)
    runs instead (``uses_fused_path()``).
    """

    removes_mean = False

    def __init__(self, n_heads: int, d_head: int, eps: float):
        super().__init__()
        self.n_heads, self.d_head, self.eps = n_heads, d_head, eps
        self.w = nn.Parameter(torch.ones(n_heads * d_head))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.use_fused_rms_norm = True  # set False to always run the explicit path

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scale."""
        return self.use_fused_rms_norm and not self.hook_scale.has_hooks()

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos head_index d_head"]) -> Float[Tensor, "batch pos head_index d_head"]:
        if x.shape[-2:] != (self.n_heads, self.d_head):
            raise ValueError(
                f"AllHeadsRMSNorm normalizes {self.n_heads} heads of {self.d_head}, got heads of shape "
                f"{tuple(x.shape[-2:])}"
            )
        flat = einops.rearrange(x, FLATTEN)
        if self.uses_fused_path():
            normalized = self.normalize(flat)
        else:
            scale = self.hook_scale((flat.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
            normalized = flat / scale * self.w
        return self.hook_normalized(einops.rearrange(normalized, SPLIT, head_index=self.n_heads))

    # --- the algebra, over flat [..., (head_index d_head)] vectors (see the module docstring) ---
    def apply_frozen(self, x: Float[Tensor, "... width"], scale: Float[Tensor, "... 1"]) -> Float[Tensor, "... width"]:
        """``x / scale * w``: the norm with ``scale`` frozen."""
        return x / scale * self.w

    def normalize(self, x: Float[Tensor, "... width"]) -> Float[Tensor, "... width"]:
        """The whole norm of flat ``x``, its scale computed from ``x`` itself; no hook fires."""
        return F.rms_norm(x, self.w.shape, self.w, self.eps)

    def pull_back(self, direction: Float[Tensor, "... width"], scale: Optional[Tensor] = None) -> Tensor:
        """``w * d / scale``, so that ``apply_frozen(x, scale) . d = x . pull_back(d, scale)``."""
        weighted = direction * self.w
        return weighted if scale is None else weighted / scale

    def bias_term(self, direction: Float[Tensor, "... width"]) -> Float[Tensor, "..."]:
        """0 for every direction: there is no bias."""
        return direction.new_zeros(direction.shape[:-1])

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_head={self.d_head}, eps={self.eps}"


__all__ = ["AllHeadsRMSNorm"]

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

It is an ``RMSNorm`` of that width over the flat ``[..., (head_index d_head)]`` vectors, so its
algebra (``apply_frozen``, ``pull_back``, ``normalize``) is that norm's. It reads a projection,
not the residual stream, so no block lists it among its norm readers and nothing folds it.
"""

import einops
from jaxtyping import Float
from torch import Tensor

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts.rms_norm import RMSNorm

FLATTEN = "batch pos head_index d_head -> batch pos (head_index d_head)"
SPLIT = "batch pos (head_index d_head) -> batch pos head_index d_head"


class AllHeadsRMSNorm(RMSNorm):
    """RMSNorm over ``(head_index d_head)`` together: ``normalized = flat / sqrt(mean(flat^2) + eps) * w``.

    An ``RMSNorm`` of width ``n_heads * d_head`` (its algebra, hooks and fused path are that norm's) whose forward
    reads heads, normalizes them flattened and splits the result into heads again.
    """

    # where the entry check finds this part's sizes (core.shape_checks)
    axis_sizes = {"head_index": "n_heads", "d_head": "d_head"}

    def __init__(self, n_heads: int, d_head: int, eps: float):
        super().__init__(n_heads * d_head, eps)
        self.n_heads, self.d_head = n_heads, d_head

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
            normalized = self.apply_frozen(
                flat, self.hook_scale((flat.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
            )
        return self.hook_normalized(einops.rearrange(normalized, SPLIT, head_index=self.n_heads))

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_head={self.d_head}, eps={self.eps}"


__all__ = ["AllHeadsRMSNorm"]

"""``x W + b`` as one matrix product: the bias is added inside the product.

``einops.einsum(x, W, "... d_in, d_in d_out -> ... d_out") + b`` is the formula;
``torch.addmm`` computes the same thing with the bias written into the output
buffer before the product accumulates onto it, which saves one pass over the
output (a few percent of a GPT-2 forward on a CPU). Components call ``affine``
with weights already laid out as ``[d_in, d_out]`` by an ``einops.rearrange``
whose string says how the heads sit side by side.
"""

import torch
from torch import Tensor


def affine(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """``x W + b`` over the last axis of ``x``: ``[..., d_in] x [d_in, d_out] + [d_out] -> [..., d_out]``."""
    if x.shape[-1] != W.shape[0] or b.shape != W.shape[1:]:
        raise ValueError(
            f"affine needs x [..., d_in], W [d_in, d_out], b [d_out]; got x {tuple(x.shape)}, "
            f"W {tuple(W.shape)}, b {tuple(b.shape)}"
        )
    flat = torch.addmm(b, x.reshape(-1, x.shape[-1]), W)
    return flat.view(*x.shape[:-1], W.shape[1])

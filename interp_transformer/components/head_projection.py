"""Where ``W_Q``/``W_K``/``W_V`` lie in memory, and the product that reads them there.

``q[batch, pos, h] = x[batch, pos] W[h] + b[h]`` for every head ``h`` can be computed two ways
without copying ``W`` (``[head_index, d_model, d_head]``):

- **batched over heads** (``baddbmm``): reads each head's ``[d_model, d_head]`` block where it
  lies, so ``W`` is stored head by head (contiguous). PyTorch splits the batch of heads among
  its threads.
- **one product** (``addmm``) with the heads side by side, ``[d_model, head_index * d_head]``:
  needs ``W`` stored as that matrix, ``W`` being its ``[head_index, d_model, d_head]`` view.

Measured on 2 threads (``d_head`` 64, 128 positions): with 9 heads the batched product splits
5/4 and takes 1.12x the single product, with 3 heads (2/1) 1.35x; with 12 heads (6/6) both
take the same time, and for one position the batched product is 1.6x faster. So a weight is
stored side by side exactly when its heads do not divide evenly among the threads
(``heads_side_by_side``), decided when the weight is made or loaded; ``project_heads`` then
follows the layout it is given, and either layout gives the same values.
"""

import einops
import torch
from torch import Tensor


def heads_side_by_side(n_heads: int) -> bool:
    """Whether a projection with ``n_heads`` heads is stored side by side: they do not divide evenly among the
    threads."""
    return n_heads % torch.get_num_threads() != 0


def side_by_side_matrix(W: Tensor):
    """``W [head_index, d_model, d_head]`` as the matrix ``[d_model, head_index * d_head]`` it is a view of, or None."""
    n_heads, d_model, d_head = W.shape
    if W.stride(2) != 1 or (n_heads > 1 and W.stride(0) != d_head):
        return None
    return einops.rearrange(W, "head_index d_model d_head -> d_model (head_index d_head)")  # a view, by the strides


def new_head_weight(n_heads: int, d_model: int, d_head: int) -> Tensor:
    """Uninitialised ``[n_heads, d_model, d_head]`` memory in the layout ``heads_side_by_side`` picks."""
    if heads_side_by_side(n_heads):
        return einops.rearrange(
            torch.empty(d_model, n_heads, d_head), "d_model head_index d_head -> head_index d_model d_head"
        )
    return torch.empty(n_heads, d_model, d_head)


def placed_copy(W: Tensor) -> Tensor:
    """A copy of ``W [head_index, d_model, d_head]`` in its own memory, laid out as ``new_head_weight`` lays it."""
    if not heads_side_by_side(W.shape[0]):
        return W.clone(memory_format=torch.contiguous_format)
    side_by_side = einops.rearrange(W, "head_index d_model d_head -> d_model head_index d_head").clone(
        memory_format=torch.contiguous_format
    )
    return einops.rearrange(side_by_side, "d_model head_index d_head -> head_index d_model d_head")


def placed(W: Tensor) -> Tensor:
    """``W`` itself when it already lies as ``new_head_weight`` lays it, else ``placed_copy(W)``."""
    lies_placed = side_by_side_matrix(W) is not None if heads_side_by_side(W.shape[0]) else W.is_contiguous()
    return W if lies_placed else placed_copy(W)


def project_heads(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """``x W[h] + b[h]`` for every head ``h``: ``[batch, pos, d_model] -> [batch, pos, head_index, d_head]``.

    Same as ``einsum(x, W, "batch pos d_model, head_index d_model d_head -> batch pos head_index d_head") + b``,
    as one product when ``W``'s heads lie side by side, else batched over heads; ``W`` is never copied.
    """
    n_heads, d_model, d_head = W.shape
    matrix = side_by_side_matrix(W)
    if matrix is not None:
        flat = torch.addmm(b.reshape(n_heads * d_head), x.reshape(-1, d_model), matrix)
        return flat.view(*x.shape[:-1], n_heads, d_head)
    x_per_head = einops.repeat(x, "batch pos d_model -> head_index (batch pos) d_model", head_index=n_heads)
    b_per_head = einops.rearrange(b, "head_index d_head -> head_index 1 d_head")
    projected = torch.baddbmm(b_per_head, x_per_head, W)
    return einops.rearrange(projected, "head_index (batch pos) d_head -> batch pos head_index d_head", batch=x.shape[0])

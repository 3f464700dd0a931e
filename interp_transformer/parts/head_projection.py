"""Where ``W_Q``/``W_K``/``W_V`` lie in memory, and the product that reads them there.

``q[batch, pos, h] = x[batch, pos] W[h] + b[h]`` for every head ``h`` can be computed two ways
without copying ``W`` (``[head_index, d_model, d_head]``):

- **batched over heads** (``baddbmm``): reads each head's ``[d_model, d_head]`` block where it
  lies, so ``W`` is stored head by head (contiguous): layout ``"per_head"``. PyTorch splits the
  batch of heads among its threads.
- **one product** (``addmm``) with the heads side by side, ``[d_model, head_index * d_head]``:
  needs ``W`` stored as that matrix, ``W`` being its ``[head_index, d_model, d_head]`` view:
  layout ``"side_by_side"``.

The layout is an explicit option, ``head_layout``, with the same default on every machine:
``DEFAULT_HEAD_LAYOUT``, ``"side_by_side"``, so that the parameters and their strides never
depend on the thread count. Measured on 2 threads (``d_head`` 64, 1 and 128 positions): with 9 or
3 heads, which do not divide among the threads, the batched product takes 1.1x to 1.4x the single
product; with 12 heads (6/6) the two are within 3%, and GPT-2 small's forward at 1x128 is the same
within the noise. ``"auto"``, only when asked for, picks per weight by the thread count at the
time the weight is made, loaded or re-laid (``heads_side_by_side``): side by side exactly when the
heads do not divide evenly among ``torch.get_num_threads()`` threads. ``Attention(...,
head_layout=...)`` sets it for one part, ``set_head_layout(model, layout)`` re-lays a built or
loaded model. ``project_heads`` follows the layout it is given: a layout changes strides, never
values.
"""

from typing import Any

import einops
import torch
from torch import Tensor, nn

HEAD_LAYOUTS = ("side_by_side", "per_head", "auto")
DEFAULT_HEAD_LAYOUT = "side_by_side"  # the same parameters and strides on every machine
HEAD_WEIGHTS = ("W_Q", "W_K", "W_V", "_W_K", "_W_V")  # the parameters laid out by head_layout (_W_K: grouped keys)


def checked_head_layout(layout: str) -> str:
    """``layout`` itself when it is one of ``HEAD_LAYOUTS``; ``ValueError`` naming them otherwise."""
    if not isinstance(layout, str) or layout not in HEAD_LAYOUTS:
        raise ValueError(f"head_layout must be one of {', '.join(map(repr, HEAD_LAYOUTS))}; got {layout!r}")
    return layout


def heads_side_by_side(n_heads: int, layout: str = DEFAULT_HEAD_LAYOUT) -> bool:
    """Whether a projection with ``n_heads`` heads is stored side by side in ``layout``; ``"auto"``: when they do
    not divide evenly among the threads (``torch.get_num_threads()``, read now)."""
    if checked_head_layout(layout) == "auto":
        return n_heads % torch.get_num_threads() != 0
    return layout == "side_by_side"


def side_by_side_matrix(W: Tensor):
    """``W [head_index, d_model, d_head]`` as the matrix ``[d_model, head_index * d_head]`` it is a view of, or None."""
    n_heads, d_model, d_head = W.shape
    if W.stride(2) != 1 or (n_heads > 1 and W.stride(0) != d_head):
        return None
    return einops.rearrange(W, "head_index d_model d_head -> d_model (head_index d_head)")  # a view, by the strides


def new_head_weight(n_heads: int, d_model: int, d_head: int, layout: str = DEFAULT_HEAD_LAYOUT) -> Tensor:
    """Uninitialised ``[n_heads, d_model, d_head]`` memory laid out as ``layout`` says (``heads_side_by_side``)."""
    if heads_side_by_side(n_heads, layout):
        return einops.rearrange(
            torch.empty(d_model, n_heads, d_head), "d_model head_index d_head -> head_index d_model d_head"
        )
    return torch.empty(n_heads, d_model, d_head)


def placed_copy(W: Tensor, layout: str = DEFAULT_HEAD_LAYOUT) -> Tensor:
    """A copy of ``W [head_index, d_model, d_head]`` in its own memory, laid out as ``new_head_weight`` lays it."""
    if not heads_side_by_side(W.shape[0], layout):
        return W.clone(memory_format=torch.contiguous_format)
    side_by_side = einops.rearrange(W, "head_index d_model d_head -> d_model head_index d_head").clone(
        memory_format=torch.contiguous_format
    )
    return einops.rearrange(side_by_side, "d_model head_index d_head -> head_index d_model d_head")


def placed(W: Tensor, layout: str = DEFAULT_HEAD_LAYOUT) -> Tensor:
    """``W`` itself when it already lies as ``new_head_weight`` lays it, else ``placed_copy(W, layout)``."""
    side_by_side = heads_side_by_side(W.shape[0], layout)
    lies_placed = side_by_side_matrix(W) is not None if side_by_side else W.is_contiguous()
    return W if lies_placed else placed_copy(W, layout)


@torch.no_grad()
def place_assigned(state_dict: dict, prefix: str, parameters: dict, layout: str) -> None:
    """The input weights of ``state_dict`` (loaded with ``assign=True``) laid out as ``layout`` says, copied only where
    they are not: what ``Attention._load_from_state_dict`` does before loading."""
    for name in HEAD_WEIGHTS:
        given = state_dict.get(prefix + name)
        if name in parameters and given is not None and given.shape == parameters[name].shape:
            state_dict[prefix + name] = placed(given, layout)


def set_head_layout(module: nn.Module, layout: str) -> nn.Module:
    """Lay out ``W_Q``/``W_K``/``W_V`` of every attention part in ``module`` (a model, a block or one part) as
    ``layout`` says, and make it the layout those parts give weights loaded later with ``assign=True``.

    The parameters stay the same objects with the same values (only their memory is re-laid, copied
    where it lies otherwise); ``"auto"`` reads the thread count now. Returns ``module``.
    """
    checked_head_layout(layout)
    part: Any  # any module: the ones that declare head_layout get it
    for part in module.modules():
        if not hasattr(part, "head_layout"):  # Attention and its subclasses declare it
            continue
        part.head_layout = layout
        for name in HEAD_WEIGHTS:
            parameter = part._parameters.get(name)
            if parameter is not None:
                parameter.data = placed(parameter.data, layout)
    return module


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

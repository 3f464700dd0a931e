"""``Slice``: one way to say which positions (or batch rows, or neurons) to keep, as TransformerLens spells it.

``Slice(x).apply(tensor, dim)`` selects along one axis:

=========================  =====================  ===============================
``x``                      mode                   result along ``dim``
=========================  =====================  ===============================
``None``                   ``"identity"``         unchanged
``i`` (an int)             ``"int"``              ``tensor[i]``: the axis is removed
``(stop,)``, ``(a, b)``,   ``"slice"``            ``tensor[slice(*x)]``
``(a, b, step)``, a slice
a list, 1-d tensor or      ``"array"``            ``tensor[x]``: the axis keeps one
numpy array of indices                            entry per index
=========================  =====================  ===============================

A 0-d tensor or array counts as an array of one index, which numpy indexing turns into
a removed axis, as TransformerLens does. The cache's ``pos_slice``, ``batch_slice`` and
``neuron_slice`` arguments take a ``Slice`` or anything ``Slice`` accepts.

>>> import torch
>>> x = torch.arange(12).reshape(3, 4)
>>> Slice(-1).apply(x, dim=1).tolist()
[3, 7, 11]
>>> Slice((1, 3)).apply(x, dim=1).shape
torch.Size([3, 2])
>>> Slice([0, 2]).apply(x).tolist()
[[0, 1, 2, 3], [8, 9, 10, 11]]
"""

from typing import Any, TypeGuard, Union

import numpy as np
import torch

SliceInput = (
    int | tuple[int] | tuple[int, int] | tuple[int, int, int] | list[int] | slice | torch.Tensor | np.ndarray | None
)


class Slice:
    """A selection along one axis (see the module docstring for the modes)."""

    def __init__(self, input_slice: Union["Slice", SliceInput] = None):
        self.slice: int | slice | np.ndarray
        self.mode: str
        if isinstance(input_slice, Slice):
            self.slice, self.mode = input_slice.slice, input_slice.mode
        elif isinstance(input_slice, tuple):
            if not 1 <= len(input_slice) <= 3 or not all(i is None or _is_int(i) for i in input_slice):
                raise ValueError(
                    f"a tuple slice is (stop,), (start, stop) or (start, stop, step) of ints, got {input_slice!r}"
                )
            self.slice, self.mode = slice(*input_slice), "slice"
        elif _is_int(input_slice):
            self.slice, self.mode = int(input_slice), "int"
        elif isinstance(input_slice, slice):
            self.slice, self.mode = input_slice, "slice"
        elif isinstance(input_slice, (list, torch.Tensor, np.ndarray)):
            indices = np.asarray(input_slice.detach().cpu() if isinstance(input_slice, torch.Tensor) else input_slice)
            if indices.dtype.kind not in "iub":
                raise ValueError(f"an index array must hold integers or bools, got dtype {indices.dtype}")
            self.slice, self.mode = indices, "array"
        elif input_slice is None:
            self.slice, self.mode = slice(None), "identity"
        else:
            raise ValueError(
                f"Invalid input_slice {input_slice!r}: expected None, an int, a tuple (start, stop[, step]), a slice, "
                "a list, a tensor or a numpy array of indices"
            )

    def apply(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """``tensor`` with this selection applied along ``dim`` (negative counts from the end)."""
        if not -tensor.ndim <= dim < tensor.ndim:
            raise ValueError(f"dim={dim} is out of range for a tensor of shape {tuple(tensor.shape)}")
        index: list[Any] = [slice(None)] * tensor.ndim
        selection: int | slice | np.ndarray | torch.Tensor = self.slice
        if self.mode == "array":
            selection = torch.as_tensor(selection, device=tensor.device)
        index[dim] = selection
        return tensor[tuple(index)]

    def indices(self, max_ctx: int | None = None) -> np.ndarray:
        """The indices this selection keeps on an axis of length ``max_ctx`` (not needed for an int)."""
        if self.mode == "int":
            return np.array([self.slice], dtype=np.int64)
        if max_ctx is None:
            raise ValueError("max_ctx must be specified if slice is not an integer")
        return np.arange(max_ctx, dtype=np.int64)[self.slice]

    @property
    def removes_axis(self) -> bool:
        """True when applying this selection removes the axis (an int, or a 0-d index array)."""
        return self.mode == "int" or (
            self.mode == "array" and isinstance(self.slice, np.ndarray) and self.slice.ndim == 0
        )

    @classmethod
    def unwrap(cls, slice_input: Union["Slice", SliceInput]) -> "Slice":
        """A ``Slice`` of ``slice_input`` that keeps the axis: an int ``i`` becomes ``[i]``."""
        if isinstance(slice_input, Slice):
            return slice_input
        if _is_int(slice_input):
            slice_input = [int(slice_input)]
        return cls(slice_input)

    def __repr__(self) -> str:
        return f"Slice: {self.slice} Mode: {self.mode} "


def _is_int(value: object) -> TypeGuard[int | np.integer]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


__all__ = ["Slice", "SliceInput"]

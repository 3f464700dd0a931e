"""TransformerLens' small tensor helpers (exported by ``interp_transformer.compat.utils``).

>>> import torch
>>> get_corner(torch.arange(16).reshape(4, 4), 2).tolist()
[[0, 1], [4, 5]]
>>> is_lower_triangular(torch.ones(3, 3).tril()), is_square(torch.ones(2, 3))
(True, False)
"""

import einops
import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.circuits.factored_matrix import FactoredMatrix
from interp_transformer.compat.errors import CompatValueError


def to_numpy(tensor) -> np.ndarray:
    """A tensor (detached, on the CPU; bfloat16 as float32), list, tuple, number or array as a numpy array."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, (list, tuple)):
        return np.array(tensor)
    if isinstance(tensor, Tensor):
        tensor = tensor.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if isinstance(tensor, (int, float, bool, str)):
        return np.array(tensor)
    raise CompatValueError(f"Input to to_numpy has invalid type: {type(tensor).__name__}")


def get_corner(tensor, n: int = 3):
    """The first ``n`` entries along every axis (a ``FactoredMatrix`` gives its dense corner)."""
    if isinstance(tensor, FactoredMatrix):
        return get_matrix_corner(tensor, n)
    return tensor[tuple(slice(n) for _ in range(tensor.ndim))]


def get_matrix_corner(matrix: FactoredMatrix, n: int = 3) -> Tensor:
    """The dense first ``n`` entries along every axis of a factored matrix."""
    corner = matrix.A[..., :n, :] @ matrix.B[..., :, :n]
    return corner[tuple(slice(n) for _ in range(corner.ndim))]


def remove_batch_dim(tensor: Tensor) -> Tensor:
    """``tensor`` without its first axis when that axis has size 1; otherwise ``tensor`` itself."""
    return tensor.squeeze(0) if tensor.shape[0] == 1 else tensor


def transpose(tensor: Float[Tensor, "... a b"]) -> Float[Tensor, "... b a"]:
    """The last two axes swapped."""
    return tensor.transpose(-1, -2)


def is_square(x: Tensor) -> bool:
    """Whether ``x`` is a square matrix (2-d, equal sides)."""
    return x.ndim == 2 and x.shape[0] == x.shape[1]


def is_lower_triangular(x: Tensor) -> bool:
    """Whether ``x`` is a square matrix with zeros above the diagonal."""
    return is_square(x) and x.equal(x.tril())


def composition_scores(left: FactoredMatrix, right: FactoredMatrix, broadcast_dims: bool = True) -> Tensor:
    """``||left right||_F / (||left||_F ||right||_F)``, the composition score of two circuits.

    With ``broadcast_dims`` the batch axes of ``left`` and ``right`` are combined (every
    pair): the result has ``left``'s batch axes, then ``right``'s.
    """
    if broadcast_dims:
        left_batch, right_batch = left.ndim - 2, right.ndim - 2
        for i in range(left_batch):
            right = right.unsqueeze(i)
        for i in range(right_batch):
            left = left.unsqueeze(i + left_batch)
    if left.rdim != right.ldim:
        raise CompatValueError(
            f"Composition scores require left.rdim==right.ldim, shapes were left: {tuple(left.shape)}, "
            f"right: {tuple(right.shape)}"
        )
    return (left @ right).norm() / left.norm() / right.norm()


def get_offset_position_ids(
    past_kv_pos_offset: int, attention_mask: Int[Tensor, "batch offset_pos"]
) -> Int[Tensor, "batch pos"]:
    """Position ids counted from each row's first real token (0 on the padding before it), after the cached
    positions."""
    shifted = attention_mask.cumsum(dim=1) - 1
    return shifted.masked_fill(shifted < 0, 0)[:, past_kv_pos_offset:]


def repeat_along_head_dimension(
    tensor: Float[Tensor, "batch pos d_model"], n_heads: int, clone_tensor: bool = True
) -> Tensor:
    """``[batch, pos, d_model] -> [batch, pos, head_index, d_model]``, one copy per head (its own memory with
    ``clone_tensor``)."""
    repeated = einops.repeat(tensor, "batch pos d_model -> batch pos head_index d_model", head_index=n_heads)
    return repeated.clone() if clone_tensor else repeated


def filter_dict_by_prefix(dictionary: dict, prefix: str) -> dict:
    """The entries whose keys start with ``prefix.``, with that prefix removed."""
    search = prefix if prefix.endswith(".") else prefix + "."
    return {key[len(search) :]: value for key, value in dictionary.items() if key.startswith(search)}


def get_nested_attr(obj, attr_str: str):
    """``obj.a.b.c`` for ``"a.b.c"``."""
    for attr in attr_str.split("."):
        obj = getattr(obj, attr)
    return obj


def set_nested_attr(obj, attr_str: str, value) -> None:
    """Set ``obj.a.b.c = value`` for ``"a.b.c"``."""
    *path, last = attr_str.split(".")
    setattr(get_nested_attr(obj, ".".join(path)) if path else obj, last, value)


def is_library_available(name: str) -> bool:
    """Whether the module ``name`` can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec(name) is not None


def get_device() -> torch.device:
    """``cuda`` when available, else ``mps`` when available, else ``cpu``."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")

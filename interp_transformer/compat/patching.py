"""Activation patching with TransformerLens' functions, arguments and return shapes (``transformer_lens.patching``).

Run the model on the corrupted tokens, replace one activation (or one slice of it: a
position, a head, a position of a head) by its value in the clean run, and record
``patching_metric(logits)``; once for every index along the named axes:

==============================================  =========================  ========================
function                                        activation                 result shape
==============================================  =========================  ========================
``get_act_patch_resid_pre`` (``_resid_mid``,    ``resid_pre`` ...          ``[layer, pos]``
``_attn_out``, ``_mlp_out``)
``get_act_patch_attn_head_out_by_pos``          ``z`` (``q``, ``k``, ``v``)  ``[layer, pos, head]``
(``_q_by_pos``, ``_k_by_pos``, ``_v_by_pos``)
``get_act_patch_attn_head_out_all_pos`` ...     ``z`` (``q``, ``k``, ``v``)  ``[layer, head]``
``get_act_patch_attn_head_pattern_all_pos``     ``pattern``                ``[layer, head]``
``get_act_patch_attn_head_pattern_by_pos``      ``pattern``                ``[layer, head, dest_pos]``
``get_act_patch_attn_head_pattern_dest_src_pos``  ``pattern``              ``[layer, head, dest, src]``
``get_act_patch_attn_head_all_pos_every``       out, q, k, v, pattern      ``[5, layer, head]``
``get_act_patch_attn_head_by_pos_every``        out, q, k, v, pattern      ``[5, layer, pos, head]``
``get_act_patch_block_every``                   resid_pre, attn, mlp out   ``[3, layer, pos]``
==============================================  =========================  ========================

``generic_activation_patch`` is the engine: give it a ``patch_setter(corrupted, index,
clean) -> patched`` and the axes (or a pandas ``index_df`` of indices, for a flat
result). Hook names come from the model's own table (``model.act_name``). For our own
patching tools (metrics, plots, batching) see ``analysis.patching``.

With grouped-query attention ``hook_k`` and ``hook_v`` hold one entry per key/value head
(``n_key_value_heads``, fewer than the query heads): the key and value sweeps run over those
heads, on the axis ``"key_value_head"`` (its name in ``return_index_df``'s columns too), and
the ``_every`` functions fill the columns past ``n_key_value_heads`` of their key and value
rows with NaN (no such head), never with a number. On other models the axis is ``"head"``,
as in TransformerLens.
"""

import itertools
from collections.abc import Callable, Sequence
from functools import partial

import einops
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.compat.errors import CompatValueError, assertion_compatible

AXES = ("layer", "pos", "head_index", "head", "key_value_head", "src_pos", "dest_pos")
KEY_VALUE_ACTIVATIONS = ("k", "v")  # one entry per key/value head


def n_key_value_heads(model) -> int:
    """How many key/value heads ``hook_k``/``hook_v`` hold (``n_heads`` unless attention is grouped)."""
    return model.blocks[0].attn.n_key_value_heads


def make_df_from_ranges(column_max_ranges: Sequence[int], column_names: Sequence[str]):
    """A pandas DataFrame of every combination of ``range(max)`` per column, the last column varying fastest."""
    import pandas as pd

    return pd.DataFrame(list(itertools.product(*[range(r) for r in column_max_ranges])), columns=list(column_names))


@assertion_compatible  # a hook name the model lacks: CompatKeyError, also TransformerLens' AssertionError
def generic_activation_patch(
    model,
    corrupted_tokens: Tensor,
    clean_cache,
    patching_metric: Callable[[Tensor], Tensor],
    patch_setter: Callable[[Tensor, Sequence[int], Tensor], Tensor],
    activation_name: str,
    index_axis_names: Sequence[str] | None = None,
    index_df=None,
    return_index_df: bool = False,
):
    """The metric after patching, for every index (see the module docstring).

    ``index_axis_names`` (the first is ``"layer"``) gives a result with one axis per name;
    ``index_df`` (a pandas DataFrame whose first column is the layer) a flat result, one
    entry per row. ``return_index_df`` also returns the indices' DataFrame.
    """
    if (index_axis_names is None) == (index_df is None):
        raise CompatValueError("pass exactly one of index_axis_names and index_df")
    axis_names: Sequence[str] = index_axis_names or ()  # given exactly when index_df is not
    if index_df is None:
        unknown = [name for name in axis_names if name not in AXES]
        if unknown:
            raise CompatValueError(f"unknown axis names {unknown}; axes are {list(AXES)}")
        heads, key_value_heads = model.cfg.n_heads, n_key_value_heads(model)
        if (
            activation_name in KEY_VALUE_ACTIVATIONS
            and key_value_heads != heads
            and {"head", "head_index"} & set(axis_names)
        ):
            raise CompatValueError(
                f"{activation_name!r} holds {key_value_heads} key/value heads, not {heads} query heads: "
                f"index it with the axis 'key_value_head', got axes {list(axis_names)}"
            )
        sizes = {
            "layer": model.cfg.n_layers,
            "pos": corrupted_tokens.shape[-1],
            "head_index": heads,
            "head": heads,
            "key_value_head": key_value_heads,
            "src_pos": corrupted_tokens.shape[-1],
            "dest_pos": corrupted_tokens.shape[-1],
        }
        shape = [sizes[name] for name in axis_names]
        indices = list(itertools.product(*[range(size) for size in shape]))
        output = torch.zeros(shape)
    else:
        indices = [tuple(int(v) for v in row) for row in index_df.itertuples(index=False)]
        output = torch.zeros(len(indices))
    for number, index in enumerate(tqdm(indices, disable=len(indices) < 2)):
        name = model.act_name(activation_name, index[0])
        clean = clean_cache[name]

        def patch(corrupted: Tensor, hook, index=index, clean=clean) -> Tensor:
            return patch_setter(corrupted.clone(), list(index), clean.to(corrupted))

        with torch.no_grad():
            value = float(patching_metric(model.run_with_hooks(corrupted_tokens, fwd_hooks=[(name, patch)])))
        output[tuple(index) if index_df is None else number] = value
    if return_index_df:
        return output, index_df if index_df is not None else make_df_from_ranges(output.shape, axis_names)
    return output


def _check_index(index: Sequence[int], length: int, what: str) -> None:
    if len(index) != length:
        raise CompatValueError(f"{what} takes an index of {length} entries, got {list(index)}")


def layer_pos_patch_setter(corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor) -> Tensor:
    """``index = [layer, pos]``: patch one position of a ``[batch, pos, ...]`` activation."""
    _check_index(index, 2, "layer_pos_patch_setter")
    corrupted_activation[:, index[1], ...] = clean_activation[:, index[1], ...]
    return corrupted_activation


def layer_pos_head_vector_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """``index = [layer, pos, head_index]``: patch one head at one position of ``[batch, pos, head_index, ...]``."""
    _check_index(index, 3, "layer_pos_head_vector_patch_setter")
    _, pos, head = index
    corrupted_activation[:, pos, head] = clean_activation[:, pos, head]
    return corrupted_activation


def layer_head_vector_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """``index = [layer, head_index]``: patch one head at every position of ``[batch, pos, head_index, ...]``."""
    _check_index(index, 2, "layer_head_vector_patch_setter")
    corrupted_activation[:, :, index[1]] = clean_activation[:, :, index[1]]
    return corrupted_activation


def layer_head_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """``index = [layer, head_index]``: patch one head of ``[batch, head_index, dest_pos, src_pos]``."""
    _check_index(index, 2, "layer_head_pattern_patch_setter")
    corrupted_activation[:, index[1]] = clean_activation[:, index[1]]
    return corrupted_activation


def layer_head_pos_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """``index = [layer, head_index, dest_pos]``: patch one query row of one head's pattern."""
    _check_index(index, 3, "layer_head_pos_pattern_patch_setter")
    _, head, dest = index
    corrupted_activation[:, head, dest, :] = clean_activation[:, head, dest, :]
    return corrupted_activation


def layer_head_dest_src_pos_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """``index = [layer, head_index, dest_pos, src_pos]``: patch one entry of one head's pattern."""
    _check_index(index, 4, "layer_head_dest_src_pos_pattern_patch_setter")
    _, head, dest, src = index
    corrupted_activation[:, head, dest, src] = clean_activation[:, head, dest, src]
    return corrupted_activation


def _patcher(name: str, setter, axes: tuple, doc: str):
    function = partial(generic_activation_patch, patch_setter=setter, activation_name=name, index_axis_names=axes)
    function.__doc__ = f"{doc} ``(model, corrupted_tokens, clean_cache, patching_metric)`` -> ``[{', '.join(axes)}]``."
    return function


def _key_value_patcher(name: str, setter, axes: tuple, doc: str):
    """``_patcher`` for keys or values: the ``"head"`` axis is ``"key_value_head"`` where attention is grouped."""

    def patch(model, corrupted_tokens, clean_cache, patching_metric, return_index_df: bool = False):
        grouped = n_key_value_heads(model) != model.cfg.n_heads
        names = tuple("key_value_head" if grouped and axis == "head" else axis for axis in axes)
        return generic_activation_patch(
            model, corrupted_tokens, clean_cache, patching_metric, setter, name, names, return_index_df=return_index_df
        )

    shown = ", ".join(axes).replace("head", "head (key_value_head where grouped)")
    patch.__doc__ = f"{doc} ``(model, corrupted_tokens, clean_cache, patching_metric)`` -> ``[{shown}]``."
    return patch


get_act_patch_resid_pre = _patcher(
    "resid_pre", layer_pos_patch_setter, ("layer", "pos"), "Patch the residual stream entering each block, by position:"
)
get_act_patch_resid_mid = _patcher(
    "resid_mid",
    layer_pos_patch_setter,
    ("layer", "pos"),
    "Patch the residual stream between attention and MLP, by position:",
)
get_act_patch_attn_out = _patcher(
    "attn_out", layer_pos_patch_setter, ("layer", "pos"), "Patch each attention layer's output, by position:"
)
get_act_patch_mlp_out = _patcher(
    "mlp_out", layer_pos_patch_setter, ("layer", "pos"), "Patch each MLP layer's output, by position:"
)
get_act_patch_attn_head_out_by_pos = _patcher(
    "z", layer_pos_head_vector_patch_setter, ("layer", "pos", "head"), "Patch each head's output (z), by position:"
)
get_act_patch_attn_head_q_by_pos = _patcher(
    "q", layer_pos_head_vector_patch_setter, ("layer", "pos", "head"), "Patch each head's queries, by position:"
)
get_act_patch_attn_head_k_by_pos = _key_value_patcher(
    "k", layer_pos_head_vector_patch_setter, ("layer", "pos", "head"), "Patch each key/value head's keys, by position:"
)
get_act_patch_attn_head_v_by_pos = _key_value_patcher(
    "v",
    layer_pos_head_vector_patch_setter,
    ("layer", "pos", "head"),
    "Patch each key/value head's values, by position:",
)
get_act_patch_attn_head_pattern_by_pos = _patcher(
    "pattern",
    layer_head_pos_pattern_patch_setter,
    ("layer", "head_index", "dest_pos"),
    "Patch each head's attention pattern, by query position:",
)
get_act_patch_attn_head_pattern_dest_src_pos = _patcher(
    "pattern",
    layer_head_dest_src_pos_pattern_patch_setter,
    ("layer", "head_index", "dest_pos", "src_pos"),
    "Patch each entry of each head's attention pattern:",
)
get_act_patch_attn_head_out_all_pos = _patcher(
    "z", layer_head_vector_patch_setter, ("layer", "head"), "Patch each head's output (z) at every position:"
)
get_act_patch_attn_head_q_all_pos = _patcher(
    "q", layer_head_vector_patch_setter, ("layer", "head"), "Patch each head's queries at every position:"
)
get_act_patch_attn_head_k_all_pos = _key_value_patcher(
    "k", layer_head_vector_patch_setter, ("layer", "head"), "Patch each key/value head's keys at every position:"
)
get_act_patch_attn_head_v_all_pos = _key_value_patcher(
    "v", layer_head_vector_patch_setter, ("layer", "head"), "Patch each key/value head's values at every position:"
)
get_act_patch_attn_head_pattern_all_pos = _patcher(
    "pattern", layer_head_pattern_patch_setter, ("layer", "head_index"), "Patch each head's whole attention pattern:"
)


def _pad_heads(results: Tensor, like: Tensor) -> Tensor:
    """Key/value results ``[..., key_value_head]`` padded with NaN (no such head) to the query heads' count."""
    return F.pad(results, (0, like.shape[-1] - results.shape[-1]), value=float("nan"))


# What the ``_every`` functions run, in this order: (at every position, by position) per row
_EVERY_HEAD = (
    (get_act_patch_attn_head_out_all_pos, get_act_patch_attn_head_out_by_pos),
    (get_act_patch_attn_head_q_all_pos, get_act_patch_attn_head_q_by_pos),
    (get_act_patch_attn_head_k_all_pos, get_act_patch_attn_head_k_by_pos),
    (get_act_patch_attn_head_v_all_pos, get_act_patch_attn_head_v_by_pos),
    (get_act_patch_attn_head_pattern_all_pos, get_act_patch_attn_head_pattern_by_pos),
)


def _every_head(by_pos: bool, model, corrupted_tokens: Tensor, clean_cache, metric) -> Tensor:
    """Run ``_EVERY_HEAD``'s column in order and stack the results; with grouped-query attention the key and value
    rows hold the key/value heads in their first ``n_key_value_heads`` columns and NaN after them."""
    out, q, k, v, pattern = (row[by_pos](model, corrupted_tokens, clean_cache, metric) for row in _EVERY_HEAD)
    if by_pos:
        pattern = einops.rearrange(pattern, "layer head_index pos -> layer pos head_index")
    return torch.stack([out, q, _pad_heads(k, q), _pad_heads(v, q), pattern])


def get_act_patch_attn_head_all_pos_every(model, corrupted_tokens: Tensor, clean_cache, metric) -> Tensor:
    """Every head at every position, for its output, queries, keys, values and pattern: ``[5, layer, head]``.

    With grouped-query attention the key and value rows hold the key/value heads in their first
    ``n_key_value_heads`` columns and NaN after them."""
    return _every_head(False, model, corrupted_tokens, clean_cache, metric)


def get_act_patch_attn_head_by_pos_every(model, corrupted_tokens: Tensor, clean_cache, metric) -> Tensor:
    """Every head by position, for its output, queries, keys, values and pattern: ``[5, layer, pos, head]``.

    With grouped-query attention the key and value rows hold the key/value heads in their first
    ``n_key_value_heads`` columns and NaN after them."""
    return _every_head(True, model, corrupted_tokens, clean_cache, metric)


def get_act_patch_block_every(model, corrupted_tokens: Tensor, clean_cache, metric) -> Tensor:
    """The residual stream entering each block, each attention output and each MLP output, by position: ``[3, layer,
    pos]``."""
    return torch.stack(
        [
            get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_out(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, metric),
        ]
    )


__all__ = [
    name
    for name in dir()
    if name.startswith(("get_act_patch", "layer_")) or name in ("generic_activation_patch", "make_df_from_ranges")
]

"""Copy the weights of a model written in plain PyTorch into ours, part by part: ``load_from_modules``.

``sources`` maps the path of one of our parts (``"blocks.0.attn"``) to where its weights are
in the other model: a module, a tuple of modules, or a tensor; or the name of one of our
weights (``"unembed.W_U"``) to a tensor in our layout. Each of our parts holds its
weights as linear maps, ``W_x`` with its bias ``b_x`` (an attention ``W_Q, W_K, W_V, W_O``;
an MLP ``W_in, W_out``; a gated MLP ``W_gate, W_in, W_out``; a read-out ``W_U``), a norm's gain
``w`` with its bias ``b``, or one table (``W_E``, ``W_pos``, ``W_rel``). The source's weights
are read in order and given to those, converted on the way:

=============================  ===============================================================================
source                         read as
=============================  ===============================================================================
``nn.Linear``                  one linear map, ``weight [d_out, d_in]``: ``W = weight^T``, split per head
                               (``W_Q [head_index, d_model, d_head]``, ``W_O [head_index, d_head, d_model]``);
                               one wider than our next map is several fused ones (nanoGPT's ``c_attn``: Q, K, V)
``nn.MultiheadAttention``      its fused ``in_proj`` (Q, K, V), then ``out_proj``
``nn.Embedding``, a tensor     a table, copied as is, or transposed where ours is its transpose (a read-out
                               tied to the token embedding: ``W_U = W_E^T``, ``b_U = 0``)
a module of 1-D parameters     a norm: its parameters in order are ``w``, ``b`` (``nn.LayerNorm``'s ``weight``
                               and ``bias``, or a hand-written ``a_2``, ``b_2``)
a tuple of the above           each in turn; an ``nn.Sequential`` or ``nn.ModuleList`` likewise, its parts
                               without weights (an activation) skipped
a module named as ours         its parameters by name (``W_Q``, ``b_Q``, ... as ARENA's transformer writes them)
a wrapper                      a module with no weights of its own and one child with weights: read as that
                               child (a module with several is refused: their order is its forward's, so give
                               them as a tuple in ours)
a whole mixture of experts     for our ``MixtureOfExperts``: a module whose children are the router (one
                               module with weights) and a ``ModuleList`` of ``n_experts`` experts, read as the
                               entries ``path`` (the router) and ``path.experts.E`` (each expert)
=============================  ===============================================================================

One weight at several paths (an encoder-decoder's ``share_positions``) is given once, under any of them.

A bias the source lacks is zero here; a bias we do not have (a gated MLP's gate) or hold at
zero (a spec's ``attn_bias=False``) must be zero there. Anything that does not fit raises
``ValueError`` naming the part, our weight and the source's shape; a part nobody mapped is named
by ``load_strict`` as missing.
"""

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import einops
import torch
from torch import Tensor, nn

from interp_transformer.core.strict import load_strict

Source = nn.Module | Tensor | Sequence[nn.Module | Tensor]


def _has_weights(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _their_maps(where: str, source, ours: Sequence[str] = ()) -> list[tuple[str, Tensor, Tensor | None]]:
    """The source as a list of ``(kind, weight, bias)``, kind ``"linear"``, ``"table"`` or ``"gain"`` (``ours``: our
    part's weights, named where the source cannot be read)."""
    if isinstance(source, (tuple, list)):
        return [entry for item in source for entry in _their_maps(where, item, ours)]
    if isinstance(source, Tensor):
        return [("table", source, None)]
    if isinstance(source, nn.Linear):
        return [("linear", source.weight, source.bias)]
    if isinstance(source, nn.MultiheadAttention):
        if source.in_proj_weight is None:
            raise ValueError(
                f"{where}: an nn.MultiheadAttention with separate q/k/v projections (kdim/vdim) is not "
                "read; pass its q, k, v and out projections as tensors"
            )
        out = source.out_proj
        return [("linear", source.in_proj_weight, source.in_proj_bias), ("linear", out.weight, out.bias)]
    if isinstance(source, nn.Embedding):
        return [("table", source.weight, None)]
    if isinstance(source, (nn.Sequential, nn.ModuleList)):  # its parts with weights, in order (an activation has none)
        return _their_maps(where, [child for child in source if _has_weights(child)], ours)
    if isinstance(source, nn.Module):
        params = list(source.parameters(recurse=False))
        if params and all(p.ndim == 1 for p in params) and len(params) <= 2:
            return [("gain", params[0], params[1] if len(params) == 2 else None)]
        weighted = [name for name, child in source.named_children() if _has_weights(child)]
        if not params and len(weighted) == 1:  # a wrapper: its one child with weights holds them all
            return _their_maps(where, getattr(source, weighted[0]), ours)
        if not params and len(weighted) > 1:
            raise TypeError(
                f"{where}: a {type(source).__name__} keeps its weights in its children with weights {weighted}, in "
                f"an order only its forward knows: pass the ones our part takes as a tuple in our order {list(ours)} "
                f"(e.g. (module.{weighted[0]}, ...)), or each child under the part of ours it fills"
            )
    raise TypeError(
        f"{where}: a source is an nn.Linear, nn.MultiheadAttention, nn.Embedding, a norm (a module of 1-D "
        f"parameters), a tensor, a tuple of these, or a module with one child holding its weights; got "
        f"{type(source).__name__}"
    )


def _our_maps(part: nn.Module) -> list[tuple[str, str | None]]:
    """Our part's weights as ``(weight, bias or None)`` names, in the order the part registers them."""
    names = [name for name, _ in part.named_parameters(recurse=False)]
    maps = []
    for name in names:
        stem = name.lstrip("_")
        if stem == "w":
            maps.append((name, "b" if "b" in names else None))
        elif stem.startswith("W_"):
            bias = name.replace("W_", "b_", 1)
            maps.append((name, bias if bias in names else None))
    return maps


def _width(ours: Tensor, weight: Tensor) -> int:
    """How many of a linear weight's output features (rows) our weight ``ours`` takes."""
    if ours.ndim == 3 and weight.shape[1] == ours.shape[1]:  # W_Q/W_K/W_V: [(head_index d_head), d_model]
        return ours.shape[0] * ours.shape[2]
    return ours.shape[-1]  # a [d_in, d_out] matrix, or W_O [head_index, d_head, d_model]


def _as_ours(where: str, name: str, ours: Tensor, weight: Tensor, kind: str) -> Tensor:
    """``weight`` (an ``nn.Linear``'s, or a table) in the layout of our ``ours``."""
    if kind != "linear":
        if weight.shape == ours.shape:
            return weight
        if weight.ndim == 2 and weight.T.shape == ours.shape:
            return weight.T
    elif ours.ndim == 2 and weight.T.shape == ours.shape:
        return weight.T
    elif ours.ndim == 3:
        heads, middle, last = ours.shape
        if weight.shape == (heads * last, middle):  # W_Q/W_K/W_V: [(head_index d_head), d_model]
            return einops.rearrange(weight, "(head_index d_head) d_model -> head_index d_model d_head", d_head=last)
        if weight.shape == (last, heads * middle):  # W_O: [d_model, (head_index d_head)]
            return einops.rearrange(weight, "d_model (head_index d_head) -> head_index d_head d_model", d_head=middle)
    raise ValueError(
        f"{where}: {name} is {tuple(ours.shape)}, the source's {kind} weight {tuple(weight.shape)} does not fit it"
    )


def _rows(where: str, weight: Tensor, maps: list, part: nn.Module) -> list[int]:
    """How many of the source's rows each of our next maps takes (one map, or several fused into one linear)."""
    widths, total = [], 0
    for name, _ in maps:
        widths.append(_width(getattr(part, name), weight))
        total += widths[-1]
        if total >= weight.shape[0]:
            break
    if total != weight.shape[0]:
        raise ValueError(
            f"{where}: the source's linear weight {tuple(weight.shape)} has {weight.shape[0]} output "
            f"features; our next maps {[n for n, _ in maps[: len(widths)]]} take {widths}"
        )
    return widths


def _is_whole_module(part: nn.Module, source) -> bool:
    """A module none of the kinds read directly (a whole mixture of experts, a wrapper)."""
    kinds = (nn.Linear, nn.MultiheadAttention, nn.Embedding, nn.Sequential, nn.ModuleList)
    return isinstance(source, nn.Module) and not isinstance(source, kinds) and not _same_names(part, source)


def _mixture_entries(path: str, part: Any, source: nn.Module) -> dict:  # part: our MixtureOfExperts
    """A whole mixture-of-experts module as our entries: ``path`` its router, ``path.experts.E`` each expert."""
    n_experts = len(part.experts)
    children = dict(source.named_children())
    lists = {
        name: child
        for name, child in children.items()
        if isinstance(child, (nn.ModuleList, nn.Sequential))
        and len(child) == n_experts
        and all(_has_weights(expert) for expert in child)
    }
    rest = [name for name, child in children.items() if _has_weights(child) and name not in lists]
    own = list(source.parameters(recurse=False))
    if len(lists) == 1 and len(rest) == 1 and not own and getattr(part, "shared_expert", None) is None:
        (experts,) = lists.values()
        return {path: children[rest[0]], **{f"{path}.experts.{e}": expert for e, expert in enumerate(experts)}}
    came = {
        name: type(child).__name__ + (f" of {len(child)}" if isinstance(child, (nn.ModuleList, nn.Sequential)) else "")
        for name, child in children.items()
        if _has_weights(child)
    }
    own_names = [name for name, _ in source.named_parameters(recurse=False)]
    shared = f", '{path}.shared_expert': <the shared expert>" if getattr(part, "shared_expert", None) else ""
    raise TypeError(
        f"{path} is a mixture of {n_experts} experts: pass its router and each expert as entries, {{'{path}': "
        f"<the router, d_model -> {n_experts}>, '{path}.experts.0': <expert 0>, ..., '{path}.experts.{n_experts - 1}': "
        f"<expert {n_experts - 1}>{shared}}}, or one module whose children with weights are the router and a "
        f"ModuleList of {n_experts} experts; got a {type(source).__name__} whose children with weights are {came}"
        + (f" and own parameters {own_names}" if own_names else "")
    )


def _entries(modules: Mapping[str, nn.Module], sources: Mapping[str, Source]):
    """``sources``' items, a whole mixture of experts given for our ``MixtureOfExperts`` spread into its entries."""
    for path, source in sources.items():
        part = modules.get(path)
        if (
            part is not None
            and isinstance(getattr(part, "experts", None), nn.ModuleList)
            and isinstance(source, nn.Module)
            and _is_whole_module(part, source)
        ):
            yield from _mixture_entries(path, part, source).items()
        else:
            yield path, source


def _fill_shared(model: nn.Module, out: dict) -> None:
    """One weight at several paths (a table both stacks read) given under one of them: every path gets it."""
    paths_of: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        paths_of.setdefault(id(tensor), []).append(name)
    for paths in paths_of.values():
        given = [path for path in paths if path in out]
        if len(paths) < 2 or not given:
            continue
        first = out[given[0]]
        for other in given[1:]:
            if out[other].shape != first.shape or not torch.equal(out[other], first):
                raise ValueError(f"{given[0]} and {other} are one weight of this model, given two different values")
        for path in paths:
            out.setdefault(path, first)


def weights_from_modules(model: nn.Module, sources: Mapping[str, Source]) -> dict[str, Tensor]:
    """Our state-dict entries for every part named in ``sources`` (see the module docstring), as fresh tensors."""
    modules = dict(model.named_modules(remove_duplicate=False))
    params, out = dict(model.named_parameters(remove_duplicate=False)), {}
    for path, source in _entries(modules, sources):
        if path in params and isinstance(source, Tensor):  # one of our weights, given in our layout
            out[path] = source
            continue
        if path not in modules:
            close = difflib.get_close_matches(path, [name for name in modules if name], n=3)
            raise KeyError(f"{path!r} names no part of the model; closest: {close}")
        part = modules[path]
        if _same_names(part, source):  # a part written with our names (ARENA's): copied weight by weight
            out.update({f"{path}.{name}": param for name, param in source.named_parameters(recurse=False)})
            continue
        maps = _our_maps(part)
        theirs = _their_maps(path, source, [name for name, _ in maps])
        if not maps:
            raise ValueError(f"{path}: this part has no weights of its own to load")
        while maps and theirs:
            kind, weight, bias = theirs.pop(0)
            widths = _rows(path, weight, maps, part) if kind == "linear" else [weight.shape[0]]
            count = len(widths)
            weight_parts = weight.split(widths) if kind == "linear" else [weight]
            bias_parts = bias.split(widths) if kind == "linear" and bias is not None else [bias] * count
            for (name, bias_name), w, b in zip(maps[:count], weight_parts, bias_parts, strict=True):
                ours = getattr(part, name)
                out[f"{path}.{name}"] = _as_ours(path, name, ours, w, "table" if kind == "gain" else kind)
                _set_bias(path, part, bias_name, b, out)
            maps = maps[count:]
        if maps or theirs:
            left = [name for name, _ in maps] if maps else [f"{len(theirs)} more weight(s) of the source"]
            raise ValueError(
                f"{path}: our part's weights {[n for n, _ in _our_maps(part)]} and the source's do not "
                f"pair up: left over {left}"
            )
    _fill_shared(model, out)
    return {name: t.detach().clone(memory_format=torch.contiguous_format) for name, t in out.items()}


def _same_names(part: nn.Module, source) -> bool:
    """The source is a module whose own parameters are named as ours (shapes are checked when loading)."""
    if not isinstance(source, nn.Module):
        return False
    names = {name for name, _ in source.named_parameters(recurse=False)}
    return bool(names) and names == {name for name, _ in part.named_parameters(recurse=False)}


def _set_bias(path: str, part: nn.Module, bias_name: str | None, bias: Tensor | None, out: dict) -> None:
    nonzero = bias is not None and bool(bias.detach().ne(0).any())
    if bias_name is None or bias_name in getattr(part, "held_at_zero", ()):
        if nonzero:
            what = "has no such bias" if bias_name is None else f"holds {bias_name} at zero"
            raise ValueError(f"{path}: the source has a non-zero bias where our part {what}")
        if bias_name is None:
            return
    ours = getattr(part, bias_name)
    out[f"{path}.{bias_name}"] = torch.zeros_like(ours) if bias is None else bias.reshape(ours.shape)


def load_from_modules(model: nn.Module, sources: Mapping[str, Source]) -> nn.Module:
    """``model`` holding the weights ``sources`` give (``weights_from_modules``), loaded strictly in its dtype:
    a parameter no source gives is named by ``CheckpointError``."""
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    return load_strict(model, weights_from_modules(model, sources), dtype=dtype, device=device)


__all__ = ["load_from_modules", "weights_from_modules"]

"""Input checks shared by the analysis tools.

Every tool reports bad input the same way:

- a layer, head or neuron index out of range: ``ValueError`` naming the valid range;
- a cache without an activation the analysis reads: ``KeyError`` naming the missing
  hooks and the ``names_filter`` that caches everything the analysis needs;
- labels whose number differs from the axis they label: ``ValueError``;
- a metric value that is NaN or infinite (``finite_metric``, called where a tool reads its metric): ``ValueError``
  naming the tool, the values and the rows that gave them;
- a count (``count``, ``strict_count``) that is not an int, is a bool or is out of range: ``ValueError`` naming the
  range and the value;
- values outside their range (``within``: token ids, positions): ``ValueError`` naming the range and the values.
"""

import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from interp_transformer import ActivationCache
from interp_transformer.models.base import HookedTransformerBase

AnyModel = HookedTransformerBase  # a DemoTransformer of any architecture, or an EncoderTransformer

# what a capability-dependent analysis needs, in words (the key is a property of model.capabilities)
NEEDS = {
    "linear_logits": "next-token logits read linearly (frozen final-norm scale) from an additive residual stream: a "
    "pre-norm decoder such as a DemoTransformer",
    "next_token_logits": "a model whose output is next-token logits (a DemoTransformer)",
}


def check_model(model, what: str = "model") -> AnyModel:
    """``model`` if it is a hooked model (a ``DemoTransformer`` or an ``EncoderTransformer``)."""
    if not isinstance(model, HookedTransformerBase):
        raise TypeError(f"{what} must be a DemoTransformer or EncoderTransformer, got {type(model).__name__}")
    return model


def require(model, capability: str, what: str, instead: str) -> None:
    """Raise ``TypeError`` unless ``model.capabilities.<capability>`` holds; ``instead`` says what to use then."""
    if not getattr(model.capabilities, capability):
        raise TypeError(f"{what} needs {NEEDS[capability]}; this model {instead}")


def final_scale_names(model: AnyModel) -> list[str]:
    """The final norm's scale hook, as a list: empty where the final norm has no scale (``NoNorm``, or no final norm:
    the read-out takes the stream as it is, a scale of 1)."""
    return [model.act_name("scale")] if hasattr(getattr(model, "final_norm", None), "hook_scale") else []


def check_cache(cache) -> ActivationCache:
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache (from model.run_with_cache), got {type(cache).__name__}")
    return cache


def _index(value, size: int, name: str, unit: str) -> int:
    """``value`` as an index in ``[0, size)``; negative values count from the end, as in Python."""
    if isinstance(value, Tensor) and value.ndim == 0 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not -size <= value < size:
        raise ValueError(
            f"{name}={value} is out of range: the model has {size} {unit} (valid: 0..{size - 1}, or -{size}..-1)"
        )
    return int(value) % size


def layer_index(model: AnyModel, layer, name: str = "layer") -> int:
    return _index(layer, model.cfg.n_layers, name, "layers")


def head_index(model: AnyModel, head, name: str = "head") -> int:
    return _index(head, model.cfg.n_heads, name, "heads per layer")


def neuron_index(model: AnyModel, neuron, name: str = "neuron") -> int:
    require_mlp(model, name)
    return _index(neuron, model.cfg.d_mlp, name, "neurons per layer (d_mlp)")


def layer_list(model: AnyModel, layers) -> list[int]:
    """``None`` (all layers), one layer, or a sequence of layers, as non-negative ints."""
    if layers is None:
        return list(range(model.cfg.n_layers))
    if isinstance(layers, numbers.Integral) and not isinstance(layers, bool):
        return [layer_index(model, layers)]
    return [layer_index(model, layer) for layer in layers]


EXPERT_TOOLS = (
    "analysis.readouts.experts (expert_neuron_activations, expert_neuron_summary, expert_top_activations, "
    "expert_neuron_logit_effect, expert_neuron_logit_attribution)"
)


def require_mlp(model: AnyModel, what: str) -> None:
    """``ValueError`` unless every block has an MLP of ``d_mlp`` neurons (not attention-only, not experts)."""
    if model.writers_that("routes_tokens"):
        raise ValueError(
            f"{what}: this model's MLPs are mixtures of experts, whose neurons belong to one expert each; "
            f"use the per-expert tools in {EXPERT_TOOLS}"
        )
    if model.act_name("post", 0) not in model.hook_dict:
        raise ValueError(f"{what}: this model is attention-only (d_mlp=None) and has no MLP neurons")


def require_neurons(model: AnyModel, layer: int, what: str) -> None:
    """``ValueError`` unless block ``layer`` has an ordinary MLP's neurons (a mixture's dense blocks have)."""
    if model.act_name("post", layer) in model.hook_dict:
        return
    if model.writers_that("routes_tokens"):
        raise ValueError(
            f"{what}: block {layer}'s MLP is a mixture of experts, whose neurons belong to one expert each; "
            f"use the per-expert tools in {EXPERT_TOOLS}"
        )
    raise ValueError(f"{what}: this model is attention-only (d_mlp=None) and has no MLP neurons")


def require_hooks(
    cache: ActivationCache, names: Sequence[str], analysis: str, all_needed: Sequence[str] | None = None
) -> None:
    """Raise ``KeyError`` if the cache lacks any of ``names``, saying how to cache them."""
    missing = [name for name in names if name not in cache.cache_dict]
    if missing:
        needed = list(all_needed if all_needed is not None else names)
        raise KeyError(
            f"{analysis} needs the activations {missing}, which the cache lacks: cache them with "
            f"model.run_with_cache(tokens, names_filter={needed!r}) (or names_filter=None for every hook)"
        )


def cached(cache: ActivationCache, name: str) -> Tensor:
    """The activation ``name`` with a leading batch axis, also for a ``remove_batch_dim`` cache."""
    activation = cache.cache_dict[name]
    return activation if cache.has_batch_dim else activation.unsqueeze(0)


def find(items, field: str, key, missing: str, shown: int | None = None):
    """The first of ``items`` whose ``field`` equals ``key`` (a report's section, a feature's dashboard); else a
    ``KeyError``: ``missing`` and the ``field`` values there are (the first ``shown``)."""
    for item in items:
        if getattr(item, field) == key:
            return item
    raise KeyError(f"{missing}: {[getattr(item, field) for item in items][:shown]}")


def check_labels(labels: Sequence | None, size: int, axis: str) -> list[str] | None:
    """``labels`` as a list of str, one per entry of ``axis``; ``None`` stays ``None``."""
    if labels is None:
        return None
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
        raise TypeError(f"{axis} labels must be a sequence of str, got {type(labels).__name__}")
    if len(labels) != size:
        raise ValueError(
            f"got {len(labels)} {axis} labels for {size} entries along {axis}: pass exactly one label per {axis}"
        )
    return [str(label) for label in labels]


def _one_per_row(values, batch: int, name: str) -> Tensor:
    """An int, a list or an integer tensor (a scalar or ``[batch]``) as a ``[batch]`` integer tensor: one id or
    position per row."""
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        values = torch.full((batch,), int(values), dtype=torch.long)
    if isinstance(values, (list, tuple)):
        values = torch.tensor(values, dtype=torch.long)
    if not isinstance(values, Tensor) or values.is_floating_point() or values.dtype == torch.bool:
        raise TypeError(f"{name} must be an int or an integer tensor [batch], got {values!r}")
    if values.ndim == 0:
        values = values.expand(batch)
    if values.shape != (batch,):
        raise ValueError(f"{name} must be an int or have shape [batch]=[{batch}], got shape {tuple(values.shape)}")
    return values


def token_ids(model: AnyModel, tokens, batch: int, name: str = "tokens") -> Tensor:
    """An int or ``[batch]`` tensor of token ids, checked against ``d_vocab``, as ``[batch]`` int64."""
    tokens = _one_per_row(tokens, batch, name)
    if int(tokens.min()) < 0 or int(tokens.max()) >= model.cfg.d_vocab:
        raise ValueError(f"{name} must lie in [0, d_vocab={model.cfg.d_vocab}), got {tokens.tolist()}")
    return tokens.to(device=model.W_E.device, dtype=torch.long)


def positions(pos, batch: int, n_pos: int, name: str = "pos") -> Tensor:
    """An int or ``[batch]`` tensor of positions (negative counts from the end) as ``[batch]`` int64."""
    pos = _one_per_row(pos, batch, name)
    if int(pos.min()) < -n_pos or int(pos.max()) >= n_pos:
        raise ValueError(
            f"{name} must lie in [-{n_pos}, {n_pos}) for sequences of {n_pos} positions, got {pos.tolist()}"
        )
    return pos.long() % n_pos


def finite_metric(values, tool: str, where: Callable[[int], str] | None = None, shown: int = 4):
    """``values`` (a metric's output: a tensor or a number) unless one is NaN or infinite.

    Every tool calls it on its metric's output where that enters: a NaN or inf would make every score computed from it
    NaN, silently. The ``ValueError`` names ``tool``, the values and, through ``where(index)`` (an index into the
    flattened values), the rows that gave them (default: ``row <index>``)."""
    checked = values.detach() if isinstance(values, Tensor) else torch.as_tensor(values)
    bad = ~torch.isfinite(checked.flatten())
    if not bool(bad.any()):
        return values
    where = where or (lambda index: f"row {index}")
    rows = bad.nonzero().flatten().tolist()
    listed = "; ".join(f"{float(checked.flatten()[row])} at {where(row)}" for row in rows[:shown])
    more = f"; and {len(rows) - shown} more" if len(rows) > shown else ""
    raise ValueError(
        f"{tool}: the metric gave a non-finite value ({listed}{more}); a metric must be finite on every row, since a "
        "NaN or inf would make every score computed from it NaN"
    )


def _is_count(value, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= minimum


def count(value, name: str, *, minimum: int = 0, available: int | None = None, expected: str | None = None) -> int:
    """``value`` as a count: an int (not a bool) of at least ``minimum``, else ``ValueError`` naming the range and the
    value (``expected``: the whole range phrase, in place of ``"<name> must be an int >= <minimum>"``).

    A count above ``available`` (what exists) means all of it: ``min(value, available)`` is returned. Where a larger
    count is an error, use ``strict_count``."""
    if not _is_count(value, minimum):
        context = "" if available is None else f" (a count: {available} exist, and a larger count gives them all)"
        raise ValueError(f"{expected or f'{name} must be an int >= {minimum}{context}'}, got {value!r}")
    return int(value) if available is None else min(int(value), available)


def strict_count(value, name: str, *, minimum: int, most: int, expected: str | None = None) -> int:
    """``value`` as an int in ``[minimum, most]`` (not a bool), else ``ValueError`` naming the range and the value."""
    expected = expected or f"{name} must be an int in [{minimum}, {most}]"
    if _is_count(value, minimum) and value <= most:
        return int(value)
    raise ValueError(f"{expected}, got {value!r}")


def within(values: Tensor, low: int, high: int | None, name: str, context: str, high_name: str = "") -> Tensor:
    """``values`` (an int tensor) unless one lies outside ``[low, high)``: ``ValueError`` naming the range, ``context``
    (what sets it) and the values outside. ``high=None``: only ``low`` is checked (the bound, ``high_name``, is known
    later)."""
    outside = (values < low) if high is None else (values < low) | (values >= high)
    if bool(outside.any()):
        found = sorted(set(values[outside].tolist()))
        raise ValueError(f"{name} must lie in [{low}, {high_name or high}) ({context}), got {found}")
    return values


def nonempty_texts(texts: Sequence[str], what: str) -> None:
    """``ValueError`` naming the first empty text of ``texts`` (``what``: e.g. ``"clean prompt"``)."""
    for index, text in enumerate(texts):
        if isinstance(text, str) and not text:
            raise ValueError(
                f"{what} {index} is empty: a prompt needs at least one token of its own (an empty one would run on "
                "the BOS token alone, or on nothing)"
            )

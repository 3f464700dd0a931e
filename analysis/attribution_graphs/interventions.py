"""Transcoders in the running model: spliced in place of the MLPs, or editing their features (ablate, steer) and
then generating.

Both run the model's own forward with hooks on each layer's transcoder input (``reads``) and MLP output
(``writes``); whatever the blocks' architecture, the model does the rest. Unlike the replacement model
(``replacement``), nothing is frozen: attention, norms and later features recompute from the edited stream.

``splice_transcoders(model, transcoders, keep=...)``
    Every MLP output is the transcoders' reconstruction (no error term): what the CE loss of a set of
    transcoders measures. Positions where ``keep`` is False (the BOS, separators) keep the MLP's own output.
``edit_features(model, transcoders, edits)``
    Each MLP output is the model's own plus, for every ``FeatureEdit``, ``(new - a_f) W_dec[f, o - l]``: the
    feature's activation ``a_f`` (computed from this forward's MLP input) moved to ``new`` (``scale * a_f``, or a
    ``value``), at the edit's positions (every position when none are given). The transcoders' errors stay
    in the stream, so an edit that changes nothing leaves the model's output exactly as it was.
``generate_with_edits(model, transcoders, prompt, edits, ...)``
    ``model.generate`` with the edits applied at every step, re-running the whole sequence each step so that a
    position keeps its meaning (the edits hold at the generated positions too when they name no position).

Positions are checked where they meet a sequence: in ``[0, n_pos)``, or negative, counting from the end as in Python
(``-1``: the last token). ``edit_features`` checks them against each forward's sequence, ``generate_with_edits``
against the prompt (a negative position stays the prompt's, not the last generated token's). A position outside,
a layer or feature the transcoders do not have, or a non-finite ``scale``/``value`` raises ``ValueError`` naming
it, so an edit never silently changes nothing.
"""

import contextlib
import math
import numbers
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .transcoders import LayerTranscoder, transcoder_layers


@dataclass(frozen=True)
class FeatureEdit:
    """Feature ``feature`` of layer ``layer`` set to ``scale * a_f`` (``scale=0`` ablates) or to ``value`` (steering:
    a feature that is off can be turned on), at ``positions`` (all positions when None)."""

    layer: int
    feature: int
    scale: float | None = 0.0
    value: float | None = None
    positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("layer", "feature"):
            index = getattr(self, name)
            if isinstance(index, bool) or not isinstance(index, numbers.Integral):
                raise TypeError(f"a FeatureEdit's {name} must be an int >= 0, got {type(index).__name__} {index!r}")
            if index < 0:
                raise ValueError(f"a FeatureEdit's {name} must be an int >= 0, got {index}")
        if (self.scale is None) == (self.value is None):
            raise ValueError(
                f"a FeatureEdit sets exactly one of scale and value, got scale={self.scale}, value={self.value}"
            )
        name = "scale" if self.value is None else "value"
        number = getattr(self, name)
        if isinstance(number, bool) or not isinstance(number, numbers.Real):
            raise TypeError(f"a FeatureEdit's {name} must be a number, got {type(number).__name__} {number!r}")
        if not math.isfinite(number):
            raise ValueError(f"a FeatureEdit's {name} must be a finite number, got {number}")
        if self.positions is not None:
            if isinstance(self.positions, (str, bytes)) or not isinstance(self.positions, (tuple, list)):
                raise TypeError(
                    "a FeatureEdit's positions must be a tuple of ints (or None for every position), got "
                    f"{type(self.positions).__name__} {self.positions!r}"
                )
            if any(isinstance(p, bool) or not isinstance(p, numbers.Integral) for p in self.positions):
                raise TypeError(f"a FeatureEdit's positions must be ints, got {tuple(self.positions)!r}")
            if not self.positions:
                raise ValueError(
                    "a FeatureEdit's positions must name at least one position (an empty tuple would edit nothing); "
                    "give None for every position"
                )
            object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))

    def new_value(self, acts: Tensor) -> Tensor:
        return acts * self.scale if self.value is None else torch.full_like(acts, self.value)

    def at(self, n_pos: int, sequence: str = "sequence") -> tuple[int, ...]:
        """This edit's positions in a ``sequence`` of ``n_pos`` positions, negative ones counted from the end; a
        position outside raises ``ValueError`` naming it and the range."""
        if self.positions is None:
            return tuple(range(n_pos))
        outside = [p for p in self.positions if not -n_pos <= p < n_pos]
        if outside:
            raise ValueError(
                f"edit {self}: position {outside[0]} is outside the {sequence}'s {n_pos} positions (valid: "
                f"0..{n_pos - 1}, or -{n_pos}..-1 counting from the end)"
            )
        return tuple(p % n_pos for p in self.positions)


EDIT_PATTERN = re.compile(r"^L(\d+):F(\d+)(?:@(-?\d+(?:,-?\d+)*))?(?:=(-?[0-9.eE+-]+))?$")


def parse_feature_edit(text: str, *, steer: bool = False) -> FeatureEdit:
    """``"L12:F345"``, ``"L12:F345@5"`` or ``"L12:F345@4,5"`` as an ablation; with ``steer``, ``"L12:F345@5=8.0"`` sets
    the activation to 8.0 (``=VALUE`` is required, and finite). A negative position counts from the end (``@-1``)."""
    match = EDIT_PATTERN.match(text.strip())
    if match is None or (steer and match.group(4) is None) or (not steer and match.group(4) is not None):
        form = (
            "L<layer>:F<feature>[@<pos>[,<pos>...]]"
            + ("=<value>" if steer else "")
            + " (a <pos> < 0 counts from the end)"
        )
        raise ValueError(f"a feature {'steer' if steer else 'ablation'} is written {form}, got {text!r}")
    layer, feature, positions, value = match.groups()
    where = None if positions is None else tuple(int(p) for p in positions.split(","))
    if steer:
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"a feature steer is written L<layer>:F<feature>[@<pos>]=<value>, got {text!r}") from None
        return FeatureEdit(int(layer), int(feature), scale=None, value=number, positions=where)
    return FeatureEdit(int(layer), int(feature), positions=where)


def check_feature_edits(model, transcoders, edits: Sequence[FeatureEdit], n_pos: int) -> list[FeatureEdit]:
    """``edits`` checked against the transcoders (layer and feature ranges) and a prompt of ``n_pos`` positions, with
    their positions made non-negative (``-1``: the prompt's last); ``ValueError`` naming what is out of range."""
    edits = list(edits)
    _check_edits(transcoder_layers(model, transcoders), edits)
    return [edit if edit.positions is None else replace(edit, positions=edit.at(n_pos, "prompt")) for edit in edits]


def _check_edits(layers: list[LayerTranscoder], edits: Sequence[FeatureEdit]) -> None:
    for edit in edits:
        if not isinstance(edit, FeatureEdit):
            raise TypeError(f"edits must be FeatureEdit records, got {type(edit).__name__}")
        if not 0 <= edit.layer < len(layers):
            raise ValueError(f"edit {edit}: layer must be in [0, {len(layers)}), got {edit.layer}")
        if not 0 <= edit.feature < layers[edit.layer].d_transcoder:
            raise ValueError(
                f"edit {edit}: feature must be in [0, {layers[edit.layer].d_transcoder}) for layer {edit.layer}, "
                f"got {edit.feature}"
            )


def _hooks(layers: list[LayerTranscoder], out: Callable[[int, Tensor, dict], Tensor]) -> list[tuple[str, Callable]]:
    """Hooks keeping each layer's activations (by layer, in a dict shared by the forward) and replacing each MLP
    output ``o`` by ``out(o, mlp_out, acts)``."""
    acts: dict[int, Tensor] = {}

    def keep(layer: LayerTranscoder) -> Callable:
        def hook_fn(activation: Tensor, hook) -> Tensor:
            acts[layer.layer] = layer.encode(activation)
            return activation

        return hook_fn

    def write(layer: int) -> Callable:
        return lambda activation, hook: out(layer, activation, acts)

    hooks = []
    for layer in layers:
        hooks += [(layer.reads, keep(layer)), (layer.writes, write(layer.layer))]
    return hooks


def _writers(layers: list[LayerTranscoder], out_layer: int) -> Iterator[LayerTranscoder]:
    return (layer for layer in layers[: out_layer + 1] if out_layer in layer.out_layers)


@contextlib.contextmanager
def splice_transcoders(model, transcoders, keep: Tensor | None = None) -> Iterator[None]:
    """Every MLP output replaced by the transcoders' reconstruction (module docstring); ``keep [batch, pos]``: where
    False, the MLP's own output stays."""
    layers = transcoder_layers(model, transcoders)

    def out(o: int, mlp_out: Tensor, acts: dict) -> Tensor:
        recon = layers[o].b_dec.expand_as(mlp_out)
        for layer in _writers(layers, o):
            recon = recon + acts[layer.layer] @ layer.decoders[:, o - layer.layer]
        return recon if keep is None else torch.where(keep[..., None], recon, mlp_out)

    with model.hooks(_hooks(layers, out)):
        yield


@contextlib.contextmanager
def edit_features(model, transcoders, edits: Sequence[FeatureEdit]) -> Iterator[None]:
    """The model with ``edits`` applied to its transcoders' features (module docstring)."""
    layers = transcoder_layers(model, transcoders)
    edits = list(edits)
    _check_edits(layers, edits)

    def out(o: int, mlp_out: Tensor, acts: dict) -> Tensor:
        delta = torch.zeros_like(mlp_out)
        for edit in edits:
            layer = layers[edit.layer]
            if o not in layer.out_layers:
                continue
            a = acts[edit.layer][..., edit.feature]
            change = edit.new_value(a) - a
            if edit.positions is not None:
                where = torch.zeros(change.shape[-1], dtype=torch.bool, device=change.device)
                where[list(edit.at(change.shape[-1]))] = True
                change = change * where
            delta = delta + change[..., None] * layer.decoders[edit.feature, o - edit.layer]
        return mlp_out + delta

    with model.hooks(_hooks(layers, out)):
        yield


@torch.no_grad()
def generate_with_edits(model, transcoders, prompt, edits: Sequence[FeatureEdit], max_new_tokens: int = 20, **kwargs):
    """``model.generate(prompt, ...)`` under ``edit_features`` (greedy unless ``temperature`` is given), the whole
    sequence re-run at each step (no key/value cache), so prompt positions keep their meaning: positions are checked
    against the prompt, and a negative one is the prompt's (``-1``: its last token), not the last generated one."""
    from interp_transformer.text.generate import _prompt_tokens

    kwargs.setdefault("temperature", 0.0)
    tokens = _prompt_tokens(model, prompt, kwargs.get("prepend_bos", True), kwargs.get("attention_mask"))[0]
    edits = check_feature_edits(model, transcoders, edits, tokens.shape[-1])
    with edit_features(model, transcoders, edits):
        return model.generate(prompt, max_new_tokens=max_new_tokens, use_kv_cache=False, **kwargs)


__all__ = [
    "FeatureEdit",
    "check_feature_edits",
    "edit_features",
    "generate_with_edits",
    "parse_feature_edit",
    "splice_transcoders",
]

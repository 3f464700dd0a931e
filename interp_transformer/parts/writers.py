"""What each block adds to the residual stream, as records the tools read instead of a family's name.

A block lists the steps its residual stream takes, in forward order (``block.stream()``):

- a ``Writer`` for each part whose output is added to the stream (attention, cross-attention,
  an MLP, a mixture of experts);
- a ``StreamNorm`` for each norm that renormalizes the stream itself (a post-norm block's
  ``ln1``/``ln2``).

A ``Writer`` says what a tool needs to split that write exactly:

=================  =====================================================================
``sublayer``       its label: ``"attn"``, ``"cross_attn"``, ``"mlp"``
``part``           the module that writes (its weights)
``output``         the hook holding what is added to the stream (``hook_attn_out``, ...)
``output_norm``    the norm its output passes through before the stream (Gemma 2's
                   ``ln1_post``), or None. With that norm's cached scale frozen, the write is
                   affine in the part's output again
``reads_source``   it attends to another stack's output (an encoder-decoder's cross-attention)
``units``          the part's output as a sum over units: heads (``z_h W_O[h]``) or neurons
                   (``post_n W_out[n]``); None for a mixture of experts (its neurons belong
                   to one expert each)
``bias_write``     what the part's biases write: ``b_O``, ``b_out``, or a mixture's chosen
                   experts' ``b_out`` times their routing weights (read from the cache)
=================  =====================================================================

The part supplies its own share through three methods: ``write_units()``, ``bias_hooks()``
and ``bias_write(at)``, plus the class attribute ``routes_tokens`` (True for a mixture of
experts). A family that brings a new kind of writer implements those on its part and lists
it in its block's ``stream()``: direct logit attribution, ``decompose_resid``,
``stack_head_results`` and the report then read it without an edit.

``direct_path`` is the one walk every attribution uses: it runs the stream backwards from a
direction read at the end (a logit direction pulled back through the final norm, or a
hidden-state direction), pulling the direction back through every frozen norm on the way, and
reads each writer's contribution along it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn

Reader = Callable[[str], Tensor]  # a cached activation by hook name, at the positions being attributed


@dataclass(frozen=True)
class Units:
    """A write as a sum over units: ``sum_u acts[..., u] * weight[u]``.

    ``kind`` ``"head"``: ``acts`` is ``hook_z`` ``[..., head_index, d_head]`` and ``weight`` is
    ``W_O [head_index, d_head, d_model]``. ``kind`` ``"neuron"``: ``acts`` is ``hook_post``
    ``[..., d_mlp]`` and ``weight`` is ``W_out [d_mlp, d_model]``. ``letter`` labels a unit
    (``"L0H3"``, ``"L0N5"``, ``"L0C3"`` for a cross-attention head).
    """

    kind: str
    hook: str
    weight: Tensor
    letter: str

    def writes(self, acts: Tensor) -> Float[Tensor, "... unit d_model"]:
        """Each unit's write to the stream (before any output norm)."""
        if self.kind == "head":
            return einops.einsum(
                acts, self.weight, "... head_index d_head, head_index d_head d_model -> ... head_index d_model"
            )
        return acts[..., None] * self.weight

    def read(self, acts: Tensor, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "unit ..."]:
        """Each unit's write read along ``direction``, never forming ``[..., unit, d_model]``: ``[unit, ...]``."""
        if self.kind == "head":
            weight_d = einops.einsum(
                self.weight, direction, "head_index d_head d_model, ... d_model -> ... head_index d_head"
            )
            terms = (acts * weight_d).sum(dim=-1)
        else:
            terms = acts * einops.einsum(self.weight, direction, "d_mlp d_model, ... d_model -> ... d_mlp")
        return terms.movedim(-1, 0)


# A part read through the methods and hook points it has (write_units, bias_write, hook_scale, ...): torch types a
# module's attributes as `Tensor | Module`, so parts are held untyped
Part = Any


@dataclass(frozen=True)
class Writer:
    """One part that adds to the residual stream (see the module docstring)."""

    sublayer: str
    part: Part
    output: str
    output_norm: Part | None = None
    reads_source: bool = False  # cross-attention: its keys and values come from another stack's output

    @property
    def units(self) -> Units | None:
        return self.part.write_units()

    @property
    def routes_tokens(self) -> bool:
        return self.part.routes_tokens

    @property
    def scale_hook(self) -> str | None:
        """The hook of ``output_norm``'s scale, or None without an output norm."""
        return None if self.output_norm is None else self.output_norm.hook_scale.name

    def bias_hooks(self) -> list[str]:
        return self.part.bias_hooks()

    def bias_write(self, at: Reader) -> Tensor:
        """What the part's biases write (``[d_model]``, or ``[..., d_model]`` where routing picks them)."""
        return self.part.bias_write(at)

    def to_stream(self, written: Tensor, scale: Tensor | None) -> Tensor:
        """What ``written`` (part of the part's output) adds to the stream: through ``output_norm``, scale frozen."""
        return written if self.output_norm is None else self.output_norm.apply_frozen(written, scale)

    def pull_back(self, direction: Tensor, at: Reader) -> tuple[Tensor, Tensor]:
        """``(direction the part's output is read along, output norm's bias term)`` for a stream direction."""
        if self.output_norm is None:
            return direction, direction.new_zeros(direction.shape[:-1])
        pulled = self.output_norm.pull_back(direction, at(self.output_norm.hook_scale.name))  # the scale_hook
        return pulled, self.output_norm.bias_term(direction)


@dataclass(frozen=True)
class StreamNorm:
    """A norm that renormalizes the residual stream itself inside a block (post-norm ``ln1``, ``ln2``); ``reads`` is
    the hook holding the stream it normalizes."""

    name: str
    norm: Part
    reads: str | None = None

    @property
    def scale_hook(self) -> str:
        return self.norm.hook_scale.name


Step = Writer | StreamNorm


class StreamBlock(nn.Module):
    """A block that lists its residual-stream steps (``stream()``); ``writers()`` are its ``Writer`` steps."""

    # where the entry check finds this part's sizes (core.shape_checks)
    axis_sizes = {"d_model": "attn.W_O[-1]", "n_key_value_heads": "attn.n_key_value_heads", "d_head": "attn.d_head"}

    def stream(self) -> list[Step]:
        raise NotImplementedError(f"{type(self).__name__} must list its residual-stream steps in stream()")

    def writers(self) -> list[Writer]:
        """The parts whose outputs are added to the residual stream, in forward order."""
        return [step for step in self.stream() if isinstance(step, Writer)]

    def writer(self, sublayer: str) -> Writer | None:
        """The writer labelled ``sublayer`` (``"attn"``, ``"mlp"``, ...), or None if the block has none."""
        return next((writer for writer in self.writers() if writer.sublayer == sublayer), None)


class HeadWrites:
    """The writer methods of an attention part: its output is ``sum_h z_h W_O[h] + b_O``."""

    if TYPE_CHECKING:  # a mixin of the part class: it reads that class's attributes

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    routes_tokens = False
    # where the entry check finds the part's sizes (core.shape_checks)
    axis_sizes = {"d_model": "W_O[-1]", "n_key_value_heads": "n_key_value_heads", "d_head": "d_head"}

    def write_units(self) -> Units:
        """Heads; a cross-attention's (keys and values from the source) are lettered ``C``."""
        return Units("head", self.hook_z.name, self.W_O, "C" if self.reads_kv_input else "H")

    def bias_hooks(self) -> list[str]:
        return []

    def bias_write(self, at: Reader) -> Tensor:
        return self.b_O


class NeuronWrites:
    """The writer methods of an MLP part: its output is ``sum_n post_n W_out[n] + b_out``."""

    if TYPE_CHECKING:  # a mixin of the part class: it reads that class's attributes

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    routes_tokens = False
    axis_sizes = {"d_model": "W_in[0]"}  # where the entry check finds the part's sizes (core.shape_checks)

    def write_units(self) -> Units:
        return Units("neuron", self.hook_post.name, self.W_out, "N")

    def bias_hooks(self) -> list[str]:
        return []

    def bias_write(self, at: Reader) -> Tensor:
        return self.b_out


@dataclass
class WriterTerms:
    """One writer's contributions along a direction: each ``[*where]``, ``units`` ``[unit, *where]``.

    ``whole`` is the write read as the stream gets it; ``bias`` the part's biases (read
    through the output norm); ``norm_bias`` the output norm's bias (0 without one). With
    ``units`` split, ``whole = units.sum(0) + bias + norm_bias``; otherwise ``whole`` is read
    from the output hook.
    """

    writer: Writer
    whole: Tensor
    bias: Tensor
    norm_bias: Tensor
    units: Tensor | None = None


@dataclass
class LayerTerms:
    """A block's terms: its writers' (forward order) and its stream norms' bias terms (by norm name)."""

    writers: list[WriterTerms]
    norm_biases: dict[str, Tensor]

    def of(self, sublayer: str) -> WriterTerms | None:
        return next((terms for terms in self.writers if terms.writer.sublayer == sublayer), None)


def split_units(writer: Writer, neurons: bool) -> bool:
    """Whether the walk splits ``writer`` into its units: heads always, neurons when asked for."""
    units = writer.units
    return units is not None and (units.kind == "head" or neurons)


def direct_path_hooks(blocks, neurons: bool = False) -> list[str]:
    """The hooks ``direct_path`` reads for these blocks."""
    names = []
    for block in blocks:
        for step in block.stream():
            if isinstance(step, StreamNorm):
                names.append(step.scale_hook)
                continue
            split = split_units(step, neurons)
            if split:
                names.append(step.units.hook)
            if not split or step.units.kind == "neuron":  # a split MLP is still read whole from its output
                names.append(step.output)
            names += step.bias_hooks() + ([step.scale_hook] if step.output_norm is not None else [])
    return names


def read_along(vectors: Tensor, direction: Tensor) -> Tensor:
    """``vectors . direction`` over ``d_model``."""
    return (vectors * direction).sum(dim=-1)


def direct_path(
    blocks, direction: Float[Tensor, "... d_model"], at: Reader, neurons: bool = False
) -> tuple[list[LayerTerms], Tensor]:
    """Every writer's direct contribution along ``direction``, read at the end of ``blocks``.

    Walks the stream backwards: a ``StreamNorm`` adds its bias term and pulls the direction
    back through its frozen scale; a ``Writer`` is read along the direction (through its own
    output norm). Returns the terms per block (in block order) and the direction as it reads
    the stream entering the first block (for the embeddings). The terms plus the embeddings
    read along that direction sum to ``stream_end . direction`` exactly (up to rounding).
    """
    layers = []
    for block in reversed(list(blocks)):
        terms, norm_biases = [], {}
        for step in reversed(block.stream()):
            if isinstance(step, StreamNorm):
                norm_biases[step.name] = step.norm.bias_term(direction)
                direction = step.norm.pull_back(direction, at(step.scale_hook))
                continue
            terms.append(_writer_terms(step, direction, at, neurons))
        layers.append(LayerTerms(terms[::-1], norm_biases))
    return layers[::-1], direction


def _writer_terms(writer: Writer, direction: Tensor, at: Reader, neurons: bool) -> WriterTerms:
    inner, norm_bias = writer.pull_back(direction, at)
    bias = read_along(writer.bias_write(at), inner)
    bias = bias.expand(norm_bias.shape) if bias.ndim < norm_bias.ndim else bias
    spec = writer.units
    if spec is None or not split_units(writer, neurons):
        return WriterTerms(writer, read_along(at(writer.output), direction), bias, norm_bias)
    units = spec.read(at(spec.hook), inner)
    whole = read_along(at(writer.output), direction) if spec.kind == "neuron" else None
    if whole is None:
        whole = units.sum(dim=0) + bias + norm_bias
    return WriterTerms(writer, whole, bias, norm_bias, units)


def stack_terms(layers: list[LayerTerms], sublayer: str, field: str) -> Tensor | None:
    """One field of one sublayer's terms stacked over the blocks that have it: ``[layer, ...]`` (None if none)."""
    values = [getattr(terms, field) for layer in layers if (terms := layer.of(sublayer)) is not None]
    values = [value for value in values if value is not None]
    return torch.stack(values) if values else None


__all__ = [
    "HeadWrites",
    "LayerTerms",
    "NeuronWrites",
    "Reader",
    "Step",
    "StreamBlock",
    "StreamNorm",
    "Units",
    "Writer",
    "WriterTerms",
    "direct_path",
    "direct_path_hooks",
    "read_along",
    "split_units",
    "stack_terms",
]

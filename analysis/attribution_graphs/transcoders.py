"""What the replacement model needs of the transcoders: per layer, how features read the MLP input and write outputs.

Two kinds of transcoders replace a model's MLPs:

- one ``SAE`` per layer (``interp_transformer.sae``, SAELens' format), reading the MLP's input and
  writing its output: the ``transcoder``, ``skip_transcoder``, ``jumprelu_transcoder`` and
  ``jumprelu_skip_transcoder`` architectures, and a ``topk`` (or ``abstopk``) SAE whose config names
  ``hook_name_out`` and has ``apply_b_dec_to_input`` false, which is a TopK transcoder (SAELens has no
  TopK transcoder architecture of its own);
- one ``CrossLayerTranscoder`` (``clt``), whose layer-``l`` features write to MLP outputs ``l`` and later.

Either becomes a list of ``LayerTranscoder`` records, one per layer. A layer's features read the
MLP's input (``blocks.L.ln2.hook_normalized``, the norm the MLP reads through) or the residual
stream where the MLP reads it (``blocks.L.hook_resid_mid``; ``hook_resid_pre`` in a parallel block),
and replace the MLP's write to the stream (``blocks.L.hook_mlp_out``: under an output norm, as in
Gemma 2/3, the norm's output). Each is asked of the model's blocks, never of the family's name.

The model must be processed as the transcoders expect (``interp_transformer.sae.processing``): one reading
``hook_normalized`` needs ``fold_ln`` (``ProcessingMismatch`` otherwise, naming the step to apply first).

Refused, each with a ``ValueError``/``TypeError`` naming what was expected and what came: a layer
without a transcoder, hooks other than those above, widths or dtypes that differ from the model's,
non-finite weights, and SAE settings under which a feature's activation is not its pre-activation
(input normalization other than none, ``rescale_acts_by_decoder_norm``, a ``hook_head_index``).
"""

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

from torch import Tensor, nn

from interp_transformer.core.strict import check_finite
from interp_transformer.parts.writers import StreamNorm
from interp_transformer.sae import SAE
from interp_transformer.sae.processing import ProcessingMismatch, check_processing

from .clt import CrossLayerTranscoder

# SAE architectures whose features are a transcoder's: their activation is their pre-activation where non-zero
TRANSCODER_ARCHITECTURES = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")
TOP_K_ARCHITECTURES = ("topk", "abstopk")  # transcoders when their config names hook_name_out
NORMALIZATIONS = ("none", "expected_average_only_in")  # the identity at inference (see sae.normalization)


@dataclass(frozen=True)
class MLPSlot:
    """Where layer ``layer``'s MLP reads and writes: the hooks a transcoder may read, and the one it replaces."""

    layer: int
    inputs: tuple[str, ...]  # the MLP's input (its norm's output), then the stream it reads (before that norm)
    output: str  # what the MLP adds to the stream
    part: nn.Module  # the module in the MLP slot


@dataclass(frozen=True)
class LayerTranscoder:
    """The features reading layer ``layer``'s MLP input.

    ``acts = encode(x)`` are their activations (exactly as the transcoder computes them), and where a
    feature is active its activation equals its pre-activation ``x W_enc + b_enc``. Feature ``f`` writes
    ``acts_f decoders[f, j]`` to the MLP output of layer ``layer + j``; MLP output ``layer`` also gets
    ``b_dec`` and, for a skip transcoder, ``x W_skip^T`` (``skip`` holds ``W_skip^T [d_model, d_model]``).
    """

    layer: int
    reads: str
    writes: str
    encode: Callable[[Tensor], Tensor]  # [pos, d_model] -> [pos, d_transcoder]
    W_enc: Tensor  # [d_model, d_transcoder]
    b_enc: Tensor  # [d_transcoder]
    decoders: Tensor  # [d_transcoder, n_out, d_model]
    b_dec: Tensor  # [d_model]
    skip: Tensor | None = None
    name: str = ""  # how errors and exports name the transcoder

    @property
    def d_transcoder(self) -> int:
        return self.W_enc.shape[1]

    @property
    def out_layers(self) -> range:
        """The MLP outputs this layer's features write to."""
        return range(self.layer, self.layer + self.decoders.shape[1])

    def pre(self, x: Tensor) -> Tensor:
        """``x W_enc + b_enc``: the features' pre-activations."""
        return x @ self.W_enc + self.b_enc

    def skip_term(self, x: Tensor) -> Tensor | None:
        return None if self.skip is None else x @ self.skip

    def parameters(self) -> dict[str, Tensor]:
        """The tensors the graph reads, by name (for the finiteness check)."""
        found = {"W_enc": self.W_enc, "b_enc": self.b_enc, "W_dec": self.decoders, "b_dec": self.b_dec}
        return found if self.skip is None else {**found, "W_skip": self.skip}


def _stream_before_mlp(model, layer: int) -> str:
    """``hook_resid_mid`` of ``layer``, or ``hook_resid_pre`` where the block has none (a parallel block's MLP reads
    the stream entering it)."""
    try:
        mid = model.act_name("resid_mid", layer)
    except KeyError:  # the model's table has no resid_mid at all
        mid = None
    return mid if mid in model.hook_dict else model.act_name("resid_pre", layer)


def mlp_slots(model) -> list[MLPSlot]:
    """Each layer's ``MLPSlot``, asked of the blocks: their MLP writer, the norm the MLP reads through
    (``norm_readers()``), and the stream where it reads: the output of the last stream norm before it (post-norm),
    else ``hook_resid_mid`` (``hook_resid_pre`` in a parallel block, whose MLP reads the stream entering it)."""
    if model.writers_that("reads_source"):
        raise ValueError("attribution graphs run on decoders; an encoder-decoder's cross-attention is not supported")
    slots = []
    for layer, block in enumerate(model.blocks):
        writer = block.writer("mlp")
        if writer is None:
            raise ValueError(f"block {layer} has no MLP: attribution graphs replace every MLP by a transcoder")
        readers = block.norm_readers() if hasattr(block, "norm_readers") else []
        norm = next((norm for norm, part in readers if part is writer.part), None)
        steps = block.stream()
        before = [step for step in steps[: steps.index(writer)] if isinstance(step, StreamNorm)]
        stream = before[-1].norm.hook_normalized.name if before else _stream_before_mlp(model, layer)
        # a norm with no output hook (NoNorm) hands the MLP the stream itself
        normalized = getattr(norm, "hook_normalized", None)
        inputs = ((normalized.name,) if normalized is not None else ()) + (stream,)
        slots.append(MLPSlot(layer, inputs, writer.output, writer.part))
    return slots


def transcoder_layers(model, transcoders) -> list[LayerTranscoder]:
    """One ``LayerTranscoder`` per layer of ``model``, from a ``CrossLayerTranscoder`` or one SAE per layer (a list in
    layer order, or a dict ``{layer: sae}``), checked against the model (module docstring).

    The model must be processed as the transcoders were trained (``interp_transformer.sae.processing``: a
    transcoder reading ``hook_normalized`` needs ``fold_ln``); a cross-layer transcoder, whose layout records no
    model, counts as trained on the unprocessed model. A mismatch raises ``ProcessingMismatch``: the analysis
    never changes the model, so the caller applies the step.
    """
    slots = mlp_slots(model)
    n_layers = len(slots)
    dtype = model.W_E.dtype
    if isinstance(transcoders, CrossLayerTranscoder):
        layers = _clt_layers(model, transcoders, slots)
        for layer in layers:  # as an SAE with no model_from_pretrained_kwargs would be checked
            cfg = SimpleNamespace(model_from_pretrained_kwargs={})
            _check_processing(model, SimpleNamespace(hook_name=layer.reads, hook_name_out=layer.writes, cfg=cfg))
    else:
        if isinstance(transcoders, Mapping):
            by_layer = dict(transcoders)
        elif isinstance(transcoders, Sequence) and not isinstance(transcoders, (str, bytes)):
            by_layer = dict(enumerate(transcoders))
        else:
            raise TypeError(
                "transcoders must be a CrossLayerTranscoder, a list of one SAE per layer, or a dict {layer: SAE}; "
                f"got {type(transcoders).__name__}"
            )
        if set(by_layer) != set(range(n_layers)):
            missing = sorted(set(range(n_layers)) - set(by_layer))
            extra = sorted(set(by_layer) - set(range(n_layers)), key=str)
            raise ValueError(
                f"attribution graphs need one transcoder for each of the model's {n_layers} layers "
                f"(0..{n_layers - 1}); missing layers {missing}, unexpected keys {extra}"
            )
        layers = [_sae_layer(by_layer[layer], slot, model.cfg.d_model) for layer, slot in enumerate(slots)]
        for layer in range(n_layers):
            _check_processing(model, by_layer[layer])
    for layer in layers:
        for name, tensor in layer.parameters().items():
            if tensor.dtype != dtype:
                raise TypeError(
                    f"{layer.name} holds {name} in {tensor.dtype}; the model runs in {dtype}: convert one of them "
                    "(e.g. sae.to(model.W_E.dtype))"
                )
            check_finite(name, tensor.detach(), layer.name)
    return layers


def _check_processing(model, transcoder) -> None:
    """``ProcessingMismatch`` unless ``model`` is processed as ``transcoder`` expects; it names the step to apply."""
    try:
        check_processing(model, transcoder)
    except ProcessingMismatch as error:  # the splice may apply a step for its caller; an analysis never does
        message = str(error).replace(", or pass apply_processing=True", "")
        raise ProcessingMismatch(f"{message} (an attribution graph reads the model and never changes it)") from None


def _check_hooks(what: str, reads: str | None, writes: str | None, slot: MLPSlot) -> None:
    if reads not in slot.inputs:
        raise ValueError(
            f"{what} reads {reads!r}; layer {slot.layer}'s MLP reads {slot.inputs[0]!r}"
            + (f" (the stream before its norm: {slot.inputs[-1]!r})" if len(slot.inputs) > 1 else "")
            + ": a transcoder must read one of these"
        )
    if writes != slot.output:
        raise ValueError(f"{what} writes {writes!r}; layer {slot.layer}'s MLP writes {slot.output!r}")


def _check_width(what: str, field: str, value: int, d_model: int) -> None:
    if value != d_model:
        raise ValueError(f"{what} has {field}={value}; the model's MLPs read and write d_model={d_model}")


def _sae_layer(sae, slot: MLPSlot, d_model: int) -> LayerTranscoder:
    what = f"the transcoder of layer {slot.layer}"
    if not isinstance(sae, SAE):
        raise TypeError(f"{what} must be an interp_transformer.sae.SAE, got {type(sae).__name__}")
    cfg = sae.cfg
    top_k = cfg.architecture in TOP_K_ARCHITECTURES and cfg.hook_name_out is not None
    if cfg.architecture not in TRANSCODER_ARCHITECTURES and not top_k:
        raise ValueError(
            f"{what} is a {cfg.architecture!r} SAE; a transcoder is one of {list(TRANSCODER_ARCHITECTURES)}, or a "
            f"{' or '.join(TOP_K_ARCHITECTURES)} SAE whose config names hook_name_out"
        )
    if cfg.apply_b_dec_to_input:
        raise ValueError(
            f"{what} has apply_b_dec_to_input=True; a transcoder's b_dec lives in its output, expected False"
        )
    if cfg.normalize_activations not in NORMALIZATIONS:
        raise ValueError(
            f"{what} has normalize_activations={cfg.normalize_activations!r}; expected one of {list(NORMALIZATIONS)} "
            "(an input normalization makes a feature's activation non-linear in the stream)"
        )
    if cfg.rescale_acts_by_decoder_norm:
        raise ValueError(f"{what} has rescale_acts_by_decoder_norm=True; expected False")
    if cfg.hook_head_index is not None:
        raise ValueError(
            f"{what} has hook_head_index={cfg.hook_head_index}; expected None (it reads the whole MLP input)"
        )
    _check_hooks(what, cfg.hook_name, cfg.hook_name_out, slot)
    _check_width(what, "d_in", cfg.d_in, d_model)
    _check_width(what, "d_out", cfg.d_out, d_model)
    skip = sae.W_skip.T if "W_skip" in sae.arch.parameters else None

    def encode(x: Tensor) -> Tensor:
        return sae.encode_with_state(x, hooked=False)[0].detach()

    return LayerTranscoder(
        slot.layer,
        cfg.hook_name,
        cfg.hook_name_out,
        encode,
        sae.W_enc.detach(),
        sae.b_enc.detach(),
        sae.W_dec.detach()[:, None],
        sae.b_dec.detach(),
        None if skip is None else skip.detach(),
        what,
    )


def block_hook(model, layer: int, relative: str, what: str) -> str:
    """The full name of the hook point at ``relative`` (``"ln2.hook_normalized"``) inside block ``layer``."""
    try:
        hook = model.blocks[layer].get_submodule(relative)
    except AttributeError:
        hook = None
    if hook is None or not hasattr(hook, "add_hook"):
        inside = [name for name, module in model.blocks[layer].named_modules() if hasattr(module, "add_hook")]
        close = difflib.get_close_matches(relative, inside, n=3, cutoff=0.4)
        raise ValueError(f"{what} names {relative!r}, which is no hook point of block {layer}; closest: {close}")
    return hook.name


def relative_hook_name(model, layer: int, name: str, what: str) -> str:
    """``name``'s path inside block ``layer`` (``"blocks.3.ln2.hook_normalized"`` -> ``"ln2.hook_normalized"``), asked
    of the block's hook points; ``ValueError`` naming ``what`` when it is none of them."""
    for relative, module in model.blocks[layer].named_modules():
        if hasattr(module, "add_hook") and getattr(module, "name", None) == name:
            return relative
    raise ValueError(f"{what} must be a hook point of block {layer}, got {name!r}")


def _clt_layers(model, clt: CrossLayerTranscoder, slots: list[MLPSlot]) -> list[LayerTranscoder]:
    cfg = clt.cfg
    if cfg.n_layers != len(slots):
        raise ValueError(f"the cross-layer transcoder has n_layers={cfg.n_layers}; the model has {len(slots)} layers")
    _check_width("the cross-layer transcoder", "d_model", cfg.d_model, model.cfg.d_model)
    layers = []
    for slot in slots:
        what = f"the cross-layer transcoder's layer {slot.layer}"
        reads = block_hook(model, slot.layer, cfg.input_hook, what)
        _check_hooks(what, reads, block_hook(model, slot.layer, cfg.output_hook, what), slot)
        layer = slot.layer
        layers.append(
            LayerTranscoder(
                layer,
                reads,
                slot.output,
                lambda x, layer=layer: clt.encode_layer(layer, x),
                clt.W_enc[layer].detach().T,
                clt.b_enc[layer].detach(),
                clt.W_dec[layer].detach(),
                clt.b_dec[layer].detach(),
                None,
                what,
            )
        )
    return layers


def random_transcoders(
    model,
    d_transcoder: int,
    *,
    architecture: str = "jumprelu_transcoder",
    k: int | None = None,
    reads: str = "input",
    seed: int = 0,
    threshold: float = 0.0,
) -> list:
    """One transcoder ``SAE`` per layer with random weights: untrained, for tests, examples and timing.

    ``architecture`` is one of ``TRANSCODER_ARCHITECTURES`` or ``"topk"`` (then ``k`` features per position);
    ``reads`` is ``"input"`` (the MLP's input) or ``"stream"`` (the stream before the MLP's norm). Encoders are
    ``N(0, 1/d_model)``, decoders ``N(0, 1/d_transcoder)``; JumpReLU thresholds are ``threshold``.
    """
    import torch

    if reads not in ("input", "stream"):
        raise ValueError(f"reads must be 'input' or 'stream', got {reads!r}")
    d_model, dtype = model.cfg.d_model, model.W_E.dtype
    g = torch.Generator().manual_seed(seed)
    saes = []
    for slot in mlp_slots(model):
        metadata = {"hook_name": slot.inputs[0] if reads == "input" else slot.inputs[-1], "hook_name_out": slot.output}
        cfg = {
            "architecture": architecture,
            "d_in": d_model,
            "d_sae": d_transcoder,
            "d_out": d_model,
            "apply_b_dec_to_input": False,
            "metadata": metadata,
            "dtype": str(dtype).replace("torch.", ""),
        }
        if architecture == "topk":
            cfg["k"] = k
        tensors = {
            "W_enc": torch.randn(d_model, d_transcoder, generator=g, dtype=torch.float64) / d_model**0.5,
            "b_enc": 0.1 * torch.randn(d_transcoder, generator=g, dtype=torch.float64),
            "W_dec": torch.randn(d_transcoder, d_model, generator=g, dtype=torch.float64) / d_transcoder**0.5,
            "b_dec": 0.1 * torch.randn(d_model, generator=g, dtype=torch.float64),
        }
        if "skip" in architecture:
            tensors["W_skip"] = 0.1 * torch.randn(d_model, d_model, generator=g, dtype=torch.float64) / d_model**0.5
        if "jumprelu" in architecture:
            tensors["threshold"] = torch.full((d_transcoder,), float(threshold), dtype=torch.float64)
        saes.append(SAE.from_dict(cfg, {name: t.to(dtype) for name, t in tensors.items()}))
    return saes


__all__ = [
    "LayerTranscoder",
    "MLPSlot",
    "TRANSCODER_ARCHITECTURES",
    "block_hook",
    "mlp_slots",
    "random_transcoders",
    "relative_hook_name",
    "transcoder_layers",
]

"""What every encoder-decoder architecture shares: its parts, its config checks and its hook-name table.

An encoder-decoder (``EncoderDecoderTransformer``) is two stacks and a read-out around one
token embedding::

    encoder_out = encoder(embed(source))                  bidirectional, source padding masked
    logits      = unembed(decoder(embed(target), encoder_out))   causal; cross-attention reads encoder_out

Each architecture module (``t5``, ``bart``, ``marian``, ``seq2seq``) picks the parts of each
stack (``StackParts``) and returns ``EncoderDecoderParts`` from its ``build``.

Hook names carry their stack: ``encoder.blocks.L...``, ``decoder.blocks.L...`` and, for
cross-attention, ``decoder.blocks.L.cross_attn.hook_q/k/v/attn_scores/pattern/z``,
``decoder.blocks.L.hook_cross_attn_out`` and ``decoder.blocks.L.hook_resid_mid_cross``
(TransformerLens' ``HookedEncoderDecoder`` names, under ``blocks``). Short keys say the
stack too, so nothing is guessed (``EncoderDecoderHookNames``):

=========================================  ================================================
``("pattern", 0, "encoder")``              ``encoder.blocks.0.attn.hook_pattern``
``("pattern", 0, "decoder")``              ``decoder.blocks.0.attn.hook_pattern`` (self-attention)
``("pattern", 0, "cross")``                ``decoder.blocks.0.cross_attn.hook_pattern``
``("attn_out", 0, "cross")``               ``decoder.blocks.0.hook_cross_attn_out``
``("resid_mid", 0, "cross")``              ``decoder.blocks.0.hook_resid_mid_cross``
``("normalized", 0, "decoder.ln2")``       ``decoder.blocks.0.ln2.hook_normalized``
``("embed", "decoder")``                   ``decoder.hook_embed``
``("normalized", "encoder")``              ``encoder.ln_final.hook_normalized``
``("rel_pos_bias", "encoder")``            ``encoder.rel_pos_bias.hook_bias`` (T5)
=========================================  ================================================
"""

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import nn

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.validation import validate_common_fields
from interp_transformer.hooks.names import ALIASES, BLOCK_HOOKS

STACKS = ("encoder", "decoder")
CROSS = "cross"
ENCODER_NORMS = ("ln1", "ln2")
DECODER_NORMS = ("ln1", "ln2", "ln3")  # self-attention, cross-attention, MLP (TransformerLens' order)
NORM_KEYS = ("scale", "normalized")


@dataclass(frozen=True)
class StackParts:
    """The parts of one stack, in forward order. ``pos_embed``, ``embed_ln`` and ``rel_pos_bias`` may be None;
    ``ln_final`` is ``NoNorm`` when the stack ends in its last block's own norm (post-norm)."""

    pos_embed: nn.Module | None
    embed_ln: nn.Module | None
    rel_pos_bias: nn.Module | None
    blocks: list
    ln_final: nn.Module


@dataclass(frozen=True)
class EncoderDecoderParts:
    """What ``EncoderDecoderTransformer`` composes: the token embedding (both stacks read it, unless
    ``decoder_embed`` gives the target its own), two stacks, the read-out."""

    embed: nn.Module
    encoder: StackParts
    decoder: StackParts
    unembed: nn.Module
    decoder_embed: nn.Module | None = None  # the target's own token embedding (None: the decoder reads ``embed``)


def validate_encoder_decoder_fields(cfg) -> None:
    """Checks every encoder-decoder config shares: sizes, special token ids inside the vocabulary, a name."""
    validate_common_fields(
        cfg, ("d_model", "n_layers", "n_decoder_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")
    )
    for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < cfg.d_vocab:
            raise ValueError(f"{name} must be a token id in [0, d_vocab={cfg.d_vocab}), got {value!r}")
    if not isinstance(cfg.name, str):
        raise TypeError(f"name must be a str, got {type(cfg.name).__name__}")


def encoder_decoder_capabilities(norm_placement: str, final_norm: bool, embedding_norm: bool) -> Capabilities:
    """The facts of an encoder-decoder: the existing fields describe the decoder, the stack the logits come from."""
    return Capabilities(
        causal=True,
        norm_placement=norm_placement,
        final_norm="decoder.ln_final" if final_norm else None,
        read_out="unembed",
        next_token_logits=True,
        embedding_norm="decoder.embed_ln" if embedding_norm else None,
    )


def _stack_templates(stack: str, post_norm: bool) -> dict[str, str]:
    keys = {name: template.replace("blocks.", f"{stack}.blocks.", 1) for name, template in BLOCK_HOOKS.items()}
    if post_norm:
        keys["normalized_resid_post"] = f"{stack}.blocks.{{layer}}.hook_normalized_resid_post"
    return keys


def _cross_templates() -> dict[str, str]:
    attn = ("q", "k", "v", "z", "attn_scores", "pattern")
    keys = {name: f"decoder.blocks.{{layer}}.cross_attn.hook_{name}" for name in attn}
    keys["attn_out"] = "decoder.blocks.{layer}.hook_cross_attn_out"
    keys["resid_mid"] = "decoder.blocks.{layer}.hook_resid_mid_cross"
    return keys


def _global_templates(
    stack: str, pos_embed: bool, rel_pos_bias: bool, embed_ln: bool, final_norm: bool
) -> dict[str, str]:
    keys = {"embed": f"{stack}.hook_embed"}
    if pos_embed:
        keys["pos_embed"] = f"{stack}.hook_pos_embed"
    if embed_ln:
        keys.update(embed_scale=f"{stack}.embed_ln.hook_scale", embed_normalized=f"{stack}.embed_ln.hook_normalized")
    if rel_pos_bias:
        keys["rel_pos_bias"] = f"{stack}.rel_pos_bias.hook_bias"
    if final_norm:
        keys.update(scale=f"{stack}.ln_final.hook_scale", normalized=f"{stack}.ln_final.hook_normalized")
    return keys


@dataclass(frozen=True)
class EncoderDecoderHookNames:
    """The short-name table of an encoder-decoder (see the module docstring).

    ``layer_keys[stack]`` and ``global_keys_of[stack]`` map short names to templates, for
    ``stack`` in ``"encoder"``, ``"decoder"`` and (layer keys only) ``"cross"``. ``global_keys``
    and ``unavailable`` are what ``ActivationCache`` reads for a key given as a bare string:
    every bare short name is unavailable here, with the advice to name the stack.
    """

    layer_keys: Mapping[str, Mapping[str, str]]
    global_keys_of: Mapping[str, Mapping[str, str]]
    input_writers: tuple[str, ...] = ("embed", "pos_embed")
    final_residual: str = "decoder.blocks.{last}.hook_resid_post"
    global_keys: Mapping[str, str] = field(default_factory=dict)
    sublayers: tuple[str, ...] = tuple(
        f"{stack}.{norm}" for stack, norms in (("encoder", ENCODER_NORMS), ("decoder", DECODER_NORMS)) for norm in norms
    )

    @property
    def unavailable(self) -> dict[str, str]:
        names = {name for keys in self.global_keys_of.values() for name in keys}
        return {
            name: "{key!r} needs its stack in an encoder-decoder: ({key!r}, 'encoder') or ({key!r}, 'decoder')"
            for name in names
        }

    def full_name(
        self, name: str, layer=None, sub: str | None = None, n_layers: None | int | Mapping[str, int] = None
    ) -> str:
        """Full hook name of ``(name, layer, sub)``; ``KeyError`` naming what is valid for anything else.

        ``layer`` is a block index (negative counts from the end, given ``n_layers``: an int,
        or ``{"encoder": n, "decoder": m}``) with ``sub`` the stack (``"encoder"``,
        ``"decoder"``, ``"cross"``, or ``"<stack>.<norm>"`` for ``scale``/``normalized``); or
        ``layer`` is the stack itself for a key without a layer (``("embed", "decoder")``).
        """
        if not isinstance(name, str):
            raise KeyError(f"short names are str, got {name!r}")
        name = ALIASES.get(name, name)
        if isinstance(layer, str):
            return self._global_name(name, layer, sub)
        if layer is None:
            if name in self.unavailable:
                raise KeyError(self.unavailable[name].format(key=name))
            raise KeyError(
                f"{name!r} needs a layer and its stack, e.g. ({name!r}, 0, 'decoder'); in an "
                "encoder-decoder "
                f"every hook belongs to the encoder, the decoder or the decoder's cross-attention"
            )
        stack, norm = self._stack_of(name, layer, sub)
        keys = self.layer_keys[stack]
        if name not in keys:
            close = difflib.get_close_matches(name, list(keys), n=3)
            raise KeyError(f"no short name {name!r} in the {stack} blocks; closest: {close}; all: {sorted(keys)}")
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise KeyError(f"layer must be an int, got {layer!r}")
        count = n_layers.get("decoder" if stack == CROSS else stack) if isinstance(n_layers, Mapping) else n_layers
        if count is not None:
            if not -count <= layer < count:
                raise KeyError(f"layer {layer} out of range for a {stack} of {count} layers")
            layer %= count
        elif layer < 0:
            raise KeyError(f"layer {layer} counts from the end: give n_layers too")
        return keys[name].format(layer=layer, sub=norm)

    def _stack_of(self, name: str, layer: int, sub) -> tuple[str, str | None]:
        """``(stack, norm)`` of a layer key's ``sub``."""
        if name in NORM_KEYS:
            stack, _, norm = (sub or "").partition(".")
            norms = ENCODER_NORMS if stack == "encoder" else DECODER_NORMS
            if stack not in STACKS or norm not in norms:
                raise KeyError(
                    f"{name!r} needs the stack and the norm: ({name!r}, {layer}, one of "
                    f"{list(self.sublayers)}); got {sub!r}"
                )
            return stack, norm
        if sub not in STACKS + (CROSS,):
            raise KeyError(
                f"{name!r} needs its stack: ({name!r}, {layer}, 'encoder' | 'decoder' | 'cross'); got {sub!r}"
            )
        return sub, None

    def _global_name(self, name: str, stack: str, sub) -> str:
        if stack not in STACKS:
            raise KeyError(f"a key without a layer names its stack, 'encoder' or 'decoder'; got {stack!r}")
        if sub is not None:
            raise KeyError(f"({name!r}, {stack!r}) takes no sub-layer, got {sub!r}")
        keys = self.global_keys_of[stack]
        if name not in keys:
            close = difflib.get_close_matches(name, list(keys), n=3)
            raise KeyError(
                f"no short name {name!r} without a layer in the {stack}; closest: {close}; all: {sorted(keys)}"
            )
        return keys[name]

    def final_residual_name(self, n_layers: int) -> str:
        """The hook holding the decoder's final residual stream (``n_layers``: the decoder's)."""
        return self.final_residual.format(last=n_layers - 1)


def encoder_decoder_hook_names(
    *, post_norm: bool, pos_embed: bool, rel_pos_bias: bool = False, embed_ln: bool = False, final_norm: bool
) -> EncoderDecoderHookNames:
    """The table of an encoder-decoder with these parts (the same in both stacks)."""
    decoder = {
        **_stack_templates("decoder", post_norm),
        "cross_attn_out": "decoder.blocks.{layer}.hook_cross_attn_out",
        "resid_mid_cross": "decoder.blocks.{layer}.hook_resid_mid_cross",
    }
    final = "blocks.{last}.hook_normalized_resid_post" if post_norm else "blocks.{last}.hook_resid_post"
    return EncoderDecoderHookNames(
        layer_keys={"encoder": _stack_templates("encoder", post_norm), "decoder": decoder, CROSS: _cross_templates()},
        global_keys_of={
            stack: _global_templates(stack, pos_embed, rel_pos_bias, embed_ln, final_norm) for stack in STACKS
        },
        input_writers=("embed", "pos_embed") if pos_embed else ("embed",),
        final_residual="decoder." + final,
    )


__all__ = [
    "CROSS",
    "DECODER_NORMS",
    "ENCODER_NORMS",
    "EncoderDecoderHookNames",
    "EncoderDecoderParts",
    "STACKS",
    "StackParts",
    "encoder_decoder_capabilities",
    "encoder_decoder_hook_names",
    "validate_encoder_decoder_fields",
]

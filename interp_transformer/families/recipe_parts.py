"""What the decoder recipes build the same way: the stack in forward order, the pre-norm decoder's facts, the
attention of the rotary decoders, the note for a model without a positional embedding.

A recipe says only what differs (its block, its norm, its embedding); these helpers put the rest together.
"""

from collections.abc import Callable
from typing import Any

from torch import nn

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.registry import Architecture, DecoderParts
from interp_transformer.parts import Attention, CausalMask, Embed, LayerNorm, PaddingMask, SlidingWindowMask, Unembed
from interp_transformer.parts.rms_norm import RMSNorm

# a causal decoder whose blocks read the stream through their norms, read out through ln_final and unembed
PRE_NORM_DECODER = Capabilities(
    causal=True, norm_placement="pre", final_norm="ln_final", read_out="unembed", next_token_logits=True
)


def fixed_architecture(name: str, config_class: type, build: Callable, hook_names, capabilities: Capabilities):
    """An ``Architecture`` whose facts are the same for every config (``capabilities(cfg)`` ignores ``cfg``)."""
    return Architecture(
        name=name, config_class=config_class, build=build, capabilities=lambda cfg: capabilities, hook_names=hook_names
    )


def decoder_parts(
    cfg,
    block: Callable[[int], nn.Module],
    norm: Callable[[], nn.Module],
    embed: nn.Module | None = None,
    pos_embed: nn.Module | None = None,
    unembed: nn.Module | None = None,
) -> DecoderParts:
    """A decoder's parts: ``embed`` (default ``Embed(cfg)``), ``pos_embed`` (None: positions act inside attention or
    there are none), ``block(layer)`` for each of ``cfg.n_layers`` layers, ``norm()`` as ``ln_final``, ``unembed``
    (default ``Unembed(cfg)``)."""
    return DecoderParts(
        embed=Embed(cfg) if embed is None else embed,
        pos_embed=pos_embed,
        blocks=[block(layer) for layer in range(cfg.n_layers)],
        ln_final=norm(),
        unembed=Unembed(cfg) if unembed is None else unembed,
    )


def layer_norms(cfg) -> Callable[[], LayerNorm]:
    """Makes the LayerNorms of a config with ``layer_norm_eps``: each call a new ``LayerNorm`` over ``d_model``."""
    return lambda: LayerNorm(cfg.d_model, cfg.layer_norm_eps)


def rms_norms(cfg) -> Callable[[], RMSNorm]:
    """Makes the RMSNorms of a config with ``rms_norm_eps``: each call a new ``RMSNorm`` over ``d_model``."""
    return lambda: RMSNorm(cfg.d_model, cfg.rms_norm_eps)


def rotary_positions_note(model: str) -> dict[str, str]:
    """The ``unavailable`` entry of a rotary model's hook table: ``pos_embed`` does not exist, and where positions
    act instead."""
    return {
        "pos_embed": f"{model} has no positional embedding: its positions rotate q and k inside attention "
        "(cache['rot_q', L], cache['rot_k', L])",
    }


def causal_mask(window: int | None) -> nn.Module:
    """A causal mask; within ``window`` keys (the query itself included) where one is given."""
    return CausalMask() if window is None else SlidingWindowMask(window)


def head_rms_norms(cfg) -> dict[str, Any]:
    """Qwen3's q/k norms (an ``RMSNorm`` over ``d_head`` on each head) where ``cfg.qk_norm`` asks, else none."""
    if not cfg.qk_norm:
        return {}
    return {"q_norm": RMSNorm(cfg.d_head, cfg.rms_norm_eps), "k_norm": RMSNorm(cfg.d_head, cfg.rms_norm_eps)}


def grouped_attention(cfg, window: int | None, rotary: nn.Module | None, **parts) -> Attention:
    """Causal (or sliding-window) grouped-query attention over padded batches with ``rotary`` positions and the
    optional ``parts`` (q/k norms, sinks, scale, soft-cap)."""
    return Attention(
        cfg, (causal_mask(window), PaddingMask()), n_key_value_heads=cfg.n_key_value_heads, rotary=rotary, **parts
    )


__all__ = [
    "PRE_NORM_DECODER",
    "causal_mask",
    "decoder_parts",
    "fixed_architecture",
    "grouped_attention",
    "head_rms_norms",
    "layer_norms",
    "rms_norms",
    "rotary_positions_note",
]

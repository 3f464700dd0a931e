"""What the configs of the rotary decoders (Llama family, Gemma, mixtures of experts) share.

Each such config is a frozen dataclass with the fields ``d_model``, ``n_layers``, ``n_heads``,
``n_key_value_heads``, ``d_head``, ``d_vocab``, ``n_ctx``, ``act_fn``, ``rms_norm_eps``,
``rotary_base``, ``rope_scaling``, ``attn_biases``, ``init_range``, ``name``; it inherits
``RotaryDecoderConfig`` (``attn_only``, ``replace``) and validates those fields with
``validate_rotary_decoder`` before its own.
"""

import dataclasses
import difflib

from interp_transformer.families.validation import ACTIVATION_FUNCTIONS, check_positive_int, check_positive_number
from interp_transformer.parts.rotary import RopeScaling

ATTENTION_PROJECTIONS = ("q", "k", "v", "o")
SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_key_value_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")
# a mixture of experts' shape: d_mlp is one expert's width, experts_per_token of n_experts serve each token
MIXTURE_SHAPE_FIELDS = (*SHAPE_FIELDS[:6], "n_experts", "experts_per_token", *SHAPE_FIELDS[6:])


class RotaryDecoderConfig:
    """Methods every rotary decoder config shares (a mixin of the frozen dataclasses)."""

    @property
    def attn_only(self) -> bool:
        """Always False: every block has an MLP (read by ``ActivationCache``)."""
        return False

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def validate_rotary_decoder(cfg, positive_ints: tuple[str, ...] = SHAPE_FIELDS) -> None:
    """The shared checks: ``positive_ints``, grouped heads, an even ``d_head``, act_fn, eps, init, rotary, biases,
    name."""
    for field in positive_ints:
        check_positive_int(field, getattr(cfg, field))
    if cfg.n_heads % cfg.n_key_value_heads:
        raise ValueError(
            f"n_heads={cfg.n_heads} must be a multiple of n_key_value_heads={cfg.n_key_value_heads}: "
            "each key/value head serves a whole group of query heads"
        )
    if cfg.d_head % 2:
        raise ValueError(f"d_head={cfg.d_head} must be even: rotary positions rotate pairs of dimensions")
    if cfg.act_fn not in ACTIVATION_FUNCTIONS:
        raise ValueError(f"act_fn must be one of {ACTIVATION_FUNCTIONS}, got {cfg.act_fn!r}")
    check_positive_number("rms_norm_eps", cfg.rms_norm_eps)
    check_positive_number("init_range", cfg.init_range)
    check_positive_number("rotary_base", cfg.rotary_base, above=1.0)
    if cfg.rope_scaling is not None and not isinstance(cfg.rope_scaling, RopeScaling):
        raise TypeError(f"rope_scaling must be a RopeScaling or None, got {type(cfg.rope_scaling).__name__}")
    biases = cfg.attn_biases
    if (
        not isinstance(biases, tuple)
        or len(set(biases)) != len(biases)
        or not set(biases) <= set(ATTENTION_PROJECTIONS)
    ):
        raise ValueError(f"attn_biases must be a tuple of distinct names from {ATTENTION_PROJECTIONS}, got {biases!r}")
    if not isinstance(cfg.name, str):
        raise TypeError(f"name must be a str, got {type(cfg.name).__name__}")


def validate_mixture_decoder(cfg) -> None:
    """The shared checks of a mixture of experts' config: ``validate_rotary_decoder``'s, then that the router picks
    at most ``n_experts``."""
    validate_rotary_decoder(cfg, MIXTURE_SHAPE_FIELDS)
    if cfg.experts_per_token > cfg.n_experts:
        raise ValueError(f"experts_per_token={cfg.experts_per_token} must be at most n_experts={cfg.n_experts}")


def check_layer_types(cfg, names: tuple[str, ...]) -> None:
    """``cfg.layer_types``: None, or a tuple of ``n_layers`` names from ``names``."""
    if cfg.layer_types is None:
        return
    if not isinstance(cfg.layer_types, tuple) or len(cfg.layer_types) != cfg.n_layers:
        raise ValueError(f"layer_types must be a tuple of n_layers={cfg.n_layers} names, got {cfg.layer_types!r}")
    unknown = sorted(set(cfg.layer_types) - set(names))
    if unknown:
        raise ValueError(f"layer_types must each be one of {names}, got {unknown}")


def gated_mlp_params(cfg, width: int, hugging_face: bool) -> int:
    """A gated MLP of hidden width ``width``: three matrices and (not in Hugging Face's count) ``b_in``, ``b_out``."""
    return 3 * cfg.d_model * width + (0 if hugging_face else width + cfg.d_model)


def gated_decoder_params(cfg, hugging_face: bool, qk_norm: bool, norms: int = 2, extra: int = 0) -> int:
    """Parameters of a decoder of ``norms`` norms, attention and a gated MLP per block (plus ``extra`` per block),
    the embedding, final norm and read-out."""
    block = norms * cfg.d_model + attention_params(cfg, hugging_face, qk_norm) + extra
    return cfg.n_layers * (block + gated_mlp_params(cfg, cfg.d_mlp, hugging_face)) + embedding_params(cfg, hugging_face)


def attention_params(cfg, hugging_face: bool, qk_norm: bool) -> int:
    """Parameters of one grouped-query attention: projections, biases (Hugging Face: only ``attn_biases``), q/k
    norms."""
    d, d_head = cfg.d_model, cfg.d_head
    q_width, kv_width = cfg.n_heads * d_head, cfg.n_key_value_heads * d_head
    widths = {"q": q_width, "k": kv_width, "v": kv_width, "o": d}
    biases = sum(widths[p] for p in cfg.attn_biases) if hugging_face else sum(widths.values())
    return 2 * d * q_width + 2 * d * kv_width + biases + (2 * d_head if qk_norm else 0)


def embedding_params(cfg, hugging_face: bool) -> int:
    """``W_E``, the final norm's ``w`` and the read-out (Hugging Face: none of its own when tied, no ``b_U``)."""
    read_out = (
        0 if hugging_face and cfg.tied_embeddings else cfg.d_model * cfg.d_vocab + (0 if hugging_face else cfg.d_vocab)
    )
    return cfg.d_vocab * cfg.d_model + cfg.d_model + read_out


def find_preset(presets: dict, name: str):
    """``presets[name]``, or ``KeyError`` naming the known presets and the closest ones."""
    if name not in presets:
        close = difflib.get_close_matches(name, presets, n=3)
        raise KeyError(f"unknown preset {name!r}; known: {sorted(presets)}; closest: {close}")
    return presets[name]


__all__ = [
    "ATTENTION_PROJECTIONS",
    "MIXTURE_SHAPE_FIELDS",
    "SHAPE_FIELDS",
    "RotaryDecoderConfig",
    "attention_params",
    "check_layer_types",
    "embedding_params",
    "find_preset",
    "gated_decoder_params",
    "gated_mlp_params",
    "validate_mixture_decoder",
    "validate_rotary_decoder",
]

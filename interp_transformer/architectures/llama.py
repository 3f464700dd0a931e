"""The Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM2): config, presets, parts, capabilities, hook names.

A pre-norm causal decoder like GPT-2, with four parts changed:

- ``RMSNorm`` instead of LayerNorm (no centring, no bias);
- no positional embedding: queries and keys are rotated by their positions inside
  attention (``Rotary``, the half-split convention), so ``hook_pos_embed`` does not exist
  and the residual stream entering block 0 is ``hook_embed`` alone;
- grouped-query attention: ``n_key_value_heads`` key/value heads, each shared by
  ``n_heads / n_key_value_heads`` query heads (``hook_k``/``hook_v`` have
  ``n_key_value_heads`` heads; ``model.W_K``/``W_V`` are given per query head);
- a gated MLP (SwiGLU): ``post = silu(x W_gate) * (x W_in + b_in)``.

The variants are fields, not classes: Mistral's ``sliding_window`` (a ``SlidingWindowMask``
in every block), Qwen3's ``qk_norm`` (an RMSNorm over ``d_head`` on each head's q and k,
before the rotation), Llama 3.1's ``rope_scaling``. ``d_model`` need not equal
``n_heads * d_head``.
"""

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Optional

from ..capabilities import Capabilities
from ..components import Attention, CausalMask, Embed, PaddingMask, SlidingWindowMask, TransformerBlock, Unembed
from ..components.gated_mlp import GatedMLP
from ..components.rms_norm import RMSNorm
from ..components.rotary import RopeScaling, Rotary
from ..hook_names import BLOCK_HOOKS, HookNames
from .registry import Architecture, DecoderParts
from .validation import ACTIVATION_FUNCTIONS

ATTENTION_PROJECTIONS = ("q", "k", "v", "o")


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_positive_number(name: str, value, above: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > above:
        raise ValueError(f"{name} must be a finite number > {above:g}, got {value!r}")


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and numerics of a Llama-family decoder (defaults: SmolLM2-135M's shape)."""

    d_model: int = 576  # width of the residual stream
    n_layers: int = 30  # number of transformer blocks
    n_heads: int = 9  # query heads per block
    n_key_value_heads: int = 3  # key/value heads per block, each shared by n_heads / n_key_value_heads query heads
    d_head: int = 64  # width of each head's query/key/value; need not be d_model / n_heads
    d_mlp: int = 1536  # hidden width of the gated MLP (neurons per layer)
    d_vocab: int = 49152  # vocabulary size
    n_ctx: int = 8192  # longest sequence (Hugging Face's max_position_embeddings)
    act_fn: str = "silu"  # the gate's activation (SwiGLU: silu)
    rms_norm_eps: float = 1e-5  # added to mean(x^2) inside every RMSNorm
    rotary_base: float = 100000.0  # rotary theta: the wavelength scale of the position rotations
    rope_scaling: Optional[RopeScaling] = None  # stretched rotary frequencies (Llama 3.1's "llama3", "linear")
    sliding_window: Optional[int] = None  # Mistral: each query sees at most this many keys (itself included)
    qk_norm: bool = False  # Qwen3: RMSNorm over d_head on each head's q and k before the rotation
    attn_biases: tuple[str, ...] = ()  # projections the checkpoint has biases for: ("q", "k", "v") in Qwen2
    tied_embeddings: bool = True  # the checkpoint's read-out is its token embedding (no lm_head.weight)
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        for field in ("d_model", "n_layers", "n_heads", "n_key_value_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"):
            _check_positive_int(field, getattr(self, field))
        if self.n_heads % self.n_key_value_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be a multiple of n_key_value_heads={self.n_key_value_heads}: "
                "each key/value head serves a whole group of query heads"
            )
        if self.d_head % 2:
            raise ValueError(f"d_head={self.d_head} must be even: rotary positions rotate pairs of dimensions")
        if self.act_fn not in ACTIVATION_FUNCTIONS:
            raise ValueError(f"act_fn must be one of {ACTIVATION_FUNCTIONS}, got {self.act_fn!r}")
        _check_positive_number("rms_norm_eps", self.rms_norm_eps)
        _check_positive_number("init_range", self.init_range)
        _check_positive_number("rotary_base", self.rotary_base, above=1.0)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise TypeError(f"rope_scaling must be a RopeScaling or None, got {type(self.rope_scaling).__name__}")
        if self.sliding_window is not None:
            _check_positive_int("sliding_window", self.sliding_window)
        for field in ("qk_norm", "tied_embeddings"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be a bool, got {getattr(self, field)!r}")
        biases = self.attn_biases
        if not isinstance(biases, tuple) or len(set(biases)) != len(biases) or not set(biases) <= set(ATTENTION_PROJECTIONS):
            raise ValueError(f"attn_biases must be a tuple of distinct names from {ATTENTION_PROJECTIONS}, got {biases!r}")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")

    @property
    def attn_only(self) -> bool:
        """Always False: every block has an MLP (read by ``ActivationCache``)."""
        return False

    def replace(self, **changes) -> "LlamaConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def n_params(self, hugging_face: bool = False) -> int:
        """Number of parameters of a ``DemoTransformer`` built from this config.

        ``hugging_face=True`` counts the way Hugging Face reports the checkpoint: only the
        attention biases in ``attn_biases``, no MLP or unembedding biases, and no read-out
        matrix of its own when ``tied_embeddings`` (SmolLM2-135M: 134,515,008).
        """
        d, d_head, d_mlp = self.d_model, self.d_head, self.d_mlp
        q_width, kv_width = self.n_heads * d_head, self.n_key_value_heads * d_head
        widths = {"q": q_width, "k": kv_width, "v": kv_width, "o": d}
        attn = 2 * d * q_width + 2 * d * kv_width + (2 * d_head if self.qk_norm else 0)
        attn_biases = sum(widths[p] for p in self.attn_biases) if hugging_face else sum(widths.values())
        mlp = 3 * d * d_mlp + (0 if hugging_face else d_mlp + d)
        block = 2 * d + attn + attn_biases + mlp
        read_out = 0 if hugging_face and self.tied_embeddings else d * self.d_vocab
        unembed_bias = 0 if hugging_face else self.d_vocab
        return self.d_vocab * d + self.n_layers * block + d + read_out + unembed_bias


# Parameter counts as Hugging Face reports them, n_params(hugging_face=True).
PRESETS: dict[str, LlamaConfig] = {
    "SmolLM2-135M": LlamaConfig(init_range=0.041666666666666664, name="SmolLM2-135M"),  # 134,515,008
}


def preset(name: str) -> LlamaConfig:
    """The config of a named Llama-family model, e.g. ``preset("SmolLM2-135M")``."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3)
        raise KeyError(f"unknown preset {name!r}; known: {sorted(PRESETS)}; closest: {close}")
    return PRESETS[name]


def build(cfg: LlamaConfig) -> DecoderParts:
    """Llama's parts: RMSNorm pre-norm blocks of rotary grouped-query attention and a gated MLP; no positional embedding."""

    def norm(width: int) -> RMSNorm:
        return RMSNorm(width, cfg.rms_norm_eps)

    def attention() -> Attention:
        window = CausalMask() if cfg.sliding_window is None else SlidingWindowMask(cfg.sliding_window)
        head_norms = {"q_norm": norm(cfg.d_head), "k_norm": norm(cfg.d_head)} if cfg.qk_norm else {}
        rotary = Rotary(cfg.d_head, base=cfg.rotary_base, scaling=cfg.rope_scaling)
        return Attention(cfg, (window, PaddingMask()), n_key_value_heads=cfg.n_key_value_heads, rotary=rotary, **head_norms)

    return DecoderParts(
        embed=Embed(cfg),
        pos_embed=None,  # positions act inside attention
        blocks=[TransformerBlock(norm(cfg.d_model), attention(), norm(cfg.d_model), GatedMLP(cfg)) for _ in range(cfg.n_layers)],
        ln_final=norm(cfg.d_model),
        unembed=Unembed(cfg),
    )


CAPABILITIES = Capabilities(causal=True, norm_placement="pre", final_norm="ln_final", read_out="unembed", next_token_logits=True)

HOOK_NAMES = HookNames(
    layer_keys={
        **BLOCK_HOOKS,
        "rot_q": "blocks.{layer}.attn.hook_rot_q",
        "rot_k": "blocks.{layer}.attn.hook_rot_k",
        "pre_linear": "blocks.{layer}.mlp.hook_pre_linear",
    },
    global_keys={"embed": "hook_embed", "scale": "ln_final.hook_scale", "normalized": "ln_final.hook_normalized"},
    input_writers=("embed",),
    unavailable={
        "pos_embed": "a Llama-family model has no positional embedding: its positions rotate q and k inside attention "
        "(cache['rot_q', L], cache['rot_k', L])",
    },
)

ARCHITECTURE = Architecture(
    name="llama", config_class=LlamaConfig, build=build, capabilities=lambda cfg: CAPABILITIES, hook_names=HOOK_NAMES
)

__all__ = ["ARCHITECTURE", "CAPABILITIES", "HOOK_NAMES", "LlamaConfig", "PRESETS", "build", "preset"]

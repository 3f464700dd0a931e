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

from dataclasses import dataclass

from interp_transformer.families.recipe_parts import (
    PRE_NORM_DECODER,
    decoder_parts,
    fixed_architecture,
    grouped_attention,
    head_rms_norms,
    rms_norms,
    rotary_positions_note,
)
from interp_transformer.families.registry import DecoderParts
from interp_transformer.families.rotary_decoder import (
    RotaryDecoderConfig,
    find_preset,
    gated_decoder_params,
    validate_rotary_decoder,
)
from interp_transformer.families.validation import check_bools, check_positive_int
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames
from interp_transformer.parts import Attention, PreNormBlock
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.rotary import RopeScaling, Rotary


@dataclass(frozen=True)
class LlamaConfig(RotaryDecoderConfig):
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
    rope_scaling: RopeScaling | None = None  # stretched rotary frequencies (Llama 3.1's "llama3", "linear")
    sliding_window: int | None = None  # Mistral: each query sees at most this many keys (itself included)
    qk_norm: bool = False  # Qwen3: RMSNorm over d_head on each head's q and k before the rotation
    attn_biases: tuple[str, ...] = ()  # projections the checkpoint has biases for: ("q", "k", "v") in Qwen2
    tied_embeddings: bool = True  # the checkpoint's read-out is its token embedding (no lm_head.weight)
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_rotary_decoder(self)
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        check_bools(self, ("qk_norm", "tied_embeddings"))

    def n_params(self, hugging_face: bool = False) -> int:
        """Number of parameters of a ``DemoTransformer`` built from this config.

        ``hugging_face=True`` counts the way Hugging Face reports the checkpoint: only the
        attention biases in ``attn_biases``, no MLP or unembedding biases, and no read-out
        matrix of its own when ``tied_embeddings`` (SmolLM2-135M: 134,515,008).
        """
        return gated_decoder_params(self, hugging_face, self.qk_norm)


# Parameter counts as Hugging Face reports them, n_params(hugging_face=True).
PRESETS: dict[str, LlamaConfig] = {
    "SmolLM2-135M": LlamaConfig(init_range=0.041666666666666664, name="SmolLM2-135M"),  # 134,515,008
}


def preset(name: str) -> LlamaConfig:
    """The config of a named Llama-family model, e.g. ``preset("SmolLM2-135M")``."""
    return find_preset(PRESETS, name)


def rotary_attention(cfg) -> Attention:
    """Llama's attention: rotary, grouped keys/values, Mistral's window and Qwen3's q/k RMSNorms where ``cfg`` asks.

    ``cfg`` is any config with Llama's attention fields (``LlamaConfig``, ``MoEConfig``).
    """
    rotary = Rotary(cfg.d_head, base=cfg.rotary_base, scaling=cfg.rope_scaling)
    return grouped_attention(cfg, cfg.sliding_window, rotary, **head_rms_norms(cfg))


def build(cfg: LlamaConfig) -> DecoderParts:
    """Llama's parts: RMSNorm pre-norm blocks of rotary grouped-query attention and a gated MLP; no positional
    embedding."""

    norm = rms_norms(cfg)

    return decoder_parts(cfg, lambda layer: PreNormBlock(norm(), rotary_attention(cfg), norm(), GatedMLP(cfg)), norm)


CAPABILITIES = PRE_NORM_DECODER

HOOK_NAMES = HookNames(
    layer_keys={
        **BLOCK_HOOKS,
        "rot_q": "blocks.{layer}.attn.hook_rot_q",
        "rot_k": "blocks.{layer}.attn.hook_rot_k",
        "pre_linear": "blocks.{layer}.mlp.hook_pre_linear",
    },
    global_keys={"embed": "hook_embed", "scale": "ln_final.hook_scale", "normalized": "ln_final.hook_normalized"},
    input_writers=("embed",),
    unavailable=rotary_positions_note("a Llama-family model"),
)

ARCHITECTURE = fixed_architecture("llama", LlamaConfig, build, HOOK_NAMES, CAPABILITIES)

__all__ = [
    "ARCHITECTURE",
    "CAPABILITIES",
    "HOOK_NAMES",
    "LlamaConfig",
    "PRESETS",
    "build",
    "preset",
    "rotary_attention",
]

"""Phi-3 and Phi-4 (one Hugging Face class, ``Phi3ForCausalLM``): config, parts, capabilities, hook names.

Llama's decoder (pre-RMSNorm blocks of grouped-query attention and a SwiGLU MLP, no
positional embedding), with two differences in the positions:

- partial rotary: only the first ``rotary_dim`` dimensions of each head rotate, the rest pass
  unchanged (Phi-4-mini: 96 of 128); ``rotary_dim = d_head`` rotates whole heads (Phi-3-mini,
  Phi-4);
- LongRoPE (``rope_scaling=RopeScaling("longrope", ...)``): two sets of frequencies, the
  short one for rows up to ``original_max_position_embeddings`` positions and the long one
  beyond, and cos and sin scaled by an attention factor (``components.rotary``).

A ``sliding_window`` (Phi-3-mini-4k: 2047) applies to every layer. The checkpoint's fused
``qkv_proj`` and ``gate_up_proj`` are split when loading (``loading.phi3``), so the parts and
hooks are Llama's: ``hook_q``/``hook_k``/``hook_v`` per head, ``hook_rot_q``/``hook_rot_k``,
and the gated MLP's ``hook_pre`` (gate), ``hook_pre_linear`` (up) and ``hook_post``.
"""

from dataclasses import dataclass

from interp_transformer.families.llama import recipe as llama
from interp_transformer.families.recipe_parts import (
    decoder_parts,
    fixed_architecture,
    grouped_attention,
    rms_norms,
    rotary_positions_note,
)
from interp_transformer.families.registry import DecoderParts
from interp_transformer.families.rotary_decoder import (
    RotaryDecoderConfig,
    gated_decoder_params,
    validate_rotary_decoder,
)
from interp_transformer.families.validation import check_bools, check_positive_int
from interp_transformer.hooks.names import HookNames
from interp_transformer.parts import Attention, PreNormBlock
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.rotary import RopeScaling, Rotary


@dataclass(frozen=True)
class Phi3Config(RotaryDecoderConfig):
    """Shape and numerics of a Phi-3 decoder (defaults: Phi-3-mini-4k's shape, without its window)."""

    d_model: int = 3072  # width of the residual stream
    n_layers: int = 32  # number of transformer blocks
    n_heads: int = 32  # query heads per block
    n_key_value_heads: int = 32  # key/value heads per block, each shared by n_heads / n_key_value_heads query heads
    d_head: int = 96  # width of each head's query/key/value
    d_mlp: int = 8192  # hidden width of the gated MLP (neurons per layer)
    d_vocab: int = 32064  # vocabulary size
    n_ctx: int = 4096  # longest sequence (Hugging Face's max_position_embeddings)
    rotary_dim: int | None = None  # leading dimensions of each head that rotate (None: all of d_head)
    act_fn: str = "silu"  # the gate's activation (SwiGLU: silu)
    rms_norm_eps: float = 1e-5  # added to mean(x^2) inside every RMSNorm
    rotary_base: float = 10000.0  # rotary theta: the wavelength scale of the position rotations
    rope_scaling: RopeScaling | None = None  # LongRoPE ("longrope"): short and long frequencies, attention factor
    sliding_window: int | None = None  # each query sees at most this many keys (itself included), in every layer
    tied_embeddings: bool = False  # the checkpoint's read-out is its token embedding (no lm_head.weight; Phi-4-mini)
    attn_biases: tuple[str, ...] = ()  # Phi-3's projections have no biases: always ()
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_rotary_decoder(self)
        if self.rotary_dim is not None:
            check_positive_int("rotary_dim", self.rotary_dim)
            if self.rotary_dim > self.d_head or self.rotary_dim % 2:
                raise ValueError(f"rotary_dim must be even and at most d_head={self.d_head}, got {self.rotary_dim}")
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        if self.attn_biases:
            raise ValueError(f"attn_biases must be () (Phi-3's projections have no biases), got {self.attn_biases!r}")
        check_bools(self, ("tied_embeddings",))

    def n_params(self, hugging_face: bool = False) -> int:
        """Number of parameters of a ``DemoTransformer`` built from this config.

        ``hugging_face=True`` counts the way Hugging Face reports the checkpoint: no biases, and
        no read-out matrix of its own when ``tied_embeddings``.
        """
        return gated_decoder_params(self, hugging_face, qk_norm=False)


def phi3_attention(cfg: Phi3Config) -> Attention:
    """Grouped-query attention rotating the first ``rotary_dim`` dimensions of each head (LongRoPE where asked)."""
    rotary = Rotary(cfg.d_head, rotary_dim=cfg.rotary_dim, base=cfg.rotary_base, scaling=cfg.rope_scaling)
    return grouped_attention(cfg, cfg.sliding_window, rotary)


def build(cfg: Phi3Config) -> DecoderParts:
    """Phi-3's parts: Llama's RMSNorm pre-norm blocks, with partial (and LongRoPE) rotary attention."""

    norm = rms_norms(cfg)

    return decoder_parts(cfg, lambda layer: PreNormBlock(norm(), phi3_attention(cfg), norm(), GatedMLP(cfg)), norm)


HOOK_NAMES = HookNames(
    layer_keys=dict(llama.HOOK_NAMES.layer_keys),
    global_keys=dict(llama.HOOK_NAMES.global_keys),
    input_writers=("embed",),
    unavailable=rotary_positions_note("a Phi-3 model"),
)

ARCHITECTURE = fixed_architecture("phi3", Phi3Config, build, HOOK_NAMES, llama.CAPABILITIES)

__all__ = ["ARCHITECTURE", "HOOK_NAMES", "Phi3Config", "build", "phi3_attention"]

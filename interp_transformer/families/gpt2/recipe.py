"""GPT-2: its config (one frozen dataclass, validated on construction), presets, parts, capabilities and hook names.

A config says *how big* a model is, not *which math* it runs. Architectures that
change the math (post-norm encoders, rotary, RMSNorm, gated MLPs) get their own
architecture module, config and parts instead of flags in this one.

GPT-2 is a pre-LayerNorm decoder: learned absolute positions added to the token
embeddings, blocks ``PreNormBlock(LayerNorm, Attention, LayerNorm, MLP)`` (no MLP when
``d_mlp=None``), a final LayerNorm and a linear unembedding.
"""

import dataclasses
from dataclasses import dataclass

from interp_transformer.families.recipe_parts import PRE_NORM_DECODER, decoder_parts, fixed_architecture, layer_norms
from interp_transformer.families.registry import DecoderParts
from interp_transformer.families.rotary_decoder import find_preset
from interp_transformer.families.validation import validate_common_fields
from interp_transformer.hooks.names import DECODER_HOOK_NAMES
from interp_transformer.parts import MLP, Attention, PosEmbed, PreNormBlock


@dataclass(frozen=True)
class TransformerConfig:
    """Shape and numerics of a GPT-2-style decoder (pre-LayerNorm, learned positions, causal).

    Set ``d_mlp=None`` for an attention-only model: its blocks have no MLP at all
    (a different block class, not a switched-off branch).
    """

    d_model: int = 768  # width of the residual stream
    n_layers: int = 12  # number of transformer blocks
    n_heads: int = 12  # attention heads per block
    d_head: int = 64  # width of each head's query/key/value; d_model == n_heads * d_head
    d_mlp: int | None = 3072  # MLP hidden width (4 * d_model in GPT-2); None = attention-only
    d_vocab: int = 50257  # vocabulary size (GPT-2's byte-level BPE)
    n_ctx: int = 1024  # longest sequence; rows of the positional embedding
    act_fn: str = "gelu_new"  # GPT-2 uses the tanh approximation of GELU
    layer_norm_eps: float = 1e-5  # added to the variance inside every LayerNorm
    init_range: float = 0.02  # std of the normal init of weight matrices (GPT-2's value)
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_common_fields(self, ("d_model", "n_layers", "n_heads", "d_head", "d_vocab", "n_ctx"))
        if self.d_mlp is not None and (
            not isinstance(self.d_mlp, int) or isinstance(self.d_mlp, bool) or self.d_mlp <= 0
        ):
            raise ValueError(f"d_mlp must be a positive int or None (attention-only), got {self.d_mlp!r}")

    @property
    def attn_only(self) -> bool:
        return self.d_mlp is None

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def n_params(self, tied_embeddings: bool = False) -> int:
        """Number of parameters, counted from the shapes in DESIGN section 4.

        With ``tied_embeddings=False`` (default) this is the number of parameters of a
        ``DemoTransformer`` built from this config. ``tied_embeddings=True`` counts the way
        Hugging Face reports GPT-2: ``W_U`` shares ``W_E``'s storage and there is no ``b_U``
        (GPT-2's ``lm_head`` has no bias; loading sets our ``b_U`` to zeros), e.g.
        ``preset("gpt2").n_params(tied_embeddings=True) == 124_439_808``.
        """
        d, L = self.d_model, self.n_layers
        attn = 4 * d * d + 3 * d + d  # W_Q/K/V/O + b_Q/K/V + b_O
        mlp = 0 if self.d_mlp is None else 2 * d * self.d_mlp + self.d_mlp + d
        block = attn + mlp + (2 if self.d_mlp is not None else 1) * 2 * d
        embed = self.d_vocab * d + self.n_ctx * d
        unembed = 0 if tied_embeddings else self.d_vocab * d + self.d_vocab
        return embed + L * block + 2 * d + unembed


def _gpt2(name: str, d_model: int, n_layers: int, n_heads: int) -> TransformerConfig:
    return TransformerConfig(
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_head=64, d_mlp=4 * d_model, name=name
    )


# Parameter counts as Hugging Face reports them, n_params(tied_embeddings=True).
PRESETS: dict[str, TransformerConfig] = {
    "gpt2": _gpt2("gpt2", 768, 12, 12),  # 124,439,808
    "gpt2-medium": _gpt2("gpt2-medium", 1024, 24, 16),  # 354,823,168
    "gpt2-large": _gpt2("gpt2-large", 1280, 36, 20),  # 774,030,080
    "gpt2-xl": _gpt2("gpt2-xl", 1600, 48, 25),  # 1,557,611,200
    "distilgpt2": _gpt2("distilgpt2", 768, 6, 12),  # 81,912,576
}


def preset(name: str) -> TransformerConfig:
    """The config of a named GPT-2 family model, e.g. ``preset("gpt2")``."""
    return find_preset(PRESETS, name)


def build(cfg: TransformerConfig) -> DecoderParts:
    """GPT-2's parts: learned positions, pre-LayerNorm blocks, final LayerNorm, linear unembedding."""

    norm = layer_norms(cfg)

    def block(layer: int) -> PreNormBlock:
        if cfg.attn_only:
            return PreNormBlock(norm(), Attention(cfg))
        return PreNormBlock(norm(), Attention(cfg), norm(), MLP(cfg))

    return decoder_parts(cfg, block, norm, pos_embed=PosEmbed(cfg))


CAPABILITIES = PRE_NORM_DECODER

ARCHITECTURE = fixed_architecture("gpt2", TransformerConfig, build, DECODER_HOOK_NAMES, CAPABILITIES)

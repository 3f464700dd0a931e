"""BLOOM: config, parts, capabilities and hook names.

A pre-LayerNorm causal decoder like GPT-2, with three parts changed:

- a LayerNorm on the token embeddings (``NormedEmbed``): ``hook_embed = ln(W_E[tokens])``,
  its norm hooked as ``embed.ln.hook_scale`` and ``embed.ln.hook_normalized``;
- no positional embedding: each head's scores get ALiBi's linear distance penalty
  (``Attention(score_bias=ALiBi(n_heads))``), hooked as ``blocks.L.attn.score_bias.hook_bias``
  (short name ``"alibi"``), ``[batch, head_index, query_pos, key_pos]``;
- BLOOM's own GELU (``bloom_gelu``: the tanh form with its constant rounded to 0.79788456).

The residual stream entering block 0 is ``hook_embed`` alone, already normalized, so the
residual identities hold unchanged with ``embed`` the only input writer.
"""

import dataclasses
from dataclasses import dataclass

from interp_transformer.families.recipe_parts import PRE_NORM_DECODER, decoder_parts, fixed_architecture, layer_norms
from interp_transformer.families.registry import DecoderParts
from interp_transformer.families.validation import check_bools, validate_common_fields
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames
from interp_transformer.parts import MLP, ALiBi, Attention, NormedEmbed, PreNormBlock


@dataclass(frozen=True)
class BloomConfig:
    """Shape and numerics of a BLOOM decoder (defaults: BLOOM-560m's shape)."""

    d_model: int = 1024  # width of the residual stream
    n_layers: int = 24  # number of transformer blocks
    n_heads: int = 16  # attention heads per block
    d_head: int = 64  # width of each head's query/key/value; d_model == n_heads * d_head
    d_mlp: int = 4096  # MLP hidden width: 4 * d_model in every BLOOM
    d_vocab: int = 250880  # vocabulary size
    n_ctx: int = 2048  # longest sequence accepted (BLOOM's training length: ALiBi itself sets no limit)
    tied_embeddings: bool = True  # the checkpoint's read-out is its token embedding (no lm_head.weight)
    act_fn: str = "bloom_gelu"  # BLOOM's tanh GELU
    layer_norm_eps: float = 1e-5  # added to the variance inside every LayerNorm
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_common_fields(self, ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"))
        check_bools(self, ("tied_embeddings",))

    def replace(self, **changes) -> "BloomConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build(cfg: BloomConfig) -> DecoderParts:
    """BLOOM's parts: normalized embeddings, ALiBi attention in pre-LayerNorm blocks, no positional embedding."""

    norm = layer_norms(cfg)

    def block(layer: int) -> PreNormBlock:
        return PreNormBlock(norm(), Attention(cfg, score_bias=ALiBi(cfg.n_heads)), norm(), MLP(cfg))

    # no positional embedding: positions are ALiBi's biases on the scores
    return decoder_parts(cfg, block, norm, NormedEmbed(cfg, norm()))


CAPABILITIES = PRE_NORM_DECODER

HOOK_NAMES = HookNames(
    layer_keys={**BLOCK_HOOKS, "alibi": "blocks.{layer}.attn.score_bias.hook_bias"},
    global_keys={"embed": "hook_embed", "scale": "ln_final.hook_scale", "normalized": "ln_final.hook_normalized"},
    input_writers=("embed",),
    unavailable={
        "pos_embed": "a BLOOM model has no positional embedding: ALiBi biases its attention scores by distance "
        "(cache['alibi', L])",
    },
)

ARCHITECTURE = fixed_architecture("bloom", BloomConfig, build, HOOK_NAMES, CAPABILITIES)

__all__ = ["ARCHITECTURE", "BloomConfig", "CAPABILITIES", "HOOK_NAMES", "build"]

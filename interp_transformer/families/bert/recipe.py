"""BERT: its config, presets, parts, capabilities and hook names (``EncoderTransformer`` composes them).

The config is its own class rather than flags on ``TransformerConfig``: an encoder runs
different math (post-norm blocks, no causal mask, token-type embeddings), and a config
says how big a model is, not which math it runs. Field names that mean the same thing
as in ``TransformerConfig`` are spelled the same, so the shared parts (``Embed``,
``PosEmbed``, ``MLP``, ``LayerNorm``) read them unchanged.

BERT's parts: token, position and token-type embeddings summed and normalized
(``embed_ln``), ``PostNormBlock(Attention(masks=(PaddingMask(),)), LayerNorm, MLP,
LayerNorm)`` blocks, and the heads the checkpoint ships (MLM head, pooler).
"""

import dataclasses
from dataclasses import dataclass

from torch import nn

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.recipe_parts import fixed_architecture
from interp_transformer.families.validation import validate_common_fields
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames
from interp_transformer.parts import (
    MLP,
    Attention,
    Embed,
    LayerNorm,
    MLMHead,
    PaddingMask,
    Pooler,
    PosEmbed,
    PostNormBlock,
    TokenTypeEmbed,
)


@dataclass(frozen=True)
class EncoderConfig:
    """Shape and numerics of a BERT-style encoder.

    The heads are part of the config because they are part of the model: a
    ``BertModel`` checkpoint usually has the pooler (``has_pooler``), a
    ``BertForMaskedLM`` checkpoint the masked-language-model head (``has_mlm_head``).
    """

    d_model: int = 768  # width of the residual stream (BERT-base)
    n_layers: int = 12  # number of encoder blocks
    n_heads: int = 12  # attention heads per block
    d_head: int = 64  # width of each head's query/key/value; d_model == n_heads * d_head
    d_mlp: int = 3072  # MLP hidden width (4 * d_model in BERT)
    d_vocab: int = 30522  # vocabulary size (BERT's uncased WordPiece vocabulary)
    n_ctx: int = 512  # longest sequence; rows of the positional embedding
    n_token_types: int = 2  # segment ids: 0 for sentence A, 1 for sentence B
    act_fn: str = "gelu"  # BERT uses the exact (erf) GELU, not GPT-2's tanh approximation
    layer_norm_eps: float = 1e-12  # BERT's value, much smaller than GPT-2's 1e-5
    init_range: float = 0.02  # std of the normal init of weight matrices
    has_mlm_head: bool = False  # masked-language-model head (BertForMaskedLM checkpoints)
    has_pooler: bool = False  # tanh(W x[CLS] + b) pooler (BertModel checkpoints)
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_common_fields(
            self, ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "n_token_types")
        )
        for field in ("has_mlm_head", "has_pooler"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be a bool, got {getattr(self, field)!r}")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")

    @property
    def attn_only(self) -> bool:
        """Always False: every encoder block has an MLP (read by ``ActivationCache``)."""
        return False

    def replace(self, **changes) -> "EncoderConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def n_params(self) -> int:
        """Number of parameters, counted from the shapes of ``EncoderTransformer``.

        Our MLM head keeps its own ``W_U``; Hugging Face ties it to ``W_E`` and counts it once.
        """
        d, L = self.d_model, self.n_layers
        embed = (self.d_vocab + self.n_ctx + self.n_token_types) * d + 2 * d
        attn = 4 * d * d + 4 * d
        mlp = 2 * d * self.d_mlp + self.d_mlp + d
        block = attn + mlp + 2 * 2 * d
        mlm_head = (d * d + d + 2 * d + d * self.d_vocab + self.d_vocab) if self.has_mlm_head else 0
        pooler = (d * d + d) if self.has_pooler else 0
        return embed + L * block + mlm_head + pooler


# Hugging Face reports: bert-base-uncased 109.5M (with pooler), all-MiniLM-L6-v2 22.7M.
ENCODER_PRESETS: dict[str, EncoderConfig] = {
    "bert-base-uncased": EncoderConfig(has_pooler=True, name="bert-base-uncased"),
    "all-MiniLM-L6-v2": EncoderConfig(
        d_model=384, n_layers=6, n_heads=12, d_head=32, d_mlp=1536, has_pooler=True, name="all-MiniLM-L6-v2"
    ),
}


@dataclass(frozen=True)
class EncoderParts:
    """The parts of a BERT-style encoder, in forward order: what ``EncoderTransformer`` composes."""

    embed: nn.Module
    pos_embed: nn.Module | None
    token_type_embed: nn.Module
    embed_ln: nn.Module | None
    blocks: list
    mlm_head: nn.Module | None
    pooler: nn.Module | None


def build(cfg: EncoderConfig) -> EncoderParts:
    """BERT's parts: summed embeddings and their LayerNorm, post-norm blocks, the heads ``cfg`` asks for."""

    def block():
        attn = Attention(cfg, masks=(PaddingMask(),))  # bidirectional: only padding is hidden
        return PostNormBlock(
            attn, LayerNorm(cfg.d_model, cfg.layer_norm_eps), MLP(cfg), LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        )

    return EncoderParts(
        embed=Embed(cfg),
        pos_embed=PosEmbed(cfg),
        token_type_embed=TokenTypeEmbed(cfg),
        embed_ln=LayerNorm(cfg.d_model, cfg.layer_norm_eps),
        blocks=[block() for _ in range(cfg.n_layers)],
        mlm_head=MLMHead(cfg) if cfg.has_mlm_head else None,
        pooler=Pooler(cfg) if cfg.has_pooler else None,
    )


CAPABILITIES = Capabilities(
    causal=False,
    norm_placement="post",
    final_norm=None,
    read_out=None,
    next_token_logits=False,
    embedding_norm="embed_ln",
)

_NO_FINAL_NORM = (
    "{key!r} without a layer means ln_final.hook_{key}, and an encoder has no ln_final (post-LayerNorm: each block "
    "ends in its own ln2, and the last block's is the final normalization): use cache[{key!r}, {last}, 'ln2'], i.e. "
    "'blocks.{last}.ln2.hook_{key}'"
)
HOOK_NAMES = HookNames(
    layer_keys={**BLOCK_HOOKS, "normalized_resid_post": "blocks.{layer}.hook_normalized_resid_post"},
    global_keys={"embed": "hook_embed", "pos_embed": "hook_pos_embed", "token_type_embed": "hook_token_type_embed"},
    input_writers=("embed", "token_type_embed", "pos_embed"),
    final_residual="blocks.{last}.hook_normalized_resid_post",
    unavailable={"scale": _NO_FINAL_NORM, "normalized": _NO_FINAL_NORM},
)

ARCHITECTURE = fixed_architecture("bert", EncoderConfig, build, HOOK_NAMES, CAPABILITIES)

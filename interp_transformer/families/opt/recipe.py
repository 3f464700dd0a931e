"""OPT: config, parts, capabilities and hook names of its two block orders.

Every OPT is a causal decoder with learned positions, ReLU MLPs and biases everywhere,
GPT-2's parts. The sizes differ in where the norms sit:

- ``OPTConfig`` (125m, 1.3b and larger): pre-LayerNorm ``PreNormBlock``s and a final
  LayerNorm, GPT-2's hooks and capabilities. ``final_norm=False`` is the old checkpoints'
  ``_remove_final_layer_norm``: the last block's output is read out directly.
- ``OPTPostNormConfig`` (350m): post-LayerNorm ``PostNormBlock``s, ``x = ln1(x + attn(x))``,
  ``x = ln2(x + mlp(x))``, and no final norm: the residual stream is renormalized twice per
  block, so the capabilities say ``norm_placement="post"`` and the cache's residual-sum
  tools, the logit lens and weight processing refuse it by that fact. Each block's output
  is ``blocks.L.hook_normalized_resid_post``.

OPT-350m's embeddings are narrower than its residual stream (512 against 1024), joined by
``project_in`` and ``project_out``; the converter folds them into ``W_E`` and ``W_U`` (see
``interp_transformer.families.opt.hf``), so both models here have GPT-2's parts and shapes.
OPT stores its positions with an offset of 2 (rows 0 and 1 are never read); ``W_pos`` holds
the rows positions ``0 .. n_ctx - 1`` read.
"""

import dataclasses
from dataclasses import dataclass

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.recipe_parts import PRE_NORM_DECODER, decoder_parts, fixed_architecture, layer_norms
from interp_transformer.families.registry import Architecture, DecoderParts
from interp_transformer.families.validation import check_bools, check_optional_positive_int, validate_common_fields
from interp_transformer.hooks.names import BLOCK_HOOKS, DECODER_HOOK_NAMES, HookNames
from interp_transformer.parts import MLP, Attention, NoNorm, PosEmbed, PostNormBlock, PreNormBlock

POSITIVE_INTS = ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")


@dataclass(frozen=True)
class _OPTFields:
    """What both OPT block orders share: the shape, and the facts of the checkpoint the converter checks."""

    d_model: int = 768  # width of the residual stream
    n_layers: int = 12  # number of transformer blocks
    n_heads: int = 12  # attention heads per block
    d_head: int = 64  # width of each head's query/key/value; d_model == n_heads * d_head
    d_mlp: int = 3072  # MLP hidden width (Hugging Face's ffn_dim)
    d_vocab: int = 50272  # vocabulary size
    n_ctx: int = 2048  # longest sequence: rows of W_pos
    act_fn: str = "relu"  # OPT's MLP activation
    layer_norm_eps: float = 1e-5  # added to the variance inside every LayerNorm (fixed in OPT's code)
    d_embed: int | None = None  # the checkpoint's embedding width if not d_model (folded into W_E, W_U)
    biases: bool = True  # the checkpoint has attention and MLP biases (enable_bias; without them ours are zeros)
    norm_weights: bool = True  # the checkpoint's norms have w and b (layer_norm_elementwise_affine; else 1 and 0)
    tied_embeddings: bool = True  # the checkpoint's read-out is its token embedding (no lm_head.weight)
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_common_fields(self, POSITIVE_INTS)
        check_optional_positive_int(self, "d_embed")
        check_bools(self, ("biases", "norm_weights", "tied_embeddings"))

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class OPTConfig(_OPTFields):
    """Shape and numerics of a pre-LayerNorm OPT decoder (defaults: OPT-125m's shape)."""

    final_norm: bool = True  # a LayerNorm before the read-out (False: old checkpoints' _remove_final_layer_norm)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bools(self, ("final_norm",))


@dataclass(frozen=True)
class OPTPostNormConfig(_OPTFields):
    """Shape and numerics of a post-LayerNorm OPT decoder (OPT-350m: d_model=1024, d_embed=512, 24 layers, 16 heads)."""


def build(cfg: OPTConfig) -> DecoderParts:
    """Pre-norm OPT: GPT-2's parts (learned positions, pre-LayerNorm blocks, a final LayerNorm unless removed)."""

    norm = layer_norms(cfg)

    def block(layer: int) -> PreNormBlock:
        return PreNormBlock(norm(), Attention(cfg), norm(), MLP(cfg))

    return decoder_parts(cfg, block, norm if cfg.final_norm else NoNorm, pos_embed=PosEmbed(cfg))


def build_post_norm(cfg: OPTPostNormConfig) -> DecoderParts:
    """OPT-350m: learned positions, post-LayerNorm blocks, no final norm."""

    norm = layer_norms(cfg)

    def block(layer: int) -> PostNormBlock:
        return PostNormBlock(Attention(cfg), norm(), MLP(cfg), norm())

    return decoder_parts(cfg, block, NoNorm, pos_embed=PosEmbed(cfg))


def capabilities(cfg: OPTConfig) -> Capabilities:
    """GPT-2's facts; without the final norm (old checkpoints), none to name."""
    return PRE_NORM_DECODER if cfg.final_norm else dataclasses.replace(PRE_NORM_DECODER, final_norm=None)


POST_NORM_CAPABILITIES = dataclasses.replace(PRE_NORM_DECODER, norm_placement="post", final_norm=None)

POST_NORM_HOOK_NAMES = HookNames(
    layer_keys={**BLOCK_HOOKS, "normalized_resid_post": "blocks.{layer}.hook_normalized_resid_post"},
    global_keys={"embed": "hook_embed", "pos_embed": "hook_pos_embed"},
    final_residual="blocks.{last}.hook_normalized_resid_post",
    unavailable={
        "scale": "a post-norm OPT has no final norm: the last block's ln2 output, cache['normalized_resid_post', "
        "{last}], is what the read-out reads",
        "normalized": "a post-norm OPT has no final norm: the last block's ln2 output, "
        "cache['normalized_resid_post', {last}], is what the read-out reads",
    },
)

ARCHITECTURE = Architecture(
    name="opt", config_class=OPTConfig, build=build, capabilities=capabilities, hook_names=DECODER_HOOK_NAMES
)
POST_NORM_ARCHITECTURE = fixed_architecture(
    "opt-post-norm", OPTPostNormConfig, build_post_norm, POST_NORM_HOOK_NAMES, POST_NORM_CAPABILITIES
)

__all__ = [
    "ARCHITECTURE",
    "OPTConfig",
    "OPTPostNormConfig",
    "POST_NORM_ARCHITECTURE",
    "POST_NORM_CAPABILITIES",
    "POST_NORM_HOOK_NAMES",
    "build",
    "build_post_norm",
    "capabilities",
]

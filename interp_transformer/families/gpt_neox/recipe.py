"""GPT-NeoX and Pythia: config, presets, parts, capabilities and hook names.

A pre-LayerNorm causal decoder like GPT-2, with two parts changed:

- no positional embedding: queries and keys are rotated by their positions inside
  attention (``Rotary``, the half-split convention) on the first ``rotary_dim``
  dimensions of each head only (Pythia: a quarter, 16 of 64); the rest pass unrotated;
- parallel blocks (``ParallelBlock``): attention and MLP both read the block's input,
  ``resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln2(resid_pre))``, so there is
  no ``hook_resid_mid``. ``parallel_residual=False`` (a GPT-NeoX config option) gives
  GPT-2's sequential ``PreNormBlock`` instead, with its ``hook_resid_mid``.

Pythia's MLP uses the exact (erf) GELU, not GPT-2's tanh approximation.
"""

import dataclasses
from dataclasses import dataclass

from interp_transformer.families.recipe_parts import (
    PRE_NORM_DECODER,
    decoder_parts,
    fixed_architecture,
    layer_norms,
    rotary_positions_note,
)
from interp_transformer.families.registry import DecoderParts
from interp_transformer.families.rotary_decoder import find_preset
from interp_transformer.families.validation import check_bools, check_positive_number, validate_common_fields
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames
from interp_transformer.parts import MLP, Attention, ParallelBlock, PreNormBlock
from interp_transformer.parts.rotary import RopeScaling, Rotary


@dataclass(frozen=True)
class GPTNeoXConfig:
    """Shape and numerics of a GPT-NeoX decoder (defaults: Pythia-160m's shape)."""

    d_model: int = 768  # width of the residual stream
    n_layers: int = 12  # number of transformer blocks
    n_heads: int = 12  # attention heads per block
    d_head: int = 64  # width of each head's query/key/value; d_model == n_heads * d_head
    d_mlp: int = 3072  # MLP hidden width (neurons per layer)
    d_vocab: int = 50304  # vocabulary size (Pythia's, padded to a multiple of 128)
    n_ctx: int = 2048  # longest sequence (Hugging Face's max_position_embeddings)
    rotary_dim: int = 16  # leading dimensions of each head that rotate (Pythia: 25% of d_head)
    rotary_base: float = 10000.0  # rotary theta: the wavelength scale of the position rotations
    rope_scaling: RopeScaling | None = None  # stretched rotary frequencies ("linear")
    parallel_residual: bool = True  # attention and MLP read the same input (False: GPT-2's sequential block)
    attn_bias: bool = True  # the checkpoint has attention biases (without them ours are zeros)
    tied_embeddings: bool = False  # the checkpoint's read-out is its token embedding (no lm_head.weight)
    act_fn: str = "gelu"  # Pythia's MLP: the exact (erf) GELU
    layer_norm_eps: float = 1e-5  # added to the variance inside every LayerNorm
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_common_fields(
            self, ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "rotary_dim")
        )
        if self.rotary_dim > self.d_head or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and at most d_head={self.d_head}, got {self.rotary_dim}")
        check_positive_number("rotary_base", self.rotary_base, above=1.0)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise TypeError(f"rope_scaling must be a RopeScaling or None, got {type(self.rope_scaling).__name__}")
        check_bools(self, ("parallel_residual", "attn_bias", "tied_embeddings"))

    def replace(self, **changes) -> "GPTNeoXConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _pythia(name: str, d_model: int, n_layers: int, n_heads: int) -> GPTNeoXConfig:
    d_head = d_model // n_heads
    return GPTNeoXConfig(
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=4 * d_model,
        rotary_dim=d_head // 4,
        name=name,
    )


PRESETS: dict[str, GPTNeoXConfig] = {
    "pythia-70m": _pythia("pythia-70m", 512, 6, 8),
    "pythia-160m": _pythia("pythia-160m", 768, 12, 12),
    "pythia-410m": _pythia("pythia-410m", 1024, 24, 16),
}


def preset(name: str) -> GPTNeoXConfig:
    """The config of a named Pythia model, e.g. ``preset("pythia-160m")``."""
    return find_preset(PRESETS, name)


def build(cfg: GPTNeoXConfig) -> DecoderParts:
    """GPT-NeoX's parts: partial rotary attention, parallel (or sequential) pre-LayerNorm blocks, no positional
    embedding."""

    norm = layer_norms(cfg)

    def block(layer: int):
        attn = Attention(
            cfg, rotary=Rotary(cfg.d_head, rotary_dim=cfg.rotary_dim, base=cfg.rotary_base, scaling=cfg.rope_scaling)
        )
        return (ParallelBlock if cfg.parallel_residual else PreNormBlock)(norm(), attn, norm(), MLP(cfg))

    return decoder_parts(cfg, block, norm)


CAPABILITIES = PRE_NORM_DECODER

# "resid_mid" stays in the table for the sequential variant; a parallel block has no such hook (the cache's
# accumulated_resid(incl_mid=True) skips it, and asking for it names the hooks there are)
HOOK_NAMES = HookNames(
    layer_keys={**BLOCK_HOOKS, "rot_q": "blocks.{layer}.attn.hook_rot_q", "rot_k": "blocks.{layer}.attn.hook_rot_k"},
    global_keys={"embed": "hook_embed", "scale": "ln_final.hook_scale", "normalized": "ln_final.hook_normalized"},
    input_writers=("embed",),
    unavailable=rotary_positions_note("a GPT-NeoX model"),
)

ARCHITECTURE = fixed_architecture("gpt_neox", GPTNeoXConfig, build, HOOK_NAMES, CAPABILITIES)

__all__ = ["ARCHITECTURE", "CAPABILITIES", "GPTNeoXConfig", "HOOK_NAMES", "PRESETS", "build", "preset"]

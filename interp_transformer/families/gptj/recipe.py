"""GPT-J: config, parts, capabilities and hook names.

A pre-LayerNorm causal decoder whose blocks have one norm read by both attention and
MLP (``ParallelBlock`` with a shared norm: ``ln2=None``)::

    normalized = ln1(resid_pre)
    resid_post = resid_pre + attn(normalized) + mlp(normalized)

so there is no ``ln2`` and no ``hook_resid_mid``. Positions rotate queries and keys
(``Rotary``) on the first ``rotary_dim`` dimensions of each head, in GPT-J's interleaved
layout: dimensions ``(2i, 2i + 1)`` form a pair, where GPT-NeoX and Llama pair ``(i, i +
rotary_dim/2)``. Attention has no biases; the MLP (tanh GELU) and the read-out do.
"""

import dataclasses
from dataclasses import dataclass

from interp_transformer.families.gpt_neox.recipe import HOOK_NAMES as NEOX_HOOK_NAMES
from interp_transformer.families.recipe_parts import (
    PRE_NORM_DECODER,
    decoder_parts,
    fixed_architecture,
    layer_norms,
    rotary_positions_note,
)
from interp_transformer.families.registry import DecoderParts
from interp_transformer.families.validation import check_bools, check_optional_positive_int, validate_common_fields
from interp_transformer.parts import MLP, Attention, ParallelBlock
from interp_transformer.parts.rotary import Rotary

GPTJ_ROTARY_BASE = 10000.0  # fixed in GPT-J's code: its config has no field for it


@dataclass(frozen=True)
class GPTJConfig:
    """Shape and numerics of a GPT-J decoder (defaults: GPT-J-6B's shape)."""

    d_model: int = 4096  # width of the residual stream
    n_layers: int = 28  # number of transformer blocks
    n_heads: int = 16  # attention heads per block
    d_head: int = 256  # width of each head's query/key/value; d_model == n_heads * d_head
    d_mlp: int = 16384  # MLP hidden width (neurons per layer)
    d_vocab: int = 50400  # vocabulary size (GPT-2's BPE, padded)
    n_ctx: int = 2048  # longest sequence (Hugging Face's n_positions)
    rotary_dim: int | None = 64  # leading dimensions of each head that rotate; None: all of them
    tied_embeddings: bool = False  # the checkpoint's read-out weight is its token embedding (no lm_head.weight)
    act_fn: str = "gelu_new"  # GPT-2's tanh GELU
    layer_norm_eps: float = 1e-5  # added to the variance inside every LayerNorm
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_common_fields(self, ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"))
        check_optional_positive_int(self, "rotary_dim")
        check_bools(self, ("tied_embeddings",))
        if self.rotary_dim is not None and (self.rotary_dim > self.d_head or self.rotary_dim % 2):
            raise ValueError(
                f"rotary_dim must be even and at most d_head={self.d_head} (or None), got {self.rotary_dim}"
            )
        if self.rotary_dim is None and self.d_head % 2:
            raise ValueError(f"rotating whole heads needs an even d_head, got {self.d_head}")

    def replace(self, **changes) -> "GPTJConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build(cfg: GPTJConfig) -> DecoderParts:
    """GPT-J's parts: interleaved partial rotary attention and an MLP reading one shared LayerNorm per block."""

    norm = layer_norms(cfg)

    def block(layer: int) -> ParallelBlock:
        rotary = Rotary(cfg.d_head, rotary_dim=cfg.rotary_dim, base=GPTJ_ROTARY_BASE, interleaved=True)
        return ParallelBlock(norm(), Attention(cfg, rotary=rotary), None, MLP(cfg))

    return decoder_parts(cfg, block, norm)


CAPABILITIES = PRE_NORM_DECODER

# GPT-NeoX's table with one norm per block: ("scale", L, "ln1") exists, ("scale", L, "ln2") is refused by name
HOOK_NAMES = dataclasses.replace(
    NEOX_HOOK_NAMES,
    sublayers=("ln1",),
    unavailable=rotary_positions_note("a GPT-J model"),
)

ARCHITECTURE = fixed_architecture("gptj", GPTJConfig, build, HOOK_NAMES, CAPABILITIES)

__all__ = ["ARCHITECTURE", "CAPABILITIES", "GPTJConfig", "HOOK_NAMES", "build"]

"""SmolLM3: Llama's decoder with some layers left without positions (NoPE) and, optionally, sliding layers.

Every part is Llama's (``architectures.llama``); what differs is chosen per layer:

- ``nope_layers``: the layers whose attention has no rotary positions (NoPE). Their q and k
  enter the scores as projected, so those layers have no ``hook_rot_q``/``hook_rot_k``.
  SmolLM3-3B leaves every fourth layer without (layers 3, 7, 11, ...; Hugging Face's
  ``no_rope_layers`` holds 0 for them, 1 for the rotary layers);
- ``sliding_layers``: with a ``sliding_window``, the layers whose queries see at most that many
  keys (themselves included); None: every layer, as in ``LlamaConfig``.

The fields of ``LlamaConfig`` keep their meaning (``qk_norm``, ``attn_biases``,
``rope_scaling``, ...), so a SmolLM3 config is a ``LlamaConfig`` with the two fields above.
"""

from dataclasses import dataclass

from interp_transformer.families.llama import recipe as llama
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.recipe_parts import (
    decoder_parts,
    fixed_architecture,
    grouped_attention,
    head_rms_norms,
    rms_norms,
)
from interp_transformer.families.registry import DecoderParts
from interp_transformer.hooks.names import HookNames
from interp_transformer.parts import Attention, PreNormBlock
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.rotary import Rotary

NOPE_INTERVAL = 4  # without nope_layers, every fourth layer has no rotary positions (Hugging Face's default)


def _check_layers(field: str, layers, n_layers: int) -> None:
    if layers is None:
        return
    valid = isinstance(layers, tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
    if not valid or len(set(layers)) != len(layers) or any(not 0 <= i < n_layers for i in layers):
        raise ValueError(
            f"{field} must be a tuple of distinct layer indices in [0, n_layers={n_layers}), got {layers!r}"
        )


@dataclass(frozen=True)
class SmolLM3Config(LlamaConfig):
    """Shape and numerics of a SmolLM3 decoder (defaults: Hugging Face's, SmolLM3-3B's shape)."""

    d_model: int = 2048  # width of the residual stream
    n_layers: int = 36  # number of transformer blocks
    n_heads: int = 16  # query heads per block
    n_key_value_heads: int = 4  # key/value heads per block, each shared by n_heads / n_key_value_heads query heads
    d_head: int = 128  # width of each head's query/key/value
    d_mlp: int = 11008  # hidden width of the gated MLP (neurons per layer)
    d_vocab: int = 128256  # vocabulary size
    n_ctx: int = 32768  # longest sequence (Hugging Face's max_position_embeddings)
    rms_norm_eps: float = 1e-6  # added to mean(x^2) inside every RMSNorm
    rotary_base: float = 2000000.0  # rotary theta of the rotary layers
    nope_layers: tuple[int, ...] | None = None  # layers without rotary positions; None: every fourth (3, 7, ...)
    sliding_layers: tuple[int, ...] | None = None  # with sliding_window, the layers that slide (None: all)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_layers("nope_layers", self.nope_layers, self.n_layers)
        _check_layers("sliding_layers", self.sliding_layers, self.n_layers)
        if self.sliding_layers is not None and self.sliding_window is None:
            raise ValueError(f"sliding_layers={self.sliding_layers} need a sliding_window, got None")

    def uses_rotary(self, layer: int) -> bool:
        """Whether block ``layer``'s attention rotates q and k (False: a NoPE layer)."""
        if self.nope_layers is None:
            return (layer + 1) % NOPE_INTERVAL != 0
        return layer not in self.nope_layers

    def window(self, layer: int) -> int | None:
        """The sliding window of block ``layer``, or None where it sees every earlier key."""
        slides = self.sliding_layers is None or layer in self.sliding_layers
        return self.sliding_window if slides else None


def smollm3_attention(cfg: SmolLM3Config, layer: int) -> Attention:
    """Llama's attention for block ``layer``: rotary unless it is a NoPE layer, a window where it slides."""
    rotary = Rotary(cfg.d_head, base=cfg.rotary_base, scaling=cfg.rope_scaling) if cfg.uses_rotary(layer) else None
    return grouped_attention(cfg, cfg.window(layer), rotary, **head_rms_norms(cfg))


def build(cfg: SmolLM3Config) -> DecoderParts:
    """SmolLM3's parts: Llama's blocks, each attention rotary or NoPE, windowed or not, as its layer says."""

    norm = rms_norms(cfg)

    # no positional embedding: positions act inside the attention of the rotary layers
    return decoder_parts(
        cfg, lambda layer: PreNormBlock(norm(), smollm3_attention(cfg, layer), norm(), GatedMLP(cfg)), norm
    )


HOOK_NAMES = HookNames(
    layer_keys=dict(llama.HOOK_NAMES.layer_keys),  # rot_q, rot_k: in the rotary layers only
    global_keys=dict(llama.HOOK_NAMES.global_keys),
    input_writers=("embed",),
    unavailable={
        "pos_embed": "a SmolLM3 model has no positional embedding: its positions rotate q and k inside the attention "
        "of its rotary layers (cache['rot_q', L], cache['rot_k', L]); its NoPE layers have none",
    },
)

ARCHITECTURE = fixed_architecture("smollm3", SmolLM3Config, build, HOOK_NAMES, llama.CAPABILITIES)

__all__ = ["ARCHITECTURE", "HOOK_NAMES", "NOPE_INTERVAL", "SmolLM3Config", "build", "smollm3_attention"]

"""The OLMo 2 and OLMo 3 family: config, parts, capabilities, hook names.

A causal decoder with the Llama family's rotary grouped-query attention and gated MLP, whose
norms sit *after* each sublayer, on what it writes, and nowhere before it::

    attn_out   = ln1_post(attn(resid_pre))
    resid_mid  = resid_pre + attn_out
    mlp_out    = ln2_post(mlp(resid_mid))
    resid_post = resid_mid + mlp_out
    logits     = ln_final(resid_final) W_U

Attention and the MLP read the residual stream as it is (a ``PreNormBlock`` without pre norms: its
``norm_readers()`` is empty, so tools learn that no norm stands between the stream and a
sublayer). The stream is still a sum of writes, each passed through its output norm (the
writers' ``output_norm``), so direct logit attribution and the residual decompositions apply.

Two more parts differ from Llama's:

- q/k norms over *all* heads together (``AllHeadsRMSNorm``: one scale per position over
  ``n_heads * d_head``, not one per head), after ``hook_q``/``hook_k`` and before the rotation;
- OLMo 3's sliding-window layers (``layer_types``, ``sliding_window``), whose rotary settings
  may differ from the full-attention layers' (``rotary_base_local``, ``rope_scaling_local``).

OLMo 2 is the config with ``layer_types=None`` (every block full attention).
"""

from dataclasses import dataclass

from interp_transformer.families.llama.recipe import HOOK_NAMES as LLAMA_HOOK_NAMES
from interp_transformer.families.recipe_parts import (
    PRE_NORM_DECODER,
    decoder_parts,
    fixed_architecture,
    grouped_attention,
    rms_norms,
    rotary_positions_note,
)
from interp_transformer.families.registry import DecoderParts
from interp_transformer.families.rotary_decoder import (
    RotaryDecoderConfig,
    check_layer_types,
    gated_decoder_params,
    validate_rotary_decoder,
)
from interp_transformer.families.validation import check_bools, check_positive_int, check_positive_number
from interp_transformer.hooks.names import HookNames
from interp_transformer.parts import Attention
from interp_transformer.parts.all_heads_norm import AllHeadsRMSNorm
from interp_transformer.parts.blocks import PreNormBlock
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.rotary import RopeScaling, Rotary

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class Olmo2Config(RotaryDecoderConfig):
    """Shape and numerics of an OLMo 2 or OLMo 3 decoder (defaults: OLMo-2-1124-7B's shape)."""

    d_model: int = 4096  # width of the residual stream
    n_layers: int = 32  # number of transformer blocks
    n_heads: int = 32  # query heads per block
    n_key_value_heads: int = 32  # key/value heads, each shared by n_heads / n_key_value_heads query heads
    d_head: int = 128  # width of each head's query/key/value; need not be d_model / n_heads
    d_mlp: int = 11008  # hidden width of the gated MLP (neurons per layer)
    d_vocab: int = 100352  # vocabulary size
    n_ctx: int = 4096  # longest sequence (Hugging Face's max_position_embeddings)
    act_fn: str = "silu"  # the gate's activation (SwiGLU: silu)
    rms_norm_eps: float = 1e-6  # added to mean(x^2) inside every norm (the q/k norms included)
    rotary_base: float = 500000.0  # rotary theta of the full-attention layers
    rope_scaling: RopeScaling | None = None  # stretched rotary frequencies of the full-attention layers
    layer_types: tuple[str, ...] | None = None  # OLMo 3: "full_attention" or "sliding_attention" per block
    sliding_window: int | None = None  # OLMo 3: keys a sliding layer's query sees (itself included)
    rotary_base_local: float | None = None  # OLMo 3: the sliding layers' rotary theta; None: rotary_base
    rope_scaling_local: RopeScaling | None = None  # OLMo 3: the sliding layers' rotary scaling; None: unscaled
    attn_biases: tuple[str, ...] = ()  # projections with biases in the checkpoint (attention_bias: q, k, v, o)
    tied_embeddings: bool = False  # the checkpoint's read-out is its token embedding (no lm_head.weight)
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_rotary_decoder(self)
        check_bools(self, ("tied_embeddings",))
        check_layer_types(self, LAYER_TYPES)
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        if any(self.is_sliding(layer) for layer in range(self.n_layers)) and self.sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers: give their sliding_window (a positive int)")
        if self.rotary_base_local is not None:
            check_positive_number("rotary_base_local", self.rotary_base_local, above=1.0)
        if self.rope_scaling_local is not None and not isinstance(self.rope_scaling_local, RopeScaling):
            raise TypeError(
                f"rope_scaling_local must be a RopeScaling or None, got {type(self.rope_scaling_local).__name__}"
            )

    @property
    def qk_norm(self) -> bool:
        """Always True: q and k are normalized, over all heads together (``AllHeadsRMSNorm``)."""
        return True

    def is_sliding(self, layer: int) -> bool:
        """Whether block ``layer`` attends within the sliding window."""
        return self.layer_types is not None and self.layer_types[layer] == "sliding_attention"

    def n_params(self, hugging_face: bool = False) -> int:
        """Number of parameters of a ``DemoTransformer`` built from this config.

        ``hugging_face=True`` counts as Hugging Face reports the checkpoint: only the biases
        in ``attn_biases``, no MLP or read-out biases, and no read-out matrix of its own when
        ``tied_embeddings``.
        """
        qk_norms = (self.n_heads + self.n_key_value_heads) * self.d_head
        return gated_decoder_params(self, hugging_face, False, extra=qk_norms)


def rotary(cfg: Olmo2Config, layer: int) -> Rotary:
    """Block ``layer``'s rotation: the sliding layers' own base and scaling, or the full-attention layers'."""
    if cfg.is_sliding(layer):
        base = cfg.rotary_base if cfg.rotary_base_local is None else cfg.rotary_base_local
        return Rotary(cfg.d_head, base=base, scaling=cfg.rope_scaling_local)
    return Rotary(cfg.d_head, base=cfg.rotary_base, scaling=cfg.rope_scaling)


def attention(cfg: Olmo2Config, layer: int) -> Attention:
    """Rotary grouped-query attention with q/k norms over all heads; a sliding window where ``layer_types`` says."""
    # a sliding layer has its window (the config refuses one without)
    return grouped_attention(
        cfg,
        cfg.sliding_window if cfg.is_sliding(layer) else None,
        rotary(cfg, layer),
        q_norm=AllHeadsRMSNorm(cfg.n_heads, cfg.d_head, cfg.rms_norm_eps),
        k_norm=AllHeadsRMSNorm(cfg.n_key_value_heads, cfg.d_head, cfg.rms_norm_eps),
    )


def build(cfg: Olmo2Config) -> DecoderParts:
    """OLMo's parts: blocks with norms after attention and the MLP only, a final RMSNorm, no positional embedding."""

    norm = rms_norms(cfg)

    def block(layer: int) -> PreNormBlock:
        return PreNormBlock(None, attention(cfg, layer), ln1_post=norm(), mlp=GatedMLP(cfg), ln2_post=norm())

    return decoder_parts(cfg, block, norm)


# the stream is a sum of writes read by a final norm (module docstring): pre-norm's facts
CAPABILITIES = PRE_NORM_DECODER

HOOK_NAMES = HookNames(
    layer_keys=LLAMA_HOOK_NAMES.layer_keys,
    global_keys=LLAMA_HOOK_NAMES.global_keys,
    sublayers=("ln1_post", "ln2_post"),  # the only norms of a block: ("scale", L, "ln1_post") ...
    input_writers=("embed",),
    unavailable=rotary_positions_note("an OLMo model"),
)

ARCHITECTURE = fixed_architecture("olmo2", Olmo2Config, build, HOOK_NAMES, CAPABILITIES)

__all__ = ["ARCHITECTURE", "CAPABILITIES", "HOOK_NAMES", "LAYER_TYPES", "Olmo2Config", "attention", "build", "rotary"]

"""The Gemma family (Gemma 1, 2 and 3 text models): config, presets, parts, capabilities, hook names.

A pre-norm causal decoder with rotary grouped-query attention and a gated MLP, like
Llama, with these parts changed:

- ``GemmaRMSNorm`` everywhere: the gain is ``1 + w_offset`` (its algebra is its own);
- ``ScaledEmbed``: the token embedding multiplied by ``sqrt(d_model)`` in the model's dtype;
- GeGLU: the gate's activation is the tanh GELU (``act_fn="gelu_new"``);
- ``d_head * n_heads`` need not be ``d_model`` (Gemma 7B: 16 x 256 = 4096 for 3072).

and the variants, as fields (Gemma 1 sets none of them):

============================  ==========================================================
``post_norms``                Gemma 2/3: norms after attention and the MLP too
                              (``PreNormBlock`` with ``ln1_post``, ``ln2_post``)
``query_pre_attn_scalar``     Gemma 2/3: scores scaled by ``query_pre_attn_scalar^-1/2``
                              instead of ``d_head^-1/2``
``attn_softcap``              Gemma 2: ``cap * tanh(scores / cap)`` before the softmax
``final_softcap``             Gemma 2: ``cap * tanh(logits / cap)``
``sliding_window``,           Gemma 2/3: layer ``L`` attends within a window of
``global_every``              ``sliding_window`` keys unless ``(L + 1) % global_every == 0``
                              (Gemma 2: every 2nd layer is global; Gemma 3: every 6th)
``qk_norm``                   Gemma 3: a ``GemmaRMSNorm`` over ``d_head`` on q and k
``rotary_base_local``         Gemma 3: the sliding layers' rotary base (10000), unscaled,
                              beside the global layers' ``rotary_base`` and ``rope_scaling``
============================  ==========================================================
"""

from dataclasses import dataclass
from typing import Any

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.llama.recipe import HOOK_NAMES as LLAMA_HOOK_NAMES
from interp_transformer.families.recipe_parts import (
    PRE_NORM_DECODER,
    decoder_parts,
    grouped_attention,
    rotary_positions_note,
)
from interp_transformer.families.registry import Architecture, DecoderParts
from interp_transformer.families.rotary_decoder import (
    RotaryDecoderConfig,
    find_preset,
    gated_decoder_params,
    validate_rotary_decoder,
)
from interp_transformer.families.validation import check_bools, check_positive_int, check_positive_number
from interp_transformer.hooks.names import HookNames
from interp_transformer.parts import Attention, PreNormBlock, Unembed
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.gemma_norm import GemmaRMSNorm
from interp_transformer.parts.rotary import RopeScaling, Rotary
from interp_transformer.parts.scaled_embed import ScaledEmbed


@dataclass(frozen=True)
class GemmaConfig(RotaryDecoderConfig):
    """Shape and numerics of a Gemma decoder (defaults: Gemma 2 2B's shape)."""

    d_model: int = 2304  # width of the residual stream
    n_layers: int = 26  # number of transformer blocks
    n_heads: int = 8  # query heads per block
    n_key_value_heads: int = 4  # key/value heads, each shared by n_heads / n_key_value_heads query heads
    d_head: int = 256  # width of each head's query/key/value; need not be d_model / n_heads
    d_mlp: int = 9216  # hidden width of the gated MLP (neurons per layer)
    d_vocab: int = 256000  # vocabulary size
    n_ctx: int = 8192  # longest sequence (Hugging Face's max_position_embeddings)
    act_fn: str = "gelu_new"  # the gate's activation: GeGLU with the tanh GELU
    rms_norm_eps: float = 1e-6  # added to mean(x^2) inside every norm
    rotary_base: float = 10000.0  # rotary theta of every layer, or (with rotary_base_local) of the global layers
    rotary_base_local: float | None = None  # Gemma 3: sliding layers' rotary theta (unscaled); None: the global one
    rope_scaling: RopeScaling | None = None  # stretched rotary frequencies (Gemma 3 4B and up: linear, factor 8)
    query_pre_attn_scalar: float | None = 256.0  # scores scaled by its -1/2 power; None: d_head's (Gemma 1)
    post_norms: bool = True  # Gemma 2/3: a norm after attention and after the MLP too
    qk_norm: bool = False  # Gemma 3: GemmaRMSNorm over d_head on each head's q and k, before the rotation
    attn_softcap: float | None = 50.0  # Gemma 2: scores -> cap * tanh(scores / cap) before the softmax
    final_softcap: float | None = 30.0  # Gemma 2: logits -> cap * tanh(logits / cap)
    sliding_window: int | None = 4096  # keys a sliding query sees (itself included); None: all global
    global_every: int | None = 2  # layer L is global when (L + 1) % global_every == 0; None: every layer slides
    attn_biases: tuple[str, ...] = ()  # projections with biases in the checkpoint (attention_bias: q, k, v, o)
    tied_embeddings: bool = True  # the checkpoint's read-out is its token embedding
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_rotary_decoder(self)
        optional = {"rotary_base_local": 1.0, "query_pre_attn_scalar": 0.0, "attn_softcap": 0.0, "final_softcap": 0.0}
        for field, above in optional.items():
            if getattr(self, field) is not None:
                check_positive_number(field, getattr(self, field), above=above)
        for field in ("sliding_window", "global_every"):
            if getattr(self, field) is not None:
                check_positive_int(field, getattr(self, field))
        check_bools(self, ("post_norms", "qk_norm", "tied_embeddings"))

    @property
    def attention_scale(self) -> float:
        """What ``q . k`` is multiplied by: ``query_pre_attn_scalar^-1/2``, or ``d_head^-1/2``."""
        return (self.d_head if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        """Whether block ``layer`` attends within the sliding window."""
        if self.sliding_window is None:
            return False
        return self.global_every is None or (layer + 1) % self.global_every != 0

    @property
    def layer_types(self) -> tuple[str, ...]:
        """``"sliding_attention"`` or ``"full_attention"`` per block, as Hugging Face's ``layer_types``."""
        return tuple(
            "sliding_attention" if self.is_sliding(layer) else "full_attention" for layer in range(self.n_layers)
        )

    def n_params(self, hugging_face: bool = False) -> int:
        """Number of parameters of a ``DemoTransformer`` built from this config.

        ``hugging_face=True`` counts as Hugging Face reports the checkpoint: only the biases
        in ``attn_biases``, and no read-out matrix of its own when ``tied_embeddings``
        (Gemma 2 2B: 2,614,341,888).
        """
        return gated_decoder_params(self, hugging_face, self.qk_norm, norms=4 if self.post_norms else 2)


GEMMA_1: dict[str, Any] = dict(
    act_fn="gelu_new",
    query_pre_attn_scalar=None,
    post_norms=False,
    attn_softcap=None,
    final_softcap=None,
    sliding_window=None,
    global_every=None,
    d_vocab=256000,
)
GEMMA_2: dict[str, Any] = dict(
    query_pre_attn_scalar=256.0,
    post_norms=True,
    attn_softcap=50.0,
    final_softcap=30.0,
    sliding_window=4096,
    global_every=2,
    d_vocab=256000,
)
GEMMA_3: dict[str, Any] = dict(
    rotary_base=1_000_000.0,
    rotary_base_local=10000.0,
    query_pre_attn_scalar=256.0,
    post_norms=True,
    qk_norm=True,
    attn_softcap=None,
    final_softcap=None,
    global_every=6,
    d_vocab=262144,
)

# Parameter counts as Hugging Face reports them, n_params(hugging_face=True).
PRESETS: dict[str, GemmaConfig] = {
    "gemma-2b": GemmaConfig(
        name="gemma-2b", d_model=2048, n_layers=18, n_heads=8, n_key_value_heads=1, d_head=256, d_mlp=16384, **GEMMA_1
    ),  # 2,506,172,416
    "gemma-7b": GemmaConfig(
        name="gemma-7b", d_model=3072, n_layers=28, n_heads=16, n_key_value_heads=16, d_head=256, d_mlp=24576, **GEMMA_1
    ),  # 8,537,680,896
    "gemma-2-2b": GemmaConfig(name="gemma-2-2b", **GEMMA_2),  # 2,614,341,888
    "gemma-2-9b": GemmaConfig(
        name="gemma-2-9b",
        d_model=3584,
        n_layers=42,
        n_heads=16,
        n_key_value_heads=8,
        d_head=256,
        d_mlp=14336,
        **GEMMA_2,
    ),  # 9,241,705,984
    "gemma-3-1b": GemmaConfig(
        name="gemma-3-1b",
        d_model=1152,
        n_layers=26,
        n_heads=4,
        n_key_value_heads=1,
        d_head=256,
        d_mlp=6912,
        n_ctx=32768,
        sliding_window=512,
        **GEMMA_3,
    ),  # 999,885,952
}


def preset(name: str) -> GemmaConfig:
    """The config of a named Gemma model, e.g. ``preset("gemma-2-2b")``."""
    return find_preset(PRESETS, name)


def build(cfg: GemmaConfig) -> DecoderParts:
    """Gemma's parts: a scaled embedding, pre-norm (Gemma 2/3: pre- and post-norm) blocks, an optionally capped
    read-out."""

    def norm(width: int) -> GemmaRMSNorm:
        return GemmaRMSNorm(width, cfg.rms_norm_eps)

    def attention(layer: int) -> Attention:
        sliding = cfg.is_sliding(layer)  # False without a window
        local_base = cfg.rotary_base_local if sliding else None  # Gemma 3's local layers: their own base, unscaled
        local = local_base is not None
        rotary = Rotary(
            cfg.d_head,
            base=cfg.rotary_base if local_base is None else local_base,
            scaling=None if local else cfg.rope_scaling,
        )
        head_norms: dict[str, Any] = dict(q_norm=norm(cfg.d_head), k_norm=norm(cfg.d_head)) if cfg.qk_norm else {}
        window = cfg.sliding_window if sliding else None
        return grouped_attention(cfg, window, rotary, scale=cfg.attention_scale, softcap=cfg.attn_softcap, **head_norms)

    def block(layer: int):
        d = cfg.d_model
        if cfg.post_norms:
            return PreNormBlock(
                norm(d), attention(layer), ln1_post=norm(d), ln2=norm(d), mlp=GatedMLP(cfg), ln2_post=norm(d)
            )
        return PreNormBlock(norm(d), attention(layer), norm(d), GatedMLP(cfg))

    embed = ScaledEmbed(cfg, round_scale=True)
    return decoder_parts(cfg, block, lambda: norm(cfg.d_model), embed, unembed=Unembed(cfg, cfg.final_softcap))


def capabilities(cfg: GemmaConfig) -> Capabilities:
    """A pre-norm causal decoder; Gemma 2/3 add the post norms, Gemma 2 the capped logits."""
    return PRE_NORM_DECODER


HOOK_NAMES = HookNames(
    layer_keys={**LLAMA_HOOK_NAMES.layer_keys, "attn_scores_uncapped": "blocks.{layer}.attn.hook_attn_scores_uncapped"},
    global_keys={**LLAMA_HOOK_NAMES.global_keys, "logits_uncapped": "unembed.hook_logits_uncapped"},
    sublayers=("ln1", "ln2", "ln1_post", "ln2_post"),
    input_writers=("embed",),
    unavailable=rotary_positions_note("a Gemma model"),
)

ARCHITECTURE = Architecture(
    name="gemma", config_class=GemmaConfig, build=build, capabilities=capabilities, hook_names=HOOK_NAMES
)

__all__ = ["ARCHITECTURE", "GemmaConfig", "HOOK_NAMES", "PRESETS", "build", "capabilities", "preset"]

"""gpt-oss (OpenAI's open-weight mixtures of experts): config, presets, parts, capabilities, hook names.

A pre-RMSNorm causal decoder with rotary grouped-query attention and a mixture of experts
in every block, like Mixtral, with these parts changed:

- attention sinks: each head has a learned logit that joins every query's softmax and is
  dropped after it (``AttentionSinks``, hooked as ``attn.sinks.hook_logits``), so a pattern
  row sums to at most 1;
- ``layer_types``: each block attends within a window of ``sliding_window`` keys or to
  every earlier key (by default even blocks slide, odd blocks see everything);
- biases on the q, k, v and o projections;
- YaRN rotary frequencies (``RopeScaling("yarn", ...)``: cos and sin scaled too);
- a router with a bias that picks the top ``experts_per_token`` experts by their logits and
  takes the softmax over those alone (``routing_order="top_k_then_softmax"``);
- experts that are clamped SwiGLUs with biases (``ClampedSwiGLU``: the gate clipped at
  ``swiglu_limit`` from above, the up projection on both sides, ``(up + 1) * g *
  sigmoid(swiglu_alpha g)``).

``d_mlp`` is one expert's width. As for every mixture, the experts' weights are per expert
(``blocks[L].mlp.experts[E].W_in``, ``blocks[L].mlp.stacked("W_in")``).
"""

from dataclasses import dataclass

from interp_transformer.families.moe.recipe import HOOK_NAMES as MOE_HOOK_NAMES
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
    attention_params,
    check_layer_types,
    embedding_params,
    find_preset,
    validate_mixture_decoder,
)
from interp_transformer.families.validation import check_bools, check_positive_int, check_positive_number
from interp_transformer.hooks.names import HookNames
from interp_transformer.parts import Attention, PreNormBlock
from interp_transformer.parts.attention_sinks import AttentionSinks
from interp_transformer.parts.clamped_swiglu import ClampedSwiGLU
from interp_transformer.parts.moe import MixtureOfExperts
from interp_transformer.parts.rotary import RopeScaling, Rotary

LAYER_TYPES = ("sliding_attention", "full_attention")
GPT_OSS_ROPE = RopeScaling("yarn", 32.0, original_max_position_embeddings=4096, truncate=False)


@dataclass(frozen=True)
class GptOssConfig(RotaryDecoderConfig):
    """Shape and numerics of a gpt-oss decoder (defaults: gpt-oss-20b's shape)."""

    d_model: int = 2880  # width of the residual stream
    n_layers: int = 24  # number of transformer blocks
    n_heads: int = 64  # query heads per block
    n_key_value_heads: int = 8  # key/value heads, each shared by n_heads / n_key_value_heads query heads
    d_head: int = 64  # width of each head's query/key/value; need not be d_model / n_heads
    d_mlp: int = 2880  # hidden width of one expert (neurons per expert)
    n_experts: int = 32  # experts per mixture
    experts_per_token: int = 4  # experts the router picks for each token (top_k)
    d_vocab: int = 201088  # vocabulary size
    n_ctx: int = 131072  # longest sequence (Hugging Face's max_position_embeddings)
    rms_norm_eps: float = 1e-5  # added to mean(x^2) inside every RMSNorm
    rotary_base: float = 150000.0  # rotary theta
    rope_scaling: RopeScaling | None = GPT_OSS_ROPE  # stretched rotary frequencies (YaRN, factor 32)
    sliding_window: int | None = 128  # keys a sliding block's query sees (itself included)
    layer_types: tuple[str, ...] | None = None  # per block; None: even blocks sliding_attention, odd full_attention
    swiglu_alpha: float = 1.702  # the experts' gate: g * sigmoid(swiglu_alpha * g)
    swiglu_limit: float = 7.0  # the experts' gate is clipped above at it, the up projection to [-it, it]
    attn_biases: tuple[str, ...] = ("q", "k", "v", "o")  # projections with biases in the checkpoint
    tied_embeddings: bool = False  # the checkpoint's read-out is its token embedding
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_mixture_decoder(self)
        check_layer_types(self, LAYER_TYPES)
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        elif any(self.is_sliding(layer) for layer in range(self.n_layers)):
            raise ValueError("layer_types has sliding_attention blocks: give their sliding_window (a positive int)")
        for field in ("swiglu_alpha", "swiglu_limit"):
            check_positive_number(field, getattr(self, field))
        check_bools(self, ("tied_embeddings",))

    @property
    def act_fn(self) -> str:
        """``"silu"``: the experts' gate is ``g * sigmoid(swiglu_alpha * g)``, a SiLU with gain ``swiglu_alpha``."""
        return "silu"

    @property
    def qk_norm(self) -> bool:
        """Always False: q and k are not normalized (read by the Llama family's converter)."""
        return False

    def is_sliding(self, layer: int) -> bool:
        """Whether block ``layer`` attends within the sliding window (``layer_types`` None: the even blocks)."""
        if self.layer_types is None:
            return layer % 2 == 0
        return self.layer_types[layer] == "sliding_attention"

    def n_params(self, hugging_face: bool = False) -> int:
        """Number of parameters of a ``DemoTransformer`` built from this config.

        ``hugging_face=True`` counts as Hugging Face reports the checkpoint: only the
        attention biases in ``attn_biases``, no read-out bias, no read-out of its own when
        tied (gpt-oss-20b: 20,914,757,184). Every expert and the router have biases in both.
        """
        d, d_mlp = self.d_model, self.d_mlp
        expert = 3 * d * d_mlp + 2 * d_mlp + d  # gate and up (with biases), down (with its bias)
        mixture = d * self.n_experts + self.n_experts + self.n_experts * expert
        attention = attention_params(self, hugging_face, False) + self.n_heads  # one sink per head
        return self.n_layers * (2 * d + attention + mixture) + embedding_params(self, hugging_face)


# Parameter counts as Hugging Face reports them, n_params(hugging_face=True).
PRESETS: dict[str, GptOssConfig] = {
    "gpt-oss-20b": GptOssConfig(name="gpt-oss-20b"),  # 20,914,757,184
    "gpt-oss-120b": GptOssConfig(name="gpt-oss-120b", n_layers=36, n_experts=128),  # 116,829,156,672
}


def preset(name: str) -> GptOssConfig:
    """The config of a named gpt-oss model, e.g. ``preset("gpt-oss-20b")``."""
    return find_preset(PRESETS, name)


def attention(cfg: GptOssConfig, layer: int) -> Attention:
    """Rotary grouped-query attention with sinks, in a sliding window where ``layer_types`` says."""
    # a sliding layer has its window (the config refuses one without)
    window = cfg.sliding_window if cfg.is_sliding(layer) else None
    rotary = Rotary(cfg.d_head, base=cfg.rotary_base, scaling=cfg.rope_scaling)
    return grouped_attention(cfg, window, rotary, sinks=AttentionSinks(cfg.n_heads))


def mixture(cfg: GptOssConfig) -> MixtureOfExperts:
    """A router with a bias, top-k of its logits then a softmax over those, and clamped SwiGLU experts."""
    return MixtureOfExperts(
        cfg.d_model,
        cfg.d_mlp,
        cfg.n_experts,
        cfg.experts_per_token,
        cfg.act_fn,
        normalize_routing=True,  # the softmax over the chosen experts sums to 1
        expert_part=ClampedSwiGLU,
        router_bias=True,
        expert_settings=dict(swiglu_alpha=cfg.swiglu_alpha, swiglu_limit=cfg.swiglu_limit),
        routing_order="top_k_then_softmax",
    )


def build(cfg: GptOssConfig) -> DecoderParts:
    """gpt-oss's parts: RMSNorm pre-norm blocks of attention with sinks and a mixture of experts; no positional
    embedding."""

    norm = rms_norms(cfg)

    return decoder_parts(cfg, lambda layer: PreNormBlock(norm(), attention(cfg, layer), norm(), mixture(cfg)), norm)


CAPABILITIES = PRE_NORM_DECODER

HOOK_NAMES = HookNames(
    layer_keys={
        **{name: path for name, path in MOE_HOOK_NAMES.layer_keys.items() if name != "shared_expert_gate"},
        "sink_logits": "blocks.{layer}.attn.sinks.hook_logits",
    },
    global_keys=dict(MOE_HOOK_NAMES.global_keys),
    input_writers=("embed",),
    unavailable=rotary_positions_note("a gpt-oss model"),
)

ARCHITECTURE = fixed_architecture("gpt_oss", GptOssConfig, build, HOOK_NAMES, CAPABILITIES)

__all__ = [
    "ARCHITECTURE",
    "CAPABILITIES",
    "GptOssConfig",
    "HOOK_NAMES",
    "LAYER_TYPES",
    "PRESETS",
    "attention",
    "build",
    "mixture",
    "preset",
]

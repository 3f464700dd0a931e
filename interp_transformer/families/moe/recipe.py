"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE): config, presets, parts, capabilities, hook names.

Llama's decoder (RMSNorm pre-norm blocks, rotary grouped-query attention; Qwen3-MoE's q/k
norms, Mistral's window) with the MLP of each block replaced by a ``MixtureOfExperts``: a
router picks ``experts_per_token`` of ``n_experts`` gated MLPs per token (see
``interp_transformer.parts.moe`` for the formula and its hooks). The variants are fields:

=======================  ===================================================================
``normalize_routing``    the chosen experts' softmax weights divided by their sum (Mixtral
                         always; Qwen's ``norm_topk_prob``)
``d_mlp_shared``         Qwen2-MoE: a shared expert every token uses, its output scaled by
                         ``sigmoid(x W_shared_gate)``
``dense_layers``,        Qwen's ``mlp_only_layers`` / ``decoder_sparse_step``: blocks with an
``d_mlp_dense``          ordinary gated MLP of width ``d_mlp_dense`` instead of experts
=======================  ===================================================================

``d_mlp`` is one expert's width. Stacked weights over layers (``model.W_in`` ...) have no
meaning with experts and raise, naming the per-expert weights (``blocks[L].mlp.experts[E].W_in``,
``blocks[L].mlp.stacked("W_in")``).
"""

from dataclasses import dataclass
from types import SimpleNamespace

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.llama.recipe import HOOK_NAMES as LLAMA_HOOK_NAMES
from interp_transformer.families.llama.recipe import rotary_attention
from interp_transformer.families.recipe_parts import PRE_NORM_DECODER, decoder_parts, rms_norms
from interp_transformer.families.registry import Architecture, DecoderParts
from interp_transformer.families.rotary_decoder import (
    RotaryDecoderConfig,
    attention_params,
    embedding_params,
    find_preset,
    gated_mlp_params,
    validate_mixture_decoder,
)
from interp_transformer.families.validation import check_bools, check_positive_int
from interp_transformer.hooks.names import HookNames
from interp_transformer.parts import PreNormBlock
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.mlp import MLP
from interp_transformer.parts.moe import MixtureOfExperts
from interp_transformer.parts.rotary import RopeScaling

EXPERT_MLPS = {"gated": GatedMLP, "plain": MLP}  # MoEConfig.expert_mlp: the part each expert is


@dataclass(frozen=True)
class MoEConfig(RotaryDecoderConfig):
    """Shape and numerics of a mixture-of-experts decoder (defaults: Mixtral 8x7B's shape)."""

    d_model: int = 4096  # width of the residual stream
    n_layers: int = 32  # number of transformer blocks
    n_heads: int = 32  # query heads per block
    n_key_value_heads: int = 8  # key/value heads, each shared by n_heads / n_key_value_heads query heads
    d_head: int = 128  # width of each head's query/key/value; need not be d_model / n_heads
    d_mlp: int = 14336  # hidden width of one expert (neurons per expert)
    n_experts: int = 8  # experts per mixture
    experts_per_token: int = 2  # experts the router picks for each token (top_k)
    normalize_routing: bool = True  # renormalise the chosen experts' weights (Mixtral; Qwen's norm_topk_prob)
    router_bias: bool = False  # the router has a bias b_router (designs written from scratch; no checkpoint here)
    expert_mlp: str = "gated"  # each expert: "gated" (SwiGLU, GatedMLP) or "plain" (Linear-act-Linear with biases, MLP)
    d_mlp_shared: int | None = None  # Qwen2-MoE: hidden width of the shared expert every token uses; None: none
    dense_layers: tuple[int, ...] = ()  # blocks with an ordinary gated MLP instead of experts (Qwen's mlp_only_layers)
    d_mlp_dense: int | None = None  # hidden width of those ordinary MLPs
    d_vocab: int = 32000  # vocabulary size
    n_ctx: int = 32768  # longest sequence (Hugging Face's max_position_embeddings)
    act_fn: str = "silu"  # the gates' activation (SwiGLU experts)
    rms_norm_eps: float = 1e-5  # added to mean(x^2) inside every RMSNorm
    rotary_base: float = 1_000_000.0  # rotary theta
    rope_scaling: RopeScaling | None = None  # stretched rotary frequencies
    sliding_window: int | None = None  # each query sees at most this many keys (itself included)
    qk_norm: bool = False  # Qwen3-MoE: RMSNorm over d_head on each head's q and k before the rotation
    attn_biases: tuple[str, ...] = ()  # projections with biases in the checkpoint (Qwen2-MoE: q, k, v)
    tied_embeddings: bool = False  # the checkpoint's read-out is its token embedding
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_mixture_decoder(self)
        if self.expert_mlp not in EXPERT_MLPS:
            raise ValueError(f"expert_mlp must be one of {tuple(EXPERT_MLPS)}, got {self.expert_mlp!r}")
        if not isinstance(self.router_bias, bool):
            raise TypeError(f"router_bias must be a bool, got {self.router_bias!r}")
        for field in ("d_mlp_shared", "d_mlp_dense", "sliding_window"):
            if getattr(self, field) is not None:
                check_positive_int(field, getattr(self, field))
        dense = self.dense_layers
        if (
            not isinstance(dense, tuple)
            or list(dense) != sorted(set(dense))
            or not all(
                isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < self.n_layers for layer in dense
            )
        ):
            raise ValueError(
                f"dense_layers must be a sorted tuple of distinct layers in [0, {self.n_layers}), got {dense!r}"
            )
        if bool(dense) != (self.d_mlp_dense is not None):
            raise ValueError(
                f"dense_layers={dense!r} and d_mlp_dense={self.d_mlp_dense!r}: the dense MLPs' width is "
                "given exactly when there are dense layers"
            )
        check_bools(self, ("normalize_routing", "qk_norm", "tied_embeddings"))

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The blocks whose MLP is a mixture of experts."""
        return tuple(layer for layer in range(self.n_layers) if layer not in self.dense_layers)

    def n_params(self, hugging_face: bool = False) -> int:
        """Number of parameters of a ``DemoTransformer`` built from this config.

        ``hugging_face=True`` counts as Hugging Face reports the checkpoint: only the biases
        in ``attn_biases``, no MLP or read-out biases, no read-out of its own when tied
        (Mixtral 8x7B: 46,702,792,704).
        """
        d = self.d_model

        moe = d * self.n_experts + self.n_experts * gated_mlp_params(self, self.d_mlp, hugging_face)
        if self.d_mlp_shared is not None:
            moe += gated_mlp_params(self, self.d_mlp_shared, hugging_face) + d
        mlps = len(self.moe_layers) * moe + len(self.dense_layers) * (
            gated_mlp_params(self, self.d_mlp_dense, hugging_face)
            if self.d_mlp_dense is not None
            else 0  # set exactly when dense_layers is
        )
        attention = attention_params(self, hugging_face, self.qk_norm)
        return self.n_layers * (2 * d + attention) + mlps + embedding_params(self, hugging_face)


# Parameter counts as Hugging Face reports them, n_params(hugging_face=True).
PRESETS: dict[str, MoEConfig] = {
    "Mixtral-8x7B": MoEConfig(name="Mixtral-8x7B"),  # 46,702,792,704
    "Qwen1.5-MoE-A2.7B": MoEConfig(  # 14,315,784,192
        name="Qwen1.5-MoE-A2.7B",
        d_model=2048,
        n_layers=24,
        n_heads=16,
        n_key_value_heads=16,
        d_head=128,
        d_mlp=1408,
        n_experts=60,
        experts_per_token=4,
        normalize_routing=False,
        d_mlp_shared=5632,
        d_vocab=151936,
        n_ctx=8192,
        rms_norm_eps=1e-6,
        attn_biases=("q", "k", "v"),
    ),
    "Qwen3-30B-A3B": MoEConfig(  # 30,532,122,624
        name="Qwen3-30B-A3B",
        d_model=2048,
        n_layers=48,
        n_heads=32,
        n_key_value_heads=4,
        d_head=128,
        d_mlp=768,
        n_experts=128,
        experts_per_token=8,
        normalize_routing=True,
        d_vocab=151936,
        n_ctx=40960,
        rms_norm_eps=1e-6,
        qk_norm=True,
    ),
}


def preset(name: str) -> MoEConfig:
    """The config of a named mixture-of-experts model, e.g. ``preset("Mixtral-8x7B")``."""
    return find_preset(PRESETS, name)


def build(cfg: MoEConfig) -> DecoderParts:
    """Llama's parts with a ``MixtureOfExperts`` as the MLP of every block not in ``dense_layers``."""

    norm = rms_norms(cfg)

    def mlp(layer: int):
        if layer in cfg.dense_layers:
            return GatedMLP(SimpleNamespace(d_model=cfg.d_model, d_mlp=cfg.d_mlp_dense, act_fn=cfg.act_fn))
        return MixtureOfExperts(
            cfg.d_model,
            cfg.d_mlp,
            cfg.n_experts,
            cfg.experts_per_token,
            cfg.act_fn,
            cfg.normalize_routing,
            cfg.d_mlp_shared,
            expert_part=EXPERT_MLPS[cfg.expert_mlp],
            router_bias=cfg.router_bias,
        )

    return decoder_parts(cfg, lambda layer: PreNormBlock(norm(), rotary_attention(cfg), norm(), mlp(layer)), norm)


def capabilities(cfg: MoEConfig) -> Capabilities:
    """A pre-norm causal decoder whose MLPs (all but ``dense_layers``) are mixtures of experts."""
    return PRE_NORM_DECODER


HOOK_NAMES = HookNames(
    layer_keys={
        **LLAMA_HOOK_NAMES.layer_keys,
        "router_logits": "blocks.{layer}.mlp.hook_router_logits",
        "expert_weights": "blocks.{layer}.mlp.hook_expert_weights",
        "expert_indices": "blocks.{layer}.mlp.hook_expert_indices",
        "routing_weights": "blocks.{layer}.mlp.hook_routing_weights",
        "shared_expert_gate": "blocks.{layer}.mlp.hook_shared_expert_gate",
    },
    global_keys=dict(LLAMA_HOOK_NAMES.global_keys),
    input_writers=("embed",),
    unavailable=dict(LLAMA_HOOK_NAMES.unavailable),
)

ARCHITECTURE = Architecture(
    name="moe", config_class=MoEConfig, build=build, capabilities=capabilities, hook_names=HOOK_NAMES
)

__all__ = ["ARCHITECTURE", "HOOK_NAMES", "MoEConfig", "PRESETS", "build", "capabilities", "preset"]

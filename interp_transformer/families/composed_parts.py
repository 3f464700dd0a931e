"""The vocabulary of composed models: the names a spec picks its parts by, their checks, and the parts they give.

``DecoderSpec`` (``architectures.composed``), ``EncoderSpec`` and ``EncoderDecoderSpec``
(``architectures.composed_stacks``) name their parts with the words below; the functions here
turn a word into the part from ``interp_transformer.parts``, so each choice is made in one
place for the three specs.

==============  ========================================================================================
field           choices and the part each gives
==============  ========================================================================================
``norm``        ``"layer"``: ``LayerNorm`` (PyTorch's ``nn.LayerNorm``); ``"layer_unbiased"``:
                ``UnbiasedLayerNorm`` (``(x - mean) / (std + eps)``, the Annotated Transformer's);
                ``"rms"``: ``RMSNorm``; ``"none"``: ``NoNorm`` (pre-norm decoders only)
``positions``   ``"learned"``: ``PosEmbed``; ``"sinusoidal"``: ``SinusoidalPosEmbed`` (sines, then cosines);
                ``"sinusoidal_interleaved"``: the same table with sine and cosine alternating;
                ``"rotary"``: ``Rotary`` inside attention; ``"alibi"``: ``ALiBi`` on the scores;
                ``"relative_clipped"``: ``ClippedRelativeBias`` on the scores; ``"relative_bucketed"``
                (encoder-decoders): T5's ``RelativePositionBias``, one table per stack read by every layer's
                ``SharedScoreBias``; ``"none"``: nothing
``activation``  any name of ``components.activations.ACTIVATIONS``
``embed_scale`` None: ``Embed``; a number or ``"sqrt_d_model"``: ``ScaledEmbed`` (``W_E[tokens] * scale``)
``qk_norm``     ``"per_head"``: an ``RMSNorm`` over ``d_head`` on each head's q and k (Qwen3, Gemma 3);
                ``"all_heads"``: ``AllHeadsRMSNorm``, one over every head together (OLMo 2); either after
                ``hook_q``/``hook_k`` and before the rotation (decoders)
==============  ========================================================================================

A decoder's attention is the one the families build (``attention(spec, causal, layer)``): grouped keys and
values with ``n_key_value_heads``, a ``SlidingWindowMask`` in place of the ``CausalMask`` on the layers
``is_sliding`` says, a ``Rotary`` of ``rotary_dim`` dimensions whose base is ``rotary_base_local`` on the
sliding layers when given, and ``Attention``'s ``softcap`` with ``attn_softcap``.

A bias a spec leaves out (``attn_bias=False`` ...) is a parameter held at zero: it stays in the
state dict, so every tool reads the same weights, and ``requires_grad`` is off.

Every spec's ``norm_eps`` defaults to ``NORM_EPS`` (1e-5, PyTorch's ``nn.LayerNorm``'s); BERT's 1e-12, T5's
1e-6 and the like are given explicitly. ``check_fits`` refuses a spec whose weights alone cannot fit in this
machine's memory, by the fields that size them, before any weight exists.
"""

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from interp_transformer.families.validation import check_bools, check_positive_int, check_positive_number
from interp_transformer.parts import (
    ALiBi,
    Attention,
    CausalMask,
    ClippedRelativeBias,
    Embed,
    LayerNorm,
    NoNorm,
    PaddingMask,
    PosEmbed,
    RMSNorm,
    Rotary,
    ScaledEmbed,
    SinusoidalPosEmbed,
    UnbiasedLayerNorm,
)
from interp_transformer.parts.activations import ACTIVATIONS
from interp_transformer.parts.all_heads_norm import AllHeadsRMSNorm
from interp_transformer.parts.masks import SlidingWindowMask
from interp_transformer.parts.relative_position_bias import RelativePositionBias, SharedScoreBias

NORMS = {"layer": LayerNorm, "layer_unbiased": UnbiasedLayerNorm, "rms": RMSNorm, "none": NoNorm}
PLACEMENTS = ("pre", "post")
ADDED_POSITIONS = ("learned", "sinusoidal", "sinusoidal_interleaved")  # added to the residual stream
ATTENTION_POSITIONS = ("rotary", "alibi", "relative_clipped")  # acting inside attention
POSITIONS = ADDED_POSITIONS + ATTENTION_POSITIONS + ("none",)
ENCODER_DECODER_POSITIONS = ADDED_POSITIONS + ("relative_bucketed", "none")  # T5's buckets: one table per stack
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128  # positions="relative_bucketed" with n_buckets / max_distance left None
NORM_EPS = 1e-5  # every spec's default norm eps (PyTorch's nn.LayerNorm's)
EXPERT_MLPS = ("plain", "gated")
QK_NORMS = ("per_head", "all_heads")  # Qwen3's and Gemma 3's norm of each head; OLMo 2's of every head together
LAYER_TYPES = ("full_attention", "sliding_attention")  # Hugging Face's layer_types
SQRT_D_MODEL = "sqrt_d_model"


def check_choice(field: str, value, choices) -> None:
    """``ValueError`` naming ``field``, the choices and the closest ones unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        close = difflib.get_close_matches(value, choices, n=3) if isinstance(value, str) else []
        hint = f"; closest: {close}" if close else ""
        raise ValueError(f"{field} must be one of {choices}, got {value!r}{hint}")


def check_shape(spec, fields: tuple[str, ...]) -> None:
    """Positive sizes, and ``d_head`` (None: ``d_model // n_heads``, which must then divide) filled in."""
    for field in fields:
        check_positive_int(field, getattr(spec, field))
    if spec.d_head is None:
        if spec.d_model % spec.n_heads:
            raise ValueError(
                f"d_model={spec.d_model} must be a multiple of n_heads={spec.n_heads} when d_head is not given"
            )
        object.__setattr__(spec, "d_head", spec.d_model // spec.n_heads)
    check_positive_int("d_head", spec.d_head)


def check_numerics(spec) -> None:
    """The fields every spec shares: the norm, its eps, the activation, the embedding scale, the init, the name."""
    check_choice("activation", spec.activation, ACTIVATIONS)
    check_positive_number("norm_eps", spec.norm_eps)
    check_positive_number("init_range", spec.init_range)
    scale = spec.embed_scale
    if scale is not None and scale != SQRT_D_MODEL:
        if isinstance(scale, str):
            raise ValueError(f"embed_scale must be None, a number or {SQRT_D_MODEL!r}, got {scale!r}")
        check_positive_number("embed_scale", scale)
    if not isinstance(spec.name, str):
        raise TypeError(f"name must be a str, got {type(spec.name).__name__}")


def _check_rotary(spec) -> None:
    """The rotary options: an even d_head, a base above 1, a bool interleaving, an even rotary_dim within d_head."""
    if spec.d_head % 2:
        raise ValueError(f"positions='rotary' rotates pairs of dimensions: d_head must be even, got {spec.d_head}")
    if spec.rotary_base is not None:
        check_positive_number("rotary_base", spec.rotary_base, above=1.0)
    if spec.rotary_interleaved is not None:
        check_bools(spec, ("rotary_interleaved",))
    rotary_dim = getattr(spec, "rotary_dim", None)
    if rotary_dim is not None and (
        isinstance(rotary_dim, bool)
        or not isinstance(rotary_dim, int)
        or not 0 < rotary_dim <= spec.d_head
        or rotary_dim % 2
    ):
        raise ValueError(
            f"rotary_dim (the leading dimensions of each head that rotate, in pairs) must be an even int in "
            f"[2, d_head={spec.d_head}], got {rotary_dim!r}"
        )


def check_positions(spec, allowed: tuple[str, ...]) -> None:
    """``positions`` one of ``allowed``, and each option of a kind of positions given only with it."""
    check_choice("positions", spec.positions, allowed)
    if spec.positions == "sinusoidal_interleaved" and spec.d_model % 2:
        raise ValueError(
            f"positions='sinusoidal_interleaved' pairs sines and cosines: d_model must be even, got {spec.d_model}"
        )
    options = {
        "rotary_base": ("rotary",),
        "rotary_interleaved": ("rotary",),
        "rotary_dim": ("rotary",),
        "rotary_base_local": ("rotary",),
        "alibi_slopes": ("alibi",),
        "max_distance": tuple(kind for kind in ("relative_clipped", "relative_bucketed") if kind in allowed),
        "n_buckets": ("relative_bucketed",),
    }
    for option, kinds in options.items():
        if getattr(spec, option, None) is not None and spec.positions not in kinds:
            kind = " or ".join(repr(kind) for kind in kinds)
            raise ValueError(f"{option} is read only with positions={kind}, got positions={spec.positions!r}")
    if spec.positions == "rotary":
        _check_rotary(spec)
    if spec.positions == "alibi" and spec.alibi_slopes is not None:
        slopes = spec.alibi_slopes
        if not isinstance(slopes, tuple) or len(slopes) != spec.n_heads:
            raise ValueError(f"alibi_slopes must be a tuple of one slope per head ({spec.n_heads}), got {slopes!r}")
        bad = [s for s in slopes if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < math.inf]
        if bad:
            raise ValueError(f"alibi_slopes must be positive and finite (a penalty growing with distance), got {bad}")
    if spec.positions == "relative_clipped":
        if spec.max_distance is None:
            raise ValueError("positions='relative_clipped' needs max_distance, the offset its bias is clipped at")
        check_positive_int("max_distance", spec.max_distance)
    if spec.positions == "relative_bucketed":
        for option in ("n_buckets", "max_distance"):
            if getattr(spec, option) is not None:
                check_positive_int(option, getattr(spec, option))
        with torch.device("meta"):  # the part checks its buckets leave room for exact and logarithmic ones
            relative_bias(spec, bidirectional=True), relative_bias(spec, bidirectional=False)


def machine_memory() -> int | None:
    """Bytes of physical memory on this machine (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        try:
            import psutil
        except ImportError:
            return None
        return int(psutil.virtual_memory().total)


def weight_counts(spec) -> dict[str, int]:
    """A lower bound on the weights of each kind of part ``spec`` names, keyed by the fields that size it (Python
    ints: no size can overflow). Norms, biases and small tables are left out."""
    d_model, width = spec.d_model, spec.n_heads * spec.d_head
    n_key_value_heads = getattr(spec, "n_key_value_heads", None) or spec.n_heads
    experts = getattr(spec, "experts", None)
    n_experts = 1 if experts is None else experts.n_experts
    attention = 2 * d_model * (width + n_key_value_heads * spec.d_head)
    mlp = 2 * d_model * (spec.d_mlp or 0) * n_experts
    blocks = "(n_heads x d_head + d_mlp" + (" x n_experts" if experts is not None else "") + ") x d_model"
    source_vocab = getattr(spec, "d_vocab_source", None) or spec.d_vocab
    counts = {"d_vocab x d_model (token embedding)": source_vocab * d_model}
    if hasattr(spec, "n_decoder_layers"):  # an encoder-decoder
        if getattr(spec, "separate_embeddings", False):
            counts["d_vocab x d_model (token embedding)"] += spec.d_vocab * d_model
        counts["d_vocab x d_model (read-out)"] = spec.d_vocab * d_model
        counts[f"n_layers x {blocks} (encoder blocks)"] = spec.n_layers * (attention + mlp)
        counts[f"n_decoder_layers x {blocks} (decoder blocks)"] = spec.n_decoder_layers * (2 * attention + mlp)
    else:
        if hasattr(spec, "causal") or getattr(spec, "mlm_head", False):
            counts["d_vocab x d_model (read-out)"] = spec.d_vocab * d_model
        counts[f"n_layers x {blocks} (blocks)"] = spec.n_layers * (attention + mlp)
    if spec.positions == "learned":
        tables = 1 if not hasattr(spec, "n_decoder_layers") or getattr(spec, "share_positions", False) else 2
        counts["n_ctx x d_model (learned position table)"] = tables * spec.n_ctx * d_model
    return counts


def check_fits(spec) -> None:
    """``ValueError`` naming the fields that size the largest parts when ``spec``'s weights alone exceed this
    machine's memory: a model is made in float32 on the host (then cast and moved), so its weights take at least
    4 bytes each there. Checked before anything is allocated, where the allocator would fail or the machine swap."""
    memory = machine_memory()
    counts = weight_counts(spec)
    total = sum(counts.values())
    if memory is None or 4 * total <= memory:
        return
    largest = sorted(counts.items(), key=lambda item: -item[1])
    parts = ", ".join(f"{label}: {count:,}" for label, count in largest if count)
    raise ValueError(
        f"this {type(spec).__name__} cannot fit: its weights alone take at least {4 * total / 2**30:,.1f} GiB in "
        f"float32 (the model is made in float32, then cast), more than this machine's {memory / 2**30:,.1f} GiB "
        f"of memory; by part, largest first: {parts}. Make the fields of the largest smaller"
    )


class PartNames:
    """The names the parts read (``act_fn``, ``layer_norm_eps``) and what every spec offers (``replace``)."""

    if TYPE_CHECKING:  # fields of each spec dataclass this is mixed into
        activation: str
        norm_eps: float

    @property
    def act_fn(self) -> str:
        """The activation under the name the parts read."""
        return self.activation

    @property
    def layer_norm_eps(self) -> float:
        """The norms' eps under the name the parts read."""
        return self.norm_eps

    @property
    def attn_only(self) -> bool:
        """Whether the blocks have no MLP: never, unless a spec says otherwise."""
        return False

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ExpertSpec:
    """A mixture of experts in place of each block's MLP: ``n_experts`` MLPs of width ``d_mlp``, ``top_k`` per token.

    The router takes the softmax over every expert, keeps the ``top_k`` largest and, with
    ``renormalize``, divides them by their sum (``components.moe``).
    """

    n_experts: int
    top_k: int
    router_bias: bool = False  # the router has a bias b_router
    expert_mlp: str = "plain"  # "plain": Linear-act-Linear with biases (MLP); "gated": GatedMLP
    renormalize: bool = True  # the chosen experts' weights divided by their sum

    def __post_init__(self) -> None:
        check_positive_int("n_experts", self.n_experts)
        check_positive_int("top_k", self.top_k)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be at most n_experts={self.n_experts}")
        check_bools(self, ("router_bias", "renormalize"))
        check_choice("expert_mlp", self.expert_mlp, EXPERT_MLPS)


def as_expert_spec(experts: None | dict | ExpertSpec) -> ExpertSpec | None:
    """``experts`` as an ``ExpertSpec`` (a dict of its fields is read by name; unknown names are refused)."""
    if experts is None or isinstance(experts, ExpertSpec):
        return experts
    if not isinstance(experts, dict):
        raise TypeError(f"experts must be None, a dict or an ExpertSpec, got {type(experts).__name__}")
    known = set(ExpertSpec.__dataclass_fields__)
    unknown = sorted(set(experts) - known)
    if unknown:
        raise ValueError(f"experts has unknown fields {unknown}; known: {sorted(known)}")
    return ExpertSpec(**experts)


# --- the parts ---------------------------------------------------------------------------------------------------
def norm(spec) -> nn.Module:
    """The norm ``spec.norm`` names, over ``d_model`` with ``spec.norm_eps``."""
    kind = NORMS[spec.norm]
    return NoNorm() if kind is NoNorm else kind(spec.d_model, spec.norm_eps)


def token_embed(spec) -> nn.Module:
    """``Embed``, or ``ScaledEmbed`` when ``spec.embed_scale`` is set."""
    if spec.embed_scale is None:
        return Embed(spec)
    return ScaledEmbed(spec, None if spec.embed_scale == SQRT_D_MODEL else float(spec.embed_scale))


def position_embed(spec) -> nn.Module | None:
    """The part adding positions to the residual stream, or None where positions act inside attention or are none."""
    if spec.positions == "learned":
        return PosEmbed(spec)
    if spec.positions in ("sinusoidal", "sinusoidal_interleaved"):
        return SinusoidalPosEmbed(spec, interleaved=spec.positions == "sinusoidal_interleaved")
    return None


def is_sliding(spec, layer: int) -> bool:
    """Whether block ``layer`` attends within ``spec.sliding_window``: every layer with a window and no
    ``layer_types`` (Mistral), else the layers ``layer_types`` calls ``"sliding_attention"`` (Gemma 2/3, OLMo 3)."""
    if getattr(spec, "sliding_window", None) is None:
        return False
    return spec.layer_types is None or spec.layer_types[layer] == "sliding_attention"


def attention(spec, causal: bool, layer: int = 0) -> Attention:
    """Self-attention of block ``layer``: a causal mask where ``causal`` (a sliding window on the sliding layers),
    padding masked always, the positions that act inside it, and the decoder's family parts where ``spec`` names them
    (grouped keys and values, q/k norms, a soft-cap on the scores; see the module docstring)."""
    sliding = is_sliding(spec, layer)
    window = SlidingWindowMask(spec.sliding_window) if sliding else CausalMask()
    masks = (window, PaddingMask()) if causal else (PaddingMask(),)
    parts: dict[str, Any] = {}  # the optional parts, each a module or (softcap) a number
    if spec.positions == "rotary":
        base = 10000.0 if spec.rotary_base is None else spec.rotary_base
        if sliding and getattr(spec, "rotary_base_local", None) is not None:  # the sliding layers' own base
            base = spec.rotary_base_local
        rotary_dim = getattr(spec, "rotary_dim", None)
        parts["rotary"] = Rotary(spec.d_head, rotary_dim, base=base, interleaved=bool(spec.rotary_interleaved))
    elif spec.positions == "alibi":
        parts["score_bias"] = ALiBi(spec.n_heads, slopes=spec.alibi_slopes)
    elif spec.positions == "relative_clipped":
        parts["score_bias"] = ClippedRelativeBias(spec.n_heads, spec.max_distance)
    elif spec.positions == "relative_bucketed":  # the stack's table, computed once per forward, read by every layer
        parts["score_bias"] = SharedScoreBias()
    n_key_value_heads = getattr(spec, "n_key_value_heads", None)
    parts.update(qk_norms(spec, n_key_value_heads or spec.n_heads))
    parts["softcap"] = getattr(spec, "attn_softcap", None)
    return Attention(spec, masks, scale=getattr(spec, "attn_scale", None), n_key_value_heads=n_key_value_heads, **parts)


def qk_norms(spec, n_key_value_heads: int) -> dict[str, nn.Module]:
    """``q_norm`` and ``k_norm`` as ``spec.qk_norm`` names them (none without it): RMSNorms with ``spec.norm_eps``,
    as every family with q/k norms has, whatever norm the stream has."""
    kind = getattr(spec, "qk_norm", None)
    if kind == "per_head":
        return {"q_norm": RMSNorm(spec.d_head, spec.norm_eps), "k_norm": RMSNorm(spec.d_head, spec.norm_eps)}
    if kind == "all_heads":
        return {
            "q_norm": AllHeadsRMSNorm(spec.n_heads, spec.d_head, spec.norm_eps),
            "k_norm": AllHeadsRMSNorm(n_key_value_heads, spec.d_head, spec.norm_eps),
        }
    return {}


def relative_bias(spec, bidirectional: bool) -> RelativePositionBias | None:
    """A stack's T5 relative position bias (``positions="relative_bucketed"``; bidirectional in an encoder), or
    None for other positions."""
    if spec.positions != "relative_bucketed":
        return None
    n_buckets = T5_BUCKETS if spec.n_buckets is None else spec.n_buckets
    max_distance = T5_MAX_DISTANCE if spec.max_distance is None else spec.max_distance
    return RelativePositionBias(spec.n_heads, n_buckets, max_distance, bidirectional)


def hold_at_zero(module: nn.Module, names: tuple[str, ...]) -> None:
    """Freeze each parameter of ``module`` (its submodules included) whose name is in ``names``: a bias the design
    does not have stays zero. Each part says which of its own it holds so in ``held_at_zero``."""
    part: Any  # any submodule: the ones holding such a parameter get held_at_zero
    for part in module.modules():
        held = {name: param for name, param in part.named_parameters(recurse=False) if name.lstrip("_") in names}
        for param in held.values():
            param.requires_grad_(False)
        if held:
            part.held_at_zero = frozenset(held)


ATTENTION_BIASES = ("b_Q", "b_K", "b_V", "b_O")
MLP_BIASES = ("b_in", "b_out")

__all__ = [
    "ADDED_POSITIONS",
    "ATTENTION_BIASES",
    "ATTENTION_POSITIONS",
    "ENCODER_DECODER_POSITIONS",
    "EXPERT_MLPS",
    "ExpertSpec",
    "MLP_BIASES",
    "NORM_EPS",
    "NORMS",
    "PLACEMENTS",
    "POSITIONS",
    "LAYER_TYPES",
    "QK_NORMS",
    "SQRT_D_MODEL",
    "as_expert_spec",
    "attention",
    "check_choice",
    "check_fits",
    "check_numerics",
    "check_positions",
    "check_shape",
    "hold_at_zero",
    "is_sliding",
    "machine_memory",
    "norm",
    "position_embed",
    "qk_norms",
    "relative_bias",
    "token_embed",
    "weight_counts",
]

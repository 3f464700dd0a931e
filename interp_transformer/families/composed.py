"""A decoder composed from parts by name: ``DecoderSpec`` says which parts, one architecture builds any of them.

The classic designs differ in a handful of choices (where the norms sit, which norm, how
positions enter, which MLP, causal or not); each choice is a field here and each value a part
of ``interp_transformer.parts`` (``architectures.composed_parts`` says which). The
architecture is registered once by the library, so a design needs no config class and no
``register`` call of its own::

    DemoTransformer(DecoderSpec(d_model=64, n_layers=2, n_heads=4, d_mlp=256, d_vocab=100, n_ctx=64,
                                placement="post", final_norm=True, positions="sinusoidal_interleaved"))

(``interp_transformer.builder.build_decoder`` is the same in one call.) What the model *is*
follows from the parts: ``placement="post"`` gives ``PostNormBlock``s and post-norm
capabilities, positions that act inside attention give no ``hook_pos_embed``, ``causal=False``
gives a bidirectional model whose logits are not next-token logits (a masked language model's
read-out), and every hook-name table lists exactly the hooks the parts have.

Blocks:

=====================  ==========================================================================================
``placement="pre"``    ``PreNormBlock(norm, attn, norm, mlp)`` (no MLP when ``d_mlp=None``), a final
                       norm unless ``final_norm=False`` (then ``NoNorm``: logits stay linear in the residual)
``placement="post"``   ``PostNormBlock(attn, norm, mlp, norm)``: ``x = norm1(x + attn(x))``, ``x = norm2(x + mlp(x))``,
                       and a final norm only with ``final_norm=True``
``placement="output"`` ``PreNormBlock(None, attn, ln1_post=norm, ...)`` (OLMo 2): norms only on what each sublayer
                       writes, ``x = x + norm1(attn(x))``, ``x = x + norm2(mlp(x))``; the stream stays a sum of writes
``parallel_residual``  ``ParallelBlock(norm, attn, norm, mlp)`` (GPT-NeoX): ``x = x + attn(norm1(x)) + mlp(norm2(x))``
``post_norms``         ``PreNormBlock`` with ``ln1_post``/``ln2_post`` (Gemma 2/3): sublayers' outputs normalized
                       too, ``x = x + norm1_post(attn(norm1(x)))``, ``x = x + norm2_post(mlp(norm2(x)))``
=====================  ==========================================================================================

The MLP is ``MLP`` (``act(x W_in + b_in) W_out + b_out``), ``GatedMLP`` with ``gated_mlp``, or a
``MixtureOfExperts`` of such MLPs with ``experts`` (an ``ExpertSpec`` or a dict of its fields).

The other parts the shipped families use are fields too, named as the families' Hugging Face configs name them,
each giving the part that family's own build uses (``composed_parts.attention``): ``n_key_value_heads`` (grouped
keys and values: Llama, Mistral, Gemma), ``qk_norm`` (``"per_head"``: Qwen3, Gemma 3; ``"all_heads"``: OLMo 2),
``sliding_window`` with ``layer_types`` (Mistral: every layer; Gemma 2/3, OLMo 3: the ``"sliding_attention"``
ones), ``rotary_dim`` (partial rotary: GPT-NeoX), ``rotary_base_local`` (the sliding layers' rotary base: Gemma 3,
OLMo 3), ``attn_softcap`` and ``final_softcap`` (Gemma 2's ``cap * tanh(x / cap)`` on the scores and on the logits:
``Attention``'s and ``Unembed``'s ``softcap``). A combination no part makes is refused by name.
"""

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families import composed_parts as parts
from interp_transformer.families.composed_family_checks import check_family_parts
from interp_transformer.families.composed_parts import ATTENTION_BIASES, MLP_BIASES, ExpertSpec
from interp_transformer.families.registry import Architecture, DecoderParts
from interp_transformer.families.validation import check_bools, check_positive_int, check_positive_number
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames
from interp_transformer.parts import (
    MLP,
    GatedMLP,
    NoNorm,
    ParallelBlock,
    PostNormBlock,
    PreNormBlock,
    Unembed,
)
from interp_transformer.parts.moe import MixtureOfExperts

PLACEMENTS = parts.PLACEMENTS + ("output",)  # a decoder's blocks may also have norms only on their sublayers' outputs


@dataclass(frozen=True)
class DecoderSpec(parts.PartNames):
    """Which parts a decoder is made of, and how big it is (see the module docstring); validated on construction."""

    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # number of blocks
    n_heads: int = 4  # attention heads per block
    d_mlp: int | None = 256  # MLP hidden width (one expert's, with experts); None: attention-only (pre-norm)
    d_vocab: int = 100  # vocabulary size
    n_ctx: int = 64  # longest sequence
    d_head: int | None = None  # width of each head; None: d_model // n_heads
    norm: str = "layer"  # "layer", "layer_unbiased", "rms" or "none" (composed_parts.NORMS)
    norm_eps: float = parts.NORM_EPS  # eps of every norm (1e-5 in all three specs)
    placement: str = "pre"  # "pre": norms read by the sublayers; "post": norms renormalize the stream after each sum;
    # "output": norms only on what each sublayer writes (OLMo 2)
    final_norm: bool = True  # a norm between the last block and the read-out
    causal: bool = True  # False: every query sees every real key (a masked language model)
    positions: str = "learned"  # composed_parts.POSITIONS
    rotary_base: float | None = None  # positions="rotary": theta (None: 10000)
    rotary_interleaved: bool | None = None  # positions="rotary": pairs (2i, 2i+1) instead of the two halves
    alibi_slopes: tuple[float, ...] | None = None  # positions="alibi": one slope per head (None: 2^(-8(h+1)/H))
    max_distance: int | None = None  # positions="relative_clipped": the offset the learned bias is clipped at
    attn_scale: float | None = None  # what q k^T is multiplied by (None: 1/sqrt(d_head); T5: 1.0)
    activation: str = "gelu"  # the MLP's activation (components.activations)
    gated_mlp: bool = False  # act(x W_gate) * (x W_in + b_in) instead of act(x W_in + b_in)
    experts: ExpertSpec | None = None  # a mixture of experts in place of each MLP (an ExpertSpec, or a dict)
    attn_bias: bool = True  # False: b_Q, b_K, b_V, b_O held at zero
    mlp_bias: bool = True  # False: b_in, b_out (and the experts') held at zero
    readout_bias: bool = True  # False: b_U held at zero
    embed_scale: None | float | str = None  # W_E[tokens] * scale: a number, or "sqrt_d_model"
    init_range: float = 0.02  # std of the normal init of weight matrices
    # the parts the shipped families use, named as their Hugging Face configs name them (module docstring)
    n_key_value_heads: int | None = None  # key/value heads, each serving n_heads / n_key_value_heads query heads
    parallel_residual: bool = False  # attention and the MLP both read the block's input (GPT-NeoX's ParallelBlock)
    qk_norm: str | None = None  # "per_head" (Qwen3, Gemma 3) or "all_heads" (OLMo 2): an RMSNorm on q and k
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included (causal only)
    layer_types: tuple[str, ...] | None = None  # "full_attention"/"sliding_attention" per block (None: a window,
    # if given, is every layer's)
    rotary_dim: int | None = None  # positions="rotary": leading dimensions of each head that rotate (None: d_head)
    rotary_base_local: float | None = None  # positions="rotary": the sliding layers' theta (None: rotary_base)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the softmax (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    post_norms: bool = False  # placement="pre": a norm on each sublayer's output too (Gemma 2/3's ln1_post, ln2_post)
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        if isinstance(self.alibi_slopes, (list, torch.Tensor)):  # one slope per head, kept as a tuple
            object.__setattr__(self, "alibi_slopes", tuple(float(slope) for slope in self.alibi_slopes))
        if isinstance(self.layer_types, list):  # Hugging Face's configs hold a list: kept as a tuple
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        parts.check_shape(self, ("d_model", "n_layers", "n_heads", "d_vocab", "n_ctx"))
        if self.d_mlp is not None:
            check_positive_int("d_mlp", self.d_mlp)
        parts.check_choice("norm", self.norm, parts.NORMS)
        parts.check_choice("placement", self.placement, PLACEMENTS)
        check_bools(
            self,
            (
                "final_norm",
                "causal",
                "gated_mlp",
                "attn_bias",
                "mlp_bias",
                "readout_bias",
                "parallel_residual",
                "post_norms",
            ),
        )
        parts.check_numerics(self)
        parts.check_positions(self, parts.POSITIONS)
        object.__setattr__(self, "experts", parts.as_expert_spec(self.experts))
        if self.attn_scale is not None:
            check_positive_number("attn_scale", self.attn_scale)
        if self.placement == "post" and self.norm == "none":
            raise ValueError(
                "placement='post' renormalizes the residual stream after each sum: it needs a norm, got norm='none'"
            )
        check_family_parts(self)
        needs_an_mlp = {
            "placement": self.placement != "pre",
            "experts": self.experts is not None,
            "gated_mlp": self.gated_mlp,
            "parallel_residual": self.parallel_residual,
            "post_norms": self.post_norms,
        }
        if self.d_mlp is None and any(needs_an_mlp.values()):
            given = ", ".join(f"{field}={getattr(self, field)!r}" for field, needs in needs_an_mlp.items() if needs)
            raise ValueError(
                f"d_mlp=None (attention-only blocks) is a pre-norm block without an MLP; got {given}, which needs one"
            )
        if self.experts is not None and self.gated_mlp:
            raise ValueError(
                "with experts, each expert's kind is experts.expert_mlp ('plain' or 'gated'): leave gated_mlp=False"
            )
        parts.check_fits(self)

    @property
    def attn_only(self) -> bool:
        """True when the blocks have no MLP (``d_mlp=None``)."""
        return self.d_mlp is None

    def is_sliding(self, layer: int) -> bool:
        """Whether block ``layer`` attends within ``sliding_window``."""
        return parts.is_sliding(self, layer)


def mlp(spec):
    """The MLP of a block: ``MLP``, ``GatedMLP``, or a mixture of experts of either."""
    if spec.experts is not None:
        experts = spec.experts
        return MixtureOfExperts(
            spec.d_model,
            spec.d_mlp,
            experts.n_experts,
            experts.top_k,
            spec.activation,
            experts.renormalize,
            expert_part=GatedMLP if experts.expert_mlp == "gated" else MLP,
            router_bias=experts.router_bias,
        )
    shape = SimpleNamespace(d_model=spec.d_model, d_mlp=spec.d_mlp, act_fn=spec.activation)
    return GatedMLP(shape) if spec.gated_mlp else MLP(shape)


def block(spec, layer: int = 0):
    """Block ``layer``, its parts placed as ``spec.placement`` (``parallel_residual``, ``post_norms``) says."""
    attn = parts.attention(spec, spec.causal, layer)
    if not spec.attn_bias:
        parts.hold_at_zero(attn, ATTENTION_BIASES)
    if spec.d_mlp is None:
        return PreNormBlock(parts.norm(spec), attn)
    feed_forward = mlp(spec)
    if not spec.mlp_bias:
        parts.hold_at_zero(feed_forward, MLP_BIASES)

    def norm():
        return parts.norm(spec)

    if spec.placement == "post":
        return PostNormBlock(attn, norm(), feed_forward, norm())
    if spec.placement == "output":
        return PreNormBlock(None, attn, ln1_post=norm(), mlp=feed_forward, ln2_post=norm())
    if spec.parallel_residual:
        return ParallelBlock(norm(), attn, norm(), feed_forward)
    if spec.post_norms:
        return PreNormBlock(norm(), attn, ln1_post=norm(), ln2=norm(), mlp=feed_forward, ln2_post=norm())
    return PreNormBlock(norm(), attn, norm(), feed_forward)


def build(spec: DecoderSpec) -> DecoderParts:
    """The parts ``spec`` names, in forward order."""
    unembed = Unembed(spec, spec.final_softcap)
    if not spec.readout_bias:
        parts.hold_at_zero(unembed, ("b_U",))
    return DecoderParts(
        embed=parts.token_embed(spec),
        pos_embed=parts.position_embed(spec),
        blocks=[block(spec, layer) for layer in range(spec.n_layers)],
        ln_final=parts.norm(spec) if spec.final_norm else NoNorm(),
        unembed=unembed,
    )


def has_final_norm(spec: DecoderSpec) -> bool:
    """A norm with hooks reads the last residual stream (not ``NoNorm``)."""
    return spec.final_norm and spec.norm != "none"


def capabilities(spec: DecoderSpec) -> Capabilities:
    """Causal as asked; pre- or post-norm as placed (norms only on the sublayers' outputs leave the stream a sum of
    writes: pre-norm's facts, as OLMo 2's). A pre-norm decoder's final norm is ``ln_final`` even where it is
    ``NoNorm``, so its logits stay linear in the residual stream (the logit lens, direct logit attribution)."""
    final = "ln_final" if spec.placement != "post" or spec.final_norm else None
    return Capabilities(
        causal=spec.causal,
        norm_placement="post" if spec.placement == "post" else "pre",
        final_norm=final,
        read_out="unembed",
        next_token_logits=spec.causal,
    )


def _mlp_hook_keys(spec: DecoderSpec, layer_keys: dict) -> None:
    """The MLP's hooks in ``layer_keys``: ``pre_linear`` when gated, the router's in place of the neurons' for
    experts, none (and no ``resid_mid``) in an attention-only block."""
    if spec.gated_mlp or (spec.experts is not None and spec.experts.expert_mlp == "gated"):
        layer_keys["pre_linear"] = "blocks.{layer}.mlp.hook_pre_linear"
    if spec.experts is not None:  # each expert has its neurons (blocks.L.mlp.experts.E.hook_pre ...); the mixture none
        for name in ("pre", "post", "pre_linear"):
            layer_keys.pop(name, None)
        for name in ("router_logits", "expert_weights", "expert_indices", "routing_weights"):
            layer_keys[name] = f"blocks.{{layer}}.mlp.hook_{name}"
    if spec.d_mlp is None:  # attention-only blocks
        for name in ("resid_mid", "mlp_out", "pre", "post"):
            del layer_keys[name]


def hook_names(spec: DecoderSpec) -> HookNames:
    """The short names of exactly the hooks the parts have: GPT-2's, with ``rot_q``/``rot_k`` (rotary),
    ``score_bias`` and ``alibi`` or ``relative`` (a bias on the scores), ``pre_linear`` (gated MLPs), the router's
    (experts: ``router_logits``, ``expert_weights``, ``expert_indices``, ``routing_weights``),
    ``normalized_resid_post`` (post-norm), ``attn_scores_uncapped`` and ``logits_uncapped`` (soft-caps) where the parts
    have them; no ``resid_mid`` in a parallel block; the norms of a block as ``sublayers`` (``ln1``, ``ln2``; with
    ``post_norms`` also ``ln1_post``, ``ln2_post``; ``placement="output"``: only those two)."""
    layer_keys = dict(BLOCK_HOOKS)
    global_keys = {"embed": "hook_embed"}
    unavailable = {}
    if spec.positions in parts.ADDED_POSITIONS:
        global_keys["pos_embed"] = "hook_pos_embed"
    else:
        where = {"none": "it has no positions: only the causal mask orders the tokens"}.get(
            spec.positions, f"its positions ({spec.positions}) act inside attention"
        )
        unavailable["pos_embed"] = f"this model has no positional embedding: {where}"
    if spec.positions == "rotary":
        layer_keys.update(rot_q="blocks.{layer}.attn.hook_rot_q", rot_k="blocks.{layer}.attn.hook_rot_k")
    if spec.positions in ("alibi", "relative_clipped"):
        layer_keys["score_bias"] = "blocks.{layer}.attn.score_bias.hook_bias"
        layer_keys[spec.positions.split("_")[0]] = layer_keys["score_bias"]  # "alibi" or "relative"
    _mlp_hook_keys(spec, layer_keys)
    if spec.parallel_residual:  # the MLP reads the block's input: there is no mid-point
        del layer_keys["resid_mid"]
    if spec.attn_softcap is not None:
        layer_keys["attn_scores_uncapped"] = "blocks.{layer}.attn.hook_attn_scores_uncapped"
    if spec.final_softcap is not None:
        global_keys["logits_uncapped"] = "unembed.hook_logits_uncapped"
    sublayers: tuple[str, ...] = {"output": ("ln1_post", "ln2_post")}.get(spec.placement, ("ln1", "ln2"))
    if spec.post_norms:
        sublayers = ("ln1", "ln2", "ln1_post", "ln2_post")
    if spec.d_mlp is None:  # an attention-only block has one norm
        sublayers = ("ln1",)
    final_residual = "blocks.{last}.hook_resid_post"
    if spec.placement == "post":
        layer_keys["normalized_resid_post"] = "blocks.{layer}.hook_normalized_resid_post"
        final_residual = "blocks.{last}.hook_normalized_resid_post"
    if has_final_norm(spec):
        global_keys.update(scale="ln_final.hook_scale", normalized="ln_final.hook_normalized")
    else:
        last = "normalized_resid_post" if spec.placement == "post" else "resid_post"
        why = (
            "{key!r} without a layer is the final norm's hook, and this model has no final norm: the read-out reads "
            f"the last block's output, cache[{last!r}, {{last}}]"
        )
        unavailable.update(scale=why, normalized=why)
    writers = ("embed", "pos_embed") if "pos_embed" in global_keys else ("embed",)
    return HookNames(
        layer_keys=layer_keys,
        global_keys=global_keys,
        sublayers=sublayers,
        input_writers=writers,
        final_residual=final_residual,
        unavailable=unavailable,
    )


ARCHITECTURE = Architecture(
    name="composed-decoder", config_class=DecoderSpec, build=build, capabilities=capabilities, hook_names=hook_names
)

__all__ = [
    "ARCHITECTURE",
    "PLACEMENTS",
    "DecoderSpec",
    "ExpertSpec",
    "block",
    "build",
    "capabilities",
    "hook_names",
    "mlp",
]

"""A decoder composed from parts by name: ``DecoderSpec`` says which parts, one architecture builds any of them.

The classic designs differ in a handful of choices (where the norms sit, which norm, how
positions enter, which MLP, causal or not); each choice is a field here and each value a part
of ``interp_transformer.components`` (``architectures.composed_parts`` says which). The
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
``placement="pre"``    ``TransformerBlock(norm, attn, norm, mlp)`` (``AttnOnlyBlock`` when ``d_mlp=None``), a final
                       norm unless ``final_norm=False`` (then ``NoNorm``: logits stay linear in the residual)
``placement="post"``   ``PostNormBlock(attn, norm, mlp, norm)``: ``x = norm1(x + attn(x))``, ``x = norm2(x + mlp(x))``,
                       and a final norm only with ``final_norm=True``
=====================  ==========================================================================================

The MLP is ``MLP`` (``act(x W_in + b_in) W_out + b_out``), ``GatedMLP`` with ``gated_mlp``, or a
``MixtureOfExperts`` of such MLPs with ``experts`` (an ``ExpertSpec`` or a dict of its fields).
"""

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional, Union

import torch

from ..components import MLP, AttnOnlyBlock, GatedMLP, NoNorm, PostNormBlock, TransformerBlock, Unembed
from ..components.moe import MixtureOfExperts
from ..hooks.names import BLOCK_HOOKS, HookNames
from ..models.capabilities import Capabilities
from . import composed_parts as parts
from .composed_parts import ATTENTION_BIASES, MLP_BIASES, ExpertSpec
from .registry import Architecture, DecoderParts
from .validation import check_positive_int


@dataclass(frozen=True)
class DecoderSpec:
    """Which parts a decoder is made of, and how big it is (see the module docstring); validated on construction."""

    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # number of blocks
    n_heads: int = 4  # attention heads per block
    d_mlp: Optional[int] = 256  # MLP hidden width (one expert's, with experts); None: attention-only (pre-norm)
    d_vocab: int = 100  # vocabulary size
    n_ctx: int = 64  # longest sequence
    d_head: Optional[int] = None  # width of each head; None: d_model // n_heads
    norm: str = "layer"  # "layer", "layer_unbiased", "rms" or "none" (composed_parts.NORMS)
    norm_eps: float = parts.NORM_EPS  # eps of every norm (1e-5 in all three specs)
    placement: str = "pre"  # "pre": norms read by the sublayers; "post": norms renormalize the stream after each sum
    final_norm: bool = True  # a norm between the last block and the read-out
    causal: bool = True  # False: every query sees every real key (a masked language model)
    positions: str = "learned"  # composed_parts.POSITIONS
    rotary_base: Optional[float] = None  # positions="rotary": theta (None: 10000)
    rotary_interleaved: Optional[bool] = None  # positions="rotary": pairs (2i, 2i+1) instead of the two halves
    alibi_slopes: Optional[tuple[float, ...]] = None  # positions="alibi": one slope per head (None: 2^(-8(h+1)/H))
    max_distance: Optional[int] = None  # positions="relative_clipped": the offset the learned bias is clipped at
    attn_scale: Optional[float] = None  # what q k^T is multiplied by (None: 1/sqrt(d_head); T5: 1.0)
    activation: str = "gelu"  # the MLP's activation (components.activations)
    gated_mlp: bool = False  # act(x W_gate) * (x W_in + b_in) instead of act(x W_in + b_in)
    experts: Optional[ExpertSpec] = None  # a mixture of experts in place of each MLP (an ExpertSpec, or a dict)
    attn_bias: bool = True  # False: b_Q, b_K, b_V, b_O held at zero
    mlp_bias: bool = True  # False: b_in, b_out (and the experts') held at zero
    readout_bias: bool = True  # False: b_U held at zero
    embed_scale: Union[None, float, str] = None  # W_E[tokens] * scale: a number, or "sqrt_d_model"
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        if isinstance(self.alibi_slopes, (list, torch.Tensor)):  # one slope per head, kept as a tuple
            object.__setattr__(self, "alibi_slopes", tuple(float(slope) for slope in self.alibi_slopes))
        parts.check_shape(self, ("d_model", "n_layers", "n_heads", "d_vocab", "n_ctx"))
        if self.d_mlp is not None:
            check_positive_int("d_mlp", self.d_mlp)
        parts.check_choice("norm", self.norm, parts.NORMS)
        parts.check_choice("placement", self.placement, parts.PLACEMENTS)
        for field in ("final_norm", "causal", "gated_mlp", "attn_bias", "mlp_bias", "readout_bias"):
            parts.check_bool(field, getattr(self, field))
        parts.check_numerics(self)
        parts.check_positions(self, parts.POSITIONS)
        object.__setattr__(self, "experts", parts.as_expert_spec(self.experts))
        if self.attn_scale is not None:
            parts.check_number("attn_scale", self.attn_scale)
        if self.placement == "post" and self.norm == "none":
            raise ValueError(
                "placement='post' renormalizes the residual stream after each sum: it needs a norm, got norm='none'"
            )
        if self.d_mlp is None and (self.placement == "post" or self.experts is not None or self.gated_mlp):
            raise ValueError(
                f"d_mlp=None (attention-only blocks) is a pre-norm block without an MLP; got placement="
                f"{self.placement!r}, experts={self.experts!r}, gated_mlp={self.gated_mlp!r}"
            )
        if self.experts is not None and self.gated_mlp:
            raise ValueError(
                "with experts, each expert's kind is experts.expert_mlp ('plain' or 'gated'): leave gated_mlp=False"
            )
        parts.check_fits(self)

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
        """True when the blocks have no MLP (``d_mlp=None``)."""
        return self.d_mlp is None

    def replace(self, **changes) -> "DecoderSpec":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


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


def block(spec):
    """One block, its parts placed as ``spec.placement`` says."""
    attn = parts.attention(spec, spec.causal)
    if not spec.attn_bias:
        parts.hold_at_zero(attn, ATTENTION_BIASES)
    if spec.d_mlp is None:
        return AttnOnlyBlock(parts.norm(spec), attn)
    feed_forward = mlp(spec)
    if not spec.mlp_bias:
        parts.hold_at_zero(feed_forward, MLP_BIASES)
    if spec.placement == "post":
        return PostNormBlock(attn, parts.norm(spec), feed_forward, parts.norm(spec))
    return TransformerBlock(parts.norm(spec), attn, parts.norm(spec), feed_forward)


def build(spec: DecoderSpec) -> DecoderParts:
    """The parts ``spec`` names, in forward order."""
    unembed = Unembed(spec)
    if not spec.readout_bias:
        parts.hold_at_zero(unembed, ("b_U",))
    return DecoderParts(
        embed=parts.token_embed(spec),
        pos_embed=parts.position_embed(spec),
        blocks=[block(spec) for _ in range(spec.n_layers)],
        ln_final=parts.norm(spec) if spec.final_norm else NoNorm(),
        unembed=unembed,
    )


def has_final_norm(spec: DecoderSpec) -> bool:
    """A norm with hooks reads the last residual stream (not ``NoNorm``)."""
    return spec.final_norm and spec.norm != "none"


def capabilities(spec: DecoderSpec) -> Capabilities:
    """Causal as asked; pre- or post-norm as placed. A pre-norm decoder's final norm is ``ln_final`` even where it is
    ``NoNorm``, so its logits stay linear in the residual stream (the logit lens, direct logit attribution)."""
    final = "ln_final" if spec.placement == "pre" or spec.final_norm else None
    return Capabilities(
        causal=spec.causal,
        norm_placement=spec.placement,
        final_norm=final,
        read_out="unembed",
        next_token_logits=spec.causal,
    )


def hook_names(spec: DecoderSpec) -> HookNames:
    """The short names of exactly the hooks the parts have: GPT-2's, with ``rot_q``/``rot_k`` (rotary),
    ``score_bias`` and ``alibi`` or ``relative`` (a bias on the scores), ``pre_linear`` (gated MLPs), the router's
    (experts: ``router_logits``, ``expert_weights``, ``expert_indices``, ``routing_weights``) and
    ``normalized_resid_post`` (post-norm) where the parts have them."""
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
        input_writers=writers,
        final_residual=final_residual,
        unavailable=unavailable,
    )


ARCHITECTURE = Architecture(
    name="composed-decoder", config_class=DecoderSpec, build=build, capabilities=capabilities, hook_names=hook_names
)

__all__ = ["ARCHITECTURE", "DecoderSpec", "ExpertSpec", "block", "build", "capabilities", "hook_names", "mlp"]

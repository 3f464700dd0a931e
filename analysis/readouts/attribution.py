"""Logit lens and direct logit attribution (DLA).

**Logit lens.** Read the residual stream ``r`` entering each block (and the final one)
as if it were the last: ``lens(r) = LN_final(r) W_U + b_U``, where ``LN_final`` is the
whole final norm (LayerNorm: ``(r - mean(r)) / sqrt(var(r) + eps) * w + b``), with the
scale recomputed from ``r`` itself (the norm's own ``normalize``). At the final residual this is exactly the model's
logits.
(``cache.accumulated_resid(apply_ln=True)`` does the same; ``cache.apply_ln_to_stack``
instead freezes the scale to the final residual's and drops ``b``: right for attribution,
where sums must stay additive, but it misreads earlier residuals, whose norm is smaller.)

**Direct logit attribution.** For an answer token ``t`` (minus an optional wrong token
``t'``) at one position, let ``d = W_U[:, t] - W_U[:, t']``. With the final LayerNorm's
scale frozen to its cached value, LayerNorm is affine and::

    logit(t) - logit(t') = sum_c x_c . c / scale  +  b_lnf . d  +  b_U[t] - b_U[t']
    c = w_lnf * d - mean(w_lnf * d)          (centring moved onto the direction)

over the components ``x_c`` that sum to the final residual: token and positional
embeddings, each head's ``z_h W_O[h]``, each layer's ``b_O``, each MLP layer's
``hook_mlp_out`` (its neurons ``post_n W_out[n]`` plus ``b_out``). The terms of
``LogitAttribution`` sum to the logit (difference) exactly, up to float rounding.

The norm's algebra is the norm's own (``pull_back``, ``bias_term``), so an RMSNorm
decoder (and Gemma's ``1 + w`` norm) is read the same way. Where attention and MLP outputs
pass through norms of their own before the residual stream (Gemma 2's ``ln1_post`` and
``ln2_post``: each writer's ``output_norm``, ``components.writers``), those norms' scales are frozen too and
each head's and neuron's write is pulled back through them: the split stays exact. In a
mixture of experts, ``b_out`` is each chosen expert's bias times its routing weight (plus the
shared expert's, times its gate): the routing weights are constant given the cache, so the
split stays exact (``analysis.readouts.experts.expert_logit_attribution`` splits the MLP over experts).

Soft-capped logits (Gemma 2: ``logits = cap * tanh(uncapped / cap)``, the read-out's ``softcap``)
are not linear in anything. Direct logit attribution then attributes the *uncapped* logit
(``unembed.hook_logits_uncapped``), which the terms sum to exactly, and says so
(``LogitAttribution.logit_softcap``, ``LogitAttribution.note``); the model's logit is
``cap * tanh(total / cap)``, which no sum of terms gives. The logit lens applies the cap, so
its last entry is the model's logits. Both tools need ``model.capabilities.linear_logits``: a
final norm and a linear read-out over an additive residual stream. A post-norm model
has neither: ``analysis.readouts.post_norm`` is its exact counterpart (direct
contributions to a chosen direction of the hidden states, every norm's scale frozen).
"""

from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer import ActivationCache
from interp_transformer.parts.softcap import soft_cap
from interp_transformer.parts.writers import (
    LayerTerms,
    Writer,
    direct_path,
    direct_path_hooks,
    read_along,
    stack_terms,
)

from .. import _checks

POST_NORM_INSTEAD = (
    "has no final norm reading an additive residual stream, or no logits linear in it; use "
    "analysis.readouts.post_norm.encoder_direct_attribution(cache, direction) for exact direct contributions"
)

TokenArg = int | Int[Tensor, "batch"]
PosArg = int | Int[Tensor, "batch"]


def logit_lens_hook_names(model: _checks.AnyModel) -> list[str]:
    """The hooks ``logit_lens`` reads: every ``hook_resid_pre`` and the final residual stream."""
    n_layers = model.cfg.n_layers
    return [model.act_name("resid_pre", layer) for layer in range(n_layers)] + [
        model.hook_names.final_residual_name(n_layers)
    ]


def attribution_hook_names(model: _checks.AnyModel, neurons: bool = False) -> list[str]:
    """The hooks ``direct_logit_attribution`` reads (with ``neurons``: ``neuron_logit_attribution`` too)."""
    names = [model.act_name(name) for name in model.hook_names.input_writers]
    return names + direct_path_hooks(model.blocks, neurons) + _checks.final_scale_names(model)


@torch.no_grad()
def logit_lens(cache: ActivationCache, pos_slice: None | int | slice = None, return_labels: bool = False):
    """``LN_final(r) W_U + b_U`` for the residual ``r`` entering every block and the final one.

    Shape ``[layer + 1, batch, pos, d_vocab]`` (``pos_slice`` selects positions first; an
    int keeps the axis). Labels ``"0_pre"``, ..., ``"final_post"``. The last entry equals
    the model's logits.
    """
    _checks.check_cache(cache)
    model = cache.model
    _checks.require(model, "linear_logits", "logit_lens", POST_NORM_INSTEAD)
    names = logit_lens_hook_names(model)
    _checks.require_hooks(cache, names, "logit_lens")
    resid = torch.stack([_checks.cached(cache, name) for name in names])  # [layer+1, batch, pos, d_model]
    if isinstance(pos_slice, int):
        pos_slice = slice(pos_slice, pos_slice + 1 if pos_slice != -1 else None)
    if pos_slice is not None:
        resid = resid[:, :, pos_slice]
    logits = model.final_norm.normalize(resid) @ model.W_U + model.b_U
    cap = model.read_out.softcap  # what caps the read-out, asked of the read-out
    if cap is not None:  # soft-capped as the model caps its logits
        logits = soft_cap(logits, cap)
    labels = [f"{layer}_pre" for layer in range(model.cfg.n_layers)] + ["final_post"]
    return (logits, labels) if return_labels else logits


@dataclass
class LogitAttribution:
    """Direct contributions to a logit (difference), one value per batch entry.

    ``heads [layer, head_index, batch]`` (``z_h W_O[h]``), ``attn_bias [layer, batch]``
    (``b_O``, and the bias of a norm after attention if it has one), ``mlp [layer, batch]``
    (whole ``hook_mlp_out``, ``b_out`` included; ``None`` for attention-only models),
    ``mlp_bias [layer, batch]`` (the ``b_out`` part of ``mlp``: in a mixture of experts, the
    chosen experts' biases times their routing weights), ``embed``, ``pos_embed`` (zero where
    positions act inside attention, e.g. rotary), ``ln_final_bias`` (``b_lnf . d``; zero for a
    norm without bias), ``unembed_bias`` (``b_U[t] - b_U[t']``), each ``[batch]``. ``total()``
    sums every term except ``mlp_bias`` (already in ``mlp``) and equals the logit (difference);
    ``other_writers`` holds, per label, ``[layer, batch]`` the whole write of any other kind of writer
    a block has (0 in blocks without it), and ``total()`` includes it;
    with ``logit_softcap`` set, the logit *before* the cap (see ``note``).
    """

    embed: Float[Tensor, "batch"]
    pos_embed: Float[Tensor, "batch"]
    heads: Float[Tensor, "layer head_index batch"]
    attn_bias: Float[Tensor, "layer batch"]
    mlp: Float[Tensor, "layer batch"] | None
    mlp_bias: Float[Tensor, "layer batch"] | None
    ln_final_bias: Float[Tensor, "batch"]
    unembed_bias: Float[Tensor, "batch"]
    logit_softcap: float | None = None  # the model's logits are cap * tanh(uncapped / cap): total() is uncapped
    other_writers: dict[str, Float[Tensor, "layer batch"]] = field(default_factory=dict)

    @property
    def note(self) -> str:
        """What ``total()`` is the logit of: the model's own, or (soft-capped logits) the one before the cap."""
        if self.logit_softcap is None:
            return "the terms sum to the logit (difference)"
        return (
            f"the model soft-caps its logits, cap * tanh(logit / cap) with cap = {self.logit_softcap:g}, which is not "
            "linear: the terms sum to the logit (difference) before the cap, cache['logits_uncapped']"
        )

    @property
    def attn(self) -> Float[Tensor, "layer batch"]:
        """Each attention layer's contribution: its heads plus its ``b_O``."""
        return self.heads.sum(dim=1) + self.attn_bias

    def total(self) -> Float[Tensor, "batch"]:
        total = self.embed + self.pos_embed + self.attn.sum(dim=0) + self.ln_final_bias + self.unembed_bias
        total = total + sum(terms.sum(dim=0) for terms in self.other_writers.values())
        return total + self.mlp.sum(dim=0) if self.mlp is not None else total


class _Readout:
    """The frozen-LayerNorm readout of one (batch, position) per batch entry: ``x -> x . c / scale``."""

    def __init__(self, cache: ActivationCache, tokens, incorrect_tokens, pos, analysis: str, names: list[str]):
        self.cache, self.model = cache, cache.model
        _checks.require(self.model, "linear_logits", analysis, POST_NORM_INSTEAD)
        _checks.require_hooks(cache, names, analysis)
        self.norm = self.model.final_norm
        scale_names = _checks.final_scale_names(self.model)  # none: the final stream is read unscaled
        scale = _checks.cached(cache, (scale_names or names)[0])  # [batch, pos, 1] (or any [batch, pos, ...])
        batch, n_pos = scale.shape[:2]
        self.batch_index = torch.arange(batch, device=scale.device)
        self.pos = _checks.positions(pos, batch, n_pos).to(scale.device)
        W_U = self.model.W_U
        self.tokens = _checks.token_ids(self.model, tokens, batch, "tokens")
        direction = W_U[:, self.tokens].T  # [batch, d_model]
        self.incorrect_tokens = None
        if incorrect_tokens is not None:
            self.incorrect_tokens = _checks.token_ids(self.model, incorrect_tokens, batch, "incorrect_tokens")
            direction = direction - W_U[:, self.incorrect_tokens].T
        self.direction = direction
        self.centred = self.norm.pull_back(direction)  # c, [batch, d_model]: the direction the frozen norm reads
        self.scale = scale[self.batch_index, self.pos, 0] if scale_names else scale.new_ones(batch)  # [batch]

    def at_pos(self, name: str) -> Tensor:
        """Activation ``name`` at the chosen position of each batch entry: ``[batch, ...]``."""
        return _checks.cached(self.cache, name)[self.batch_index, self.pos]

    def read(
        self, vectors: Float[Tensor, "... batch d_model"], direction: Tensor | None = None
    ) -> Float[Tensor, "... batch"]:
        """``vectors . c / scale`` (``direction`` instead of ``c``: one pulled back through an output norm)."""
        return (vectors * (self.centred if direction is None else direction)).sum(dim=-1) / self.scale

    def through(self, writer: Writer) -> Tensor:
        """The direction ``writer``'s part output is read along: ``c``, pulled back through its output norm if any."""
        return writer.pull_back(self.centred, self.at_pos)[0]


@torch.no_grad()
def direct_logit_attribution(
    cache: ActivationCache, tokens: TokenArg, incorrect_tokens: TokenArg | None = None, pos: PosArg = -1
) -> LogitAttribution:
    """Direct contribution of every component to ``logit(tokens) - logit(incorrect_tokens)``.

    ``tokens``, ``incorrect_tokens`` and ``pos`` are an int or one value per batch entry
    (e.g. the last real position of each padded text). See the module docstring for the
    math; needs the hooks ``attribution_hook_names(model)``.
    """
    _checks.check_cache(cache)
    model = cache.model
    _checks.require(model, "linear_logits", "direct_logit_attribution", POST_NORM_INSTEAD)
    readout = _Readout(cache, tokens, incorrect_tokens, pos, "direct_logit_attribution", attribution_hook_names(model))
    layers, direction = direct_path(model.blocks, readout.centred / readout.scale[:, None], readout.at_pos)
    unembed_bias = model.b_U[readout.tokens]
    if readout.incorrect_tokens is not None:
        unembed_bias = unembed_bias - model.b_U[readout.incorrect_tokens]
    inputs = {
        name: read_along(readout.at_pos(model.act_name(name)), direction) for name in model.hook_names.input_writers
    }
    mlp_bias = stack_terms(layers, "mlp", "bias")
    return LogitAttribution(
        embed=inputs["embed"],
        pos_embed=inputs.get("pos_embed", torch.zeros_like(inputs["embed"])),
        heads=stack_terms(layers, "attn", "units"),
        attn_bias=stack_terms(layers, "attn", "bias") + stack_terms(layers, "attn", "norm_bias"),
        mlp=stack_terms(layers, "mlp", "whole"),
        mlp_bias=mlp_bias,
        ln_final_bias=readout.norm.bias_term(readout.direction),
        unembed_bias=unembed_bias,
        logit_softcap=model.read_out.softcap,
        other_writers=_other_writers(layers),
    )


def _other_writers(layers: list[LayerTerms]) -> dict[str, Tensor]:
    """The whole terms of writers other than attention and the MLP, ``[layer, batch]`` per label (0 where absent)."""
    labels = sorted({terms.writer.sublayer for layer in layers for terms in layer.writers} - {"attn", "mlp"})
    zero = layers[0].writers[0].whole.new_zeros(layers[0].writers[0].whole.shape)
    return {label: torch.stack([t.whole if (t := layer.of(label)) else zero for layer in layers]) for label in labels}


@torch.no_grad()
def neuron_logit_attribution(
    cache: ActivationCache,
    tokens: TokenArg,
    incorrect_tokens: TokenArg | None = None,
    pos: PosArg = -1,
    layer: int | None = None,
) -> Float[Tensor, "*layer d_mlp batch"]:
    """Direct contribution of each neuron, ``post_n W_out[n] . c / scale`` (``b_out`` excluded).

    ``[layer, d_mlp, batch]``, or ``[d_mlp, batch]`` for one ``layer``. Per layer, the
    neurons plus ``LogitAttribution.mlp_bias`` sum to ``LogitAttribution.mlp``. A norm after
    the MLP (Gemma 2's ``ln2_post``) is read through with its scale frozen. A mixture of
    experts has neurons per expert: ``analysis.readouts.experts.expert_neuron_logit_attribution``.
    """
    _checks.check_cache(cache)
    model = cache.model
    _checks.require(model, "linear_logits", "neuron_logit_attribution", POST_NORM_INSTEAD)
    layers = _checks.layer_list(model, layer)
    for l in layers:
        _checks.require_neurons(model, l, "neuron_logit_attribution")
    writers = [model.blocks[l].writer("mlp") for l in layers]
    names = [writer.units.hook for writer in writers] + _checks.final_scale_names(model)
    names += [writer.scale_hook for writer in writers if writer.output_norm is not None]
    readout = _Readout(cache, tokens, incorrect_tokens, pos, "neuron_logit_attribution", names)
    result = [writer.units.read(readout.at_pos(writer.units.hook), readout.through(writer)) for writer in writers]
    result = [terms / readout.scale for terms in result]
    return result[0] if layer is not None else torch.stack(result)

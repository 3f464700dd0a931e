"""Logit lens and direct logit attribution (DLA).

**Logit lens.** Read the residual stream ``r`` entering each block (and the final one)
as if it were the last: ``lens(r) = LN_final(r) W_U + b_U``, where ``LN_final`` is the
whole final LayerNorm, ``(r - mean(r)) / sqrt(var(r) + eps) * w + b``, with the scale
recomputed from ``r`` itself. At the final residual this is exactly the model's logits.
(``cache.accumulated_resid(apply_ln=True)`` instead freezes the scale to the final
residual's and drops ``b``: right for attribution, where sums must stay additive, but
it misreads earlier residuals, whose norm is smaller.)

**Direct logit attribution.** For an answer token ``t`` (minus an optional wrong token
``t'``) at one position, let ``d = W_U[:, t] - W_U[:, t']``. With the final LayerNorm's
scale frozen to its cached value, LayerNorm is affine and::

    logit(t) - logit(t') = sum_c x_c . c / scale  +  b_lnf . d  +  b_U[t] - b_U[t']
    c = w_lnf * d - mean(w_lnf * d)          (centring moved onto the direction)

over the components ``x_c`` that sum to the final residual: token and positional
embeddings, each head's ``z_h W_O[h]``, each layer's ``b_O``, each MLP layer's
``hook_mlp_out`` (its neurons ``post_n W_out[n]`` plus ``b_out``). The terms of
``LogitAttribution`` sum to the logit (difference) exactly, up to float rounding.

Both need a decoder's ``ln_final`` and ``W_U``. A post-LayerNorm encoder has neither a
final LayerNorm that reads a sum of components nor logits linear in its hidden states:
``analysis.encoder_attribution`` is its exact counterpart (direct contributions to a
chosen direction of the hidden states, every LayerNorm scale frozen).
"""

from dataclasses import dataclass
from typing import Optional, Union

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer import ActivationCache, DemoTransformer

from . import _checks

ENCODER_INSTEAD = (
    "has no ln_final and no logits linear in its hidden states; use "
    "analysis.encoder_attribution.encoder_direct_attribution(cache, direction) for exact direct contributions"
)

TokenArg = Union[int, Int[Tensor, "batch"]]
PosArg = Union[int, Int[Tensor, "batch"]]


def logit_lens_hook_names(model: DemoTransformer) -> list[str]:
    """The hooks ``logit_lens`` reads: every ``hook_resid_pre`` and the last ``hook_resid_post``."""
    last = model.cfg.n_layers - 1
    return [f"blocks.{layer}.hook_resid_pre" for layer in range(model.cfg.n_layers)] + [f"blocks.{last}.hook_resid_post"]


def attribution_hook_names(model: DemoTransformer, neurons: bool = False) -> list[str]:
    """The hooks ``direct_logit_attribution`` reads (with ``neurons``: ``neuron_logit_attribution`` too)."""
    names = ["hook_embed", "hook_pos_embed"]
    for layer in range(model.cfg.n_layers):
        names.append(f"blocks.{layer}.attn.hook_z")
        if not model.cfg.attn_only:
            names.append(f"blocks.{layer}.hook_mlp_out")
            if neurons:
                names.append(f"blocks.{layer}.mlp.hook_post")
    return names + ["ln_final.hook_scale"]


@torch.no_grad()
def logit_lens(
    cache: ActivationCache, pos_slice: Union[None, int, slice] = None, return_labels: bool = False
):
    """``LN_final(r) W_U + b_U`` for the residual ``r`` entering every block and the final one.

    Shape ``[layer + 1, batch, pos, d_vocab]`` (``pos_slice`` selects positions first; an
    int keeps the axis). Labels ``"0_pre"``, ..., ``"final_post"``. The last entry equals
    the model's logits.
    """
    _checks.check_cache(cache)
    model = cache.model
    _checks.require_decoder(model, "logit_lens", ENCODER_INSTEAD)
    names = logit_lens_hook_names(model)
    _checks.require_hooks(cache, names, "logit_lens")
    resid = torch.stack([_checks.cached(cache, name) for name in names])  # [layer+1, batch, pos, d_model]
    if isinstance(pos_slice, int):
        pos_slice = slice(pos_slice, pos_slice + 1 if pos_slice != -1 else None)
    if pos_slice is not None:
        resid = resid[:, :, pos_slice]
    ln = model.ln_final
    centred = resid - resid.mean(dim=-1, keepdim=True)
    normalized = centred / (centred.pow(2).mean(dim=-1, keepdim=True) + ln.eps).sqrt() * ln.w + ln.b
    logits = normalized @ model.W_U + model.b_U
    labels = [f"{layer}_pre" for layer in range(model.cfg.n_layers)] + ["final_post"]
    return (logits, labels) if return_labels else logits


@dataclass
class LogitAttribution:
    """Direct contributions to a logit (difference), one value per batch entry.

    ``heads [layer, head_index, batch]`` (``z_h W_O[h]``), ``attn_bias [layer, batch]``
    (``b_O``), ``mlp [layer, batch]`` (whole ``hook_mlp_out``, ``b_out`` included; ``None``
    for attention-only models), ``mlp_bias [layer, batch]`` (the ``b_out`` part of ``mlp``),
    ``embed``, ``pos_embed``, ``ln_final_bias`` (``b_lnf . d``), ``unembed_bias``
    (``b_U[t] - b_U[t']``), each ``[batch]``. ``total()`` sums every term except
    ``mlp_bias`` (already in ``mlp``) and equals the logit (difference).
    """

    embed: Float[Tensor, "batch"]
    pos_embed: Float[Tensor, "batch"]
    heads: Float[Tensor, "layer head_index batch"]
    attn_bias: Float[Tensor, "layer batch"]
    mlp: Optional[Float[Tensor, "layer batch"]]
    mlp_bias: Optional[Float[Tensor, "layer batch"]]
    ln_final_bias: Float[Tensor, "batch"]
    unembed_bias: Float[Tensor, "batch"]

    @property
    def attn(self) -> Float[Tensor, "layer batch"]:
        """Each attention layer's contribution: its heads plus its ``b_O``."""
        return self.heads.sum(dim=1) + self.attn_bias

    def total(self) -> Float[Tensor, "batch"]:
        total = self.embed + self.pos_embed + self.attn.sum(dim=0) + self.ln_final_bias + self.unembed_bias
        return total + self.mlp.sum(dim=0) if self.mlp is not None else total


class _Readout:
    """The frozen-LayerNorm readout of one (batch, position) per batch entry: ``x -> x . c / scale``."""

    def __init__(self, cache: ActivationCache, tokens, incorrect_tokens, pos, analysis: str, names: list[str]):
        self.cache, self.model = cache, cache.model
        _checks.require_decoder(self.model, analysis, ENCODER_INSTEAD)
        _checks.require_hooks(cache, names, analysis)
        scale = _checks.cached(cache, "ln_final.hook_scale")  # [batch, pos, 1]
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
        weighted = direction * self.model.ln_final.w
        self.centred = weighted - weighted.mean(dim=-1, keepdim=True)  # c, [batch, d_model]
        self.scale = scale[self.batch_index, self.pos, 0]  # [batch]

    def at_pos(self, name: str) -> Tensor:
        """Activation ``name`` at the chosen position of each batch entry: ``[batch, ...]``."""
        return _checks.cached(self.cache, name)[self.batch_index, self.pos]

    def read(self, vectors: Float[Tensor, "... batch d_model"]) -> Float[Tensor, "... batch"]:
        return (vectors * self.centred).sum(dim=-1) / self.scale


@torch.no_grad()
def direct_logit_attribution(
    cache: ActivationCache, tokens: TokenArg, incorrect_tokens: Optional[TokenArg] = None, pos: PosArg = -1
) -> LogitAttribution:
    """Direct contribution of every component to ``logit(tokens) - logit(incorrect_tokens)``.

    ``tokens``, ``incorrect_tokens`` and ``pos`` are an int or one value per batch entry
    (e.g. the last real position of each padded text). See the module docstring for the
    math; needs the hooks ``attribution_hook_names(model)``.
    """
    _checks.check_cache(cache)
    model = cache.model
    readout = _Readout(cache, tokens, incorrect_tokens, pos, "direct_logit_attribution", attribution_hook_names(model))
    heads, attn_bias, mlp, mlp_bias = [], [], [], []
    for layer, block in enumerate(model.blocks):
        z = readout.at_pos(f"blocks.{layer}.attn.hook_z")  # [batch, head_index, d_head]
        # z_h W_O[h] . c = z_h . (W_O[h] c): no [head_index, batch, d_model] stack needed
        W_O_c = einops.einsum(block.attn.W_O, readout.centred, "head_index d_head d_model, batch d_model -> head_index batch d_head")
        heads.append(einops.einsum(z, W_O_c, "batch head_index d_head, head_index batch d_head -> head_index batch") / readout.scale)
        attn_bias.append(readout.read(block.attn.b_O))
        if not model.cfg.attn_only:
            mlp.append(readout.read(readout.at_pos(f"blocks.{layer}.hook_mlp_out")))
            mlp_bias.append(readout.read(block.mlp.b_out))
    unembed_bias = model.b_U[readout.tokens]
    if readout.incorrect_tokens is not None:
        unembed_bias = unembed_bias - model.b_U[readout.incorrect_tokens]
    return LogitAttribution(
        embed=readout.read(readout.at_pos("hook_embed")),
        pos_embed=readout.read(readout.at_pos("hook_pos_embed")),
        heads=torch.stack(heads),
        attn_bias=torch.stack(attn_bias),
        mlp=torch.stack(mlp) if mlp else None,
        mlp_bias=torch.stack(mlp_bias) if mlp_bias else None,
        ln_final_bias=readout.direction @ model.ln_final.b,
        unembed_bias=unembed_bias,
    )


@torch.no_grad()
def neuron_logit_attribution(
    cache: ActivationCache,
    tokens: TokenArg,
    incorrect_tokens: Optional[TokenArg] = None,
    pos: PosArg = -1,
    layer: Optional[int] = None,
) -> Float[Tensor, "*layer d_mlp batch"]:
    """Direct contribution of each neuron, ``post_n W_out[n] . c / scale`` (``b_out`` excluded).

    ``[layer, d_mlp, batch]``, or ``[d_mlp, batch]`` for one ``layer``. Per layer, the
    neurons plus ``LogitAttribution.mlp_bias`` sum to ``LogitAttribution.mlp``.
    """
    _checks.check_cache(cache)
    model = cache.model
    _checks.require_mlp(model, "neuron_logit_attribution")
    layers = _checks.layer_list(model, layer)
    names = [f"blocks.{l}.mlp.hook_post" for l in layers] + ["ln_final.hook_scale"]
    readout = _Readout(cache, tokens, incorrect_tokens, pos, "neuron_logit_attribution", names)
    result = []
    for l in layers:
        post = readout.at_pos(f"blocks.{l}.mlp.hook_post")  # [batch, d_mlp]
        W_out_c = einops.einsum(model.blocks[l].mlp.W_out, readout.centred, "d_mlp d_model, batch d_model -> d_mlp batch")
        result.append(post.T * W_out_c / readout.scale)
    return result[0] if layer is not None else torch.stack(result)

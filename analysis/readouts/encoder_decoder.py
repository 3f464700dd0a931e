"""The decoder's residual stream split into its writers, and direct logit attribution through every decoder head.

In a pre-norm encoder-decoder the decoder's residual stream is a sum::

    resid_final = embed + pos_embed + sum_L (attn_out_L + cross_attn_out_L + mlp_out_L)
    attn_out_L  = sum_h z_h W_O[h] + b_O            (self-attention heads)
    cross_attn_out_L = sum_h z^x_h W^x_O[h] + b^x_O  (cross-attention heads: what each reads from the source)

and the logits read it through the final norm, linear once its scale is frozen. So the
logit (difference) of a token at one target position splits exactly over the embeddings,
every self-attention head, every cross-attention head, each ``b_O``, each MLP, the final
norm's bias and ``b_U`` (``decoder_logit_attribution``; the same algebra as
``analysis.readouts.attribution.direct_logit_attribution``, through the norm's own ``pull_back``).
The encoder's contribution arrives only through the cross-attention heads: a cross head's
term is everything the source reaches the logit by, through that head, directly.

Post-norm models (BART, Marian) renormalize the stream inside every block: the stream is
no such sum and these tools raise, saying so.
"""

from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer import ActivationCache
from interp_transformer.parts.writers import direct_path, direct_path_hooks, read_along, stack_terms

from .. import _checks
from .cross_attention import require_cross_attention

DECODER = "decoder"
CROSS = "cross"


def _require_additive(model, analysis: str) -> None:
    require_cross_attention(model, analysis)
    if not model.capabilities.additive_residual:
        raise ValueError(f"{analysis} has no meaning here: {model.capabilities.why_not_additive()}")


def decoder_writer_names(model) -> list[tuple[str, str]]:
    """``(label, hook)`` of every component that writes the decoder's residual stream, in order."""
    names = [(name, model.act_name(name, DECODER)) for name in model.hook_names.input_writers]
    for layer, block in enumerate(model.decoder.blocks):
        names += [(f"{layer}_{writer.sublayer}_out", writer.output) for writer in block.writers()]
    return names


def decompose_decoder_resid(cache: ActivationCache) -> tuple[Float[Tensor, "component batch pos d_model"], list[str]]:
    """The decoder's writers (embeddings; per layer self-attention, cross-attention, MLP), stacked, with their labels.

    They sum to the decoder's final residual stream (``decoder_final_residual``).
    """
    _checks.check_cache(cache)
    model = cache.model
    _require_additive(model, "decompose_decoder_resid")
    names = decoder_writer_names(model)
    _checks.require_hooks(cache, [hook for _, hook in names], "decompose_decoder_resid")
    return torch.stack([_checks.cached(cache, hook) for _, hook in names]), [label for label, _ in names]


def decoder_final_residual(cache: ActivationCache) -> Float[Tensor, "batch pos d_model"]:
    """The residual stream the decoder's final norm reads."""
    _checks.check_cache(cache)
    name = cache.model.hook_names.final_residual_name(cache.model.cfg.n_decoder_layers)
    _checks.require_hooks(cache, [name], "decoder_final_residual")
    return _checks.cached(cache, name)


def head_results(
    cache: ActivationCache, attention: str = CROSS
) -> tuple[Float[Tensor, "layer head_index batch pos d_model"], list[str]]:
    """Each decoder head's write ``z_h W_O[h]`` (no ``b_O``): ``attention="cross"`` for cross-attention, ``"decoder"``
    for self.

    Labels ``"L0H3"`` (self-attention) or ``"L0C3"`` (cross-attention). Per layer, the heads
    plus ``b_O`` sum to that attention's output (``hook_attn_out`` / ``hook_cross_attn_out``).
    """
    _checks.check_cache(cache)
    model = cache.model
    require_cross_attention(model, "head_results")
    if attention not in (CROSS, DECODER):
        raise ValueError(f"attention must be {CROSS!r} or {DECODER!r}, got {attention!r}")
    units = [block.writer("cross_attn" if attention == CROSS else "attn").units for block in model.decoder.blocks]
    _checks.require_hooks(cache, [u.hook for u in units], "head_results")
    results = torch.stack([u.writes(_checks.cached(cache, u.hook)) for u in units])  # [layer, batch, pos, head, d]
    labels = [f"L{layer}{u.letter}{head}" for layer, u in enumerate(units) for head in range(u.weight.shape[0])]
    return einops.rearrange(results, "layer batch pos head d_model -> layer head batch pos d_model"), labels


@dataclass
class DecoderLogitAttribution:
    """Direct contributions to a logit (difference) at one target position per batch entry.

    ``heads`` and ``cross_heads [layer, head_index, batch]`` (``z_h W_O[h]`` of self- and
    cross-attention), ``attn_bias``, ``cross_attn_bias`` and ``mlp [layer, batch]`` (the MLP's
    whole output), ``embed``, ``pos_embed``, ``ln_final_bias``, ``unembed_bias [batch]``.
    ``total()`` equals the logit (difference).
    """

    embed: Float[Tensor, "batch"]
    pos_embed: Float[Tensor, "batch"]
    heads: Float[Tensor, "layer head_index batch"]
    attn_bias: Float[Tensor, "layer batch"]
    cross_heads: Float[Tensor, "layer head_index batch"]
    cross_attn_bias: Float[Tensor, "layer batch"]
    mlp: Float[Tensor, "layer batch"]
    ln_final_bias: Float[Tensor, "batch"]
    unembed_bias: Float[Tensor, "batch"]

    def total(self) -> Float[Tensor, "batch"]:
        layers = self.heads.sum(dim=1) + self.attn_bias + self.cross_heads.sum(dim=1) + self.cross_attn_bias + self.mlp
        return self.embed + self.pos_embed + layers.sum(dim=0) + self.ln_final_bias + self.unembed_bias


def attribution_hook_names(model) -> list[str]:
    """The hooks ``decoder_logit_attribution`` reads."""
    names = [model.act_name(name, DECODER) for name in model.hook_names.input_writers]
    return names + direct_path_hooks(model.decoder.blocks) + [model.act_name("scale", DECODER)]


@torch.no_grad()
def decoder_logit_attribution(
    cache: ActivationCache,
    tokens: int | Int[Tensor, "batch"],
    incorrect_tokens: None | int | Int[Tensor, "batch"] = None,
    pos: int | Int[Tensor, "batch"] = -1,
) -> DecoderLogitAttribution:
    """Direct contribution of every decoder component to ``logit(tokens) - logit(incorrect_tokens)`` at target ``pos``.

    With the final norm's scale frozen to its cached value (``pull_back`` gives the direction
    ``c`` it reads), each component ``x`` contributes ``x . c / scale``; see the module docstring.
    """
    _checks.check_cache(cache)
    model = cache.model
    _require_additive(model, "decoder_logit_attribution")
    names = attribution_hook_names(model)
    _checks.require_hooks(cache, names, "decoder_logit_attribution")
    norm = model.final_norm
    scale_all = _checks.cached(cache, names[-1])  # [batch, pos, 1]
    batch, n_pos = scale_all.shape[:2]
    rows = torch.arange(batch, device=scale_all.device)
    pos = _checks.positions(pos, batch, n_pos).to(scale_all.device)
    scale = scale_all[rows, pos, 0]
    tokens = _checks.token_ids(model, tokens, batch, "tokens")
    direction = model.W_U[:, tokens].T  # [batch, d_model]
    unembed_bias = model.b_U[tokens]
    if incorrect_tokens is not None:
        incorrect = _checks.token_ids(model, incorrect_tokens, batch, "incorrect_tokens")
        direction, unembed_bias = direction - model.W_U[:, incorrect].T, unembed_bias - model.b_U[incorrect]
    centred = norm.pull_back(direction)  # [batch, d_model]
    at_pos = lambda name: _checks.cached(cache, name)[rows, pos]  # noqa: E731
    layers, direction_in = direct_path(model.decoder.blocks, centred / scale[:, None], at_pos)
    inputs = {
        name: read_along(at_pos(model.act_name(name, DECODER)), direction_in) for name in model.hook_names.input_writers
    }
    return DecoderLogitAttribution(
        embed=inputs["embed"],
        pos_embed=inputs.get("pos_embed", torch.zeros_like(inputs["embed"])),
        heads=stack_terms(layers, "attn", "units"),
        attn_bias=stack_terms(layers, "attn", "bias"),
        cross_heads=stack_terms(layers, "cross_attn", "units"),
        cross_attn_bias=stack_terms(layers, "cross_attn", "bias"),
        mlp=stack_terms(layers, "mlp", "whole"),
        ln_final_bias=norm.bias_term(direction),
        unembed_bias=unembed_bias,
    )


def predicted_logit_attribution(
    cache: ActivationCache, logits: Float[Tensor, "batch pos d_vocab"], batch_index: int = 0
) -> tuple[DecoderLogitAttribution, Tensor]:
    """The attribution of the predicted token's logit at every target position of one batch entry.

    Returns ``(attribution, predicted [pos])``, the attribution's batch axis running over positions.
    """
    predicted = logits[batch_index].argmax(dim=-1)
    n_pos = predicted.shape[0]
    expanded = ActivationCache(
        {name: value[batch_index : batch_index + 1].expand(n_pos, *value.shape[1:]) for name, value in cache.items()},
        cache.model,
    )
    return decoder_logit_attribution(expanded, predicted, pos=torch.arange(n_pos)), predicted


def optional_attribution(model) -> str | None:
    """Why ``decoder_logit_attribution`` does not apply to ``model`` (None when it does)."""
    try:
        _require_additive(model, "direct logit attribution")
    except (TypeError, ValueError) as reason:
        return str(reason)
    return None if model.final_norm is not None else "the decoder has no final norm reading its residual stream"


__all__ = [
    "DecoderLogitAttribution",
    "attribution_hook_names",
    "decompose_decoder_resid",
    "decoder_final_residual",
    "decoder_logit_attribution",
    "decoder_writer_names",
    "head_results",
    "optional_attribution",
    "predicted_logit_attribution",
]

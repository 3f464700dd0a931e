"""Direct attribution for post-norm models (BERT): exact contributions to a direction of the hidden states.

A decoder's direct logit attribution (``analysis.readouts.attribution``) rests on pre-norm algebra:
the residual stream is a sum of component outputs and one final LayerNorm reads it. A
BERT-style encoder renormalizes its stream twice per block (``ln1`` after attention,
``ln2`` after the MLP), so neither holds. This module gives the exact counterpart.

**What is attributed.** The final hidden state ``h [batch, pos, d_model]`` (the last
block's ``hook_normalized_resid_post``) read along a chosen direction ``d``::

    f[b, p] = h[b, p] . d[b, p]

``d`` is yours: a probe or steering vector, a difference of two sentence embeddings, the
sentence embedding's own direction (what ``analysis.report`` uses), ... An MLM logit is
*not* such a read-out: the MLM head applies a dense layer, GELU and a LayerNorm before
``W_U``, so the logit is not linear in ``h``. Attribute a hidden-state direction instead
(for example the gradient of that logit at ``h``; the split is then exact for ``h . d``,
a first-order account of the logit).

**The split.** Freeze every LayerNorm's scale to its cached ``hook_scale``: then
``LN(x) = (x - mean(x)) / scale * w + b`` is affine, and so is the *direct path* from any
component's write to ``h`` (residual connections and LayerNorms, not re-running attention
or MLPs). Reading ``LN(x)`` along ``g`` equals ``x . back(g) + b . g`` with::

    back(g) = (w * g - mean(w * g)) / scale            (the centring moves onto the direction)

Sweeping from the output back, ``g = d``, then for each block ``L`` from the last::

    ln2_bias[L] = b_ln2 . g ;              g <- back_ln2(g)      g now reads resid_post = ln1_out + mlp_out
    mlp[L]      = mlp_out . g              (neurons: post_n W_out[n] . g, plus b_out . g)
    ln1_bias[L] = b_ln1 . g ;              g <- back_ln1(g)      g now reads resid_mid = resid_pre + attn_out
    heads[L, h] = (z_h W_O[h]) . g ;       attn_bias[L] = b_O . g
                                                                 resid_pre is the previous block's output: g carries on
    embed_ln_bias = b_embed_ln . g ;       g <- back_embed_ln(g)
    embed, token_type_embed, pos_embed = (W_E[tokens], W_token_type[types], W_pos[positions]) . g

``EncoderAttribution.total()`` sums every term and equals ``f`` up to float rounding; that
identity is exact, not an approximation. What each term *means* is the direct effect of
one component with every LayerNorm's scale held at its cached value: indirect effects (a
head changing what later heads and MLPs compute, or changing a later LayerNorm's scale) are
left out, as in decoder DLA with a frozen ``ln_final``, but a post-norm stream passes
``2 * n_layers`` LayerNorms, so an early component's term carries every later ``w / scale``.
Each term is also gradient x activation with the scales frozen (``g`` is the gradient of
``f`` with respect to the component's write); plain gradient x activation, with scales
free, neither equals this nor sums to ``f``.

The direct path never leaves its position (only attention moves information across
positions, and head outputs are terms here), so each position's split stands alone:
``pos`` picks one position per batch entry, or ``"mean"`` averages over real tokens
(mean pooling: with ``d`` the unit sentence embedding, ``f`` is the embedding's norm).
"""

import operator
from collections.abc import Callable
from dataclasses import dataclass, fields

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from interp_transformer import ActivationCache
from interp_transformer.parts.writers import direct_path, direct_path_hooks, read_along, stack_terms

from .. import _checks

PosArg = None | int | Tensor | str


def _embedding_norm(model):
    """The norm applied to the summed embeddings (``capabilities.embedding_norm``), or None."""
    path = model.capabilities.embedding_norm
    return operator.attrgetter(path)(model) if path is not None else None


def encoder_attribution_hook_names(model, neurons: bool = False) -> list[str]:
    """The hooks ``encoder_direct_attribution`` reads (with ``neurons``, each MLP's ``hook_post`` too)."""
    names = [model.act_name(name) for name in model.hook_names.input_writers]
    embedding_norm = _embedding_norm(model)
    if embedding_norm is not None:
        names.append(embedding_norm.hook_scale.name)
    names += direct_path_hooks(model.blocks, neurons)
    return names + [model.hook_names.final_residual_name(model.cfg.n_layers)]


@dataclass
class EncoderAttribution:
    """Direct contributions to ``f = h . d``; each field ends in the ``*where`` axes (``[batch]`` or ``[batch, pos]``).

    ``embed``, ``token_type_embed``, ``pos_embed``, ``embed_ln_bias`` ``[*where]``;
    ``heads [layer, head_index, *where]`` (``z_h W_O[h]``); ``attn_bias`` (``b_O``), ``ln1_bias``,
    ``mlp`` (the whole ``hook_mlp_out``, ``b_out`` included), ``mlp_bias`` (the ``b_out`` part of
    ``mlp``), ``ln2_bias``: ``[layer, *where]``; ``neurons [layer, d_mlp, *where]`` if asked for
    (they plus ``mlp_bias`` sum to ``mlp``). ``value`` is ``f`` itself, read from the cached
    hidden state: ``total()`` (every term but ``mlp_bias`` and ``neurons``) equals it.
    """

    embed: Float[Tensor, "*where"]
    token_type_embed: Float[Tensor, "*where"]
    pos_embed: Float[Tensor, "*where"]
    embed_ln_bias: Float[Tensor, "*where"]
    heads: Float[Tensor, "layer head_index *where"]
    attn_bias: Float[Tensor, "layer *where"]
    ln1_bias: Float[Tensor, "layer *where"]
    mlp: Float[Tensor, "layer *where"]
    mlp_bias: Float[Tensor, "layer *where"]
    ln2_bias: Float[Tensor, "layer *where"]
    value: Float[Tensor, "*where"]
    neurons: Float[Tensor, "layer d_mlp *where"] | None = None

    @property
    def attn(self) -> Float[Tensor, "layer *where"]:
        """Each attention layer's contribution: its heads plus its ``b_O``."""
        return self.heads.sum(dim=1) + self.attn_bias

    @property
    def layer_norm_biases(self) -> Float[Tensor, "layer *where"]:
        """Each block's ``ln1`` and ``ln2`` bias terms together."""
        return self.ln1_bias + self.ln2_bias

    def total(self) -> Float[Tensor, "*where"]:
        """The sum of every term: equals ``value`` (the identity this split is built on)."""
        embeddings = self.embed + self.token_type_embed + self.pos_embed + self.embed_ln_bias
        return embeddings + (self.attn + self.mlp + self.layer_norm_biases).sum(dim=0)

    def map(self, fn: Callable[[Tensor], Tensor]) -> "EncoderAttribution":
        """The same split with ``fn`` applied to every field over its trailing ``*where`` axes."""
        return EncoderAttribution(
            **{f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name)) for f in fields(self)}
        )


def _directions(direction, batch: int, n_pos: int, like: Tensor) -> Tensor:
    """``direction`` ``[d_model]``, ``[batch, d_model]`` or ``[batch, pos, d_model]`` broadcast to ``[batch, pos,
    d_model]``."""
    if not isinstance(direction, Tensor) or not direction.is_floating_point():
        raise TypeError(
            "direction must be a float tensor [d_model], [batch, d_model] or [batch, pos, d_model], got "
            f"{direction!r:.80}"
        )
    d_model = like.shape[-1]
    accepted = {
        (d_model,): "d_model -> 1 1 d_model",
        (batch, d_model): "batch d_model -> batch 1 d_model",
        (batch, n_pos, d_model): "batch pos d_model -> batch pos d_model",
    }
    if tuple(direction.shape) not in accepted:
        raise ValueError(
            f"direction has shape {tuple(direction.shape)}; expected [d_model]=[{d_model}], [batch, d_model]=[{batch}, "
            f"{d_model}] or [batch, pos, d_model]=[{batch}, {n_pos}, {d_model}]"
        )
    direction = einops.rearrange(direction, accepted[tuple(direction.shape)])
    return direction.to(like.device, like.dtype).expand(batch, n_pos, d_model)


def _reducer(pos: PosArg, attention_mask, batch: int, n_pos: int, device) -> Callable[[Tensor], Tensor]:
    """A function ``[..., batch, pos] -> [..., *where]`` for the chosen ``pos``."""
    if pos is None:
        if attention_mask is not None:
            raise ValueError("attention_mask is used with pos='mean' only; pos=None keeps every position")
        return lambda t: t
    if isinstance(pos, str):
        if pos != "mean":
            raise ValueError(f"pos must be None, an int, a [batch] tensor of positions or 'mean', got {pos!r}")
        if attention_mask is None:
            weights = torch.ones(batch, n_pos, device=device)
        else:
            if (
                not isinstance(attention_mask, Tensor)
                or attention_mask.is_floating_point()
                or attention_mask.shape != (batch, n_pos)
            ):
                raise ValueError(
                    f"attention_mask must be an integer or bool tensor [batch, pos]=[{batch}, {n_pos}], "
                    f"got {attention_mask!r:.80}"
                )
            weights = attention_mask.to(device).float()
            if bool((weights.sum(dim=-1) == 0).any()):
                raise ValueError("attention_mask has a row without any real token: nothing to average")
        return lambda t: (t * weights.to(t.dtype)).sum(dim=-1) / weights.sum(dim=-1).to(t.dtype)
    if attention_mask is not None:
        raise ValueError("attention_mask is used with pos='mean' only; with a chosen position it plays no part")
    positions = _checks.positions(pos, batch, n_pos).to(device)
    rows = torch.arange(batch, device=device)
    return lambda t: t[..., rows, positions]


def _require_post_norm(model, what: str) -> None:
    if model.capabilities.norm_placement != "post":
        raise TypeError(
            f"{what} needs a post-norm model's cache (an EncoderTransformer); for a pre-norm decoder use "
            f"analysis.readouts.attribution.direct_logit_attribution (got a {type(model).__name__})"
        )


@torch.no_grad()
def encoder_direct_attribution(
    cache: ActivationCache,
    direction: Float[Tensor, "d_model"] | Float[Tensor, "batch d_model"] | Float[Tensor, "batch pos d_model"],
    pos: PosArg = None,
    attention_mask: Tensor | None = None,
    neurons: bool = False,
) -> EncoderAttribution:
    """Split ``f = h . d`` (``h`` the final hidden state) exactly over the encoder's components.

    See the module docstring for the math. ``pos``: ``None`` keeps every position (terms
    ``[..., batch, pos]``); an int or a ``[batch]`` tensor picks one position per batch entry;
    ``"mean"`` averages over the real tokens of ``attention_mask`` (every position if
    ``None``). ``neurons`` adds each MLP neuron's term. Needs the hooks
    ``encoder_attribution_hook_names(model, neurons)`` in the cache.
    """
    _checks.check_cache(cache)
    model = cache.model
    _require_post_norm(model, "encoder_direct_attribution")
    _checks.require_hooks(cache, encoder_attribution_hook_names(model, neurons), "encoder_direct_attribution")
    act = lambda name: _checks.cached(cache, name)  # noqa: E731
    hidden = act(model.hook_names.final_residual_name(model.cfg.n_layers))
    batch, n_pos = hidden.shape[:2]
    g = _directions(direction, batch, n_pos, hidden)
    value = read_along(hidden, g)
    reduce = _reducer(pos, attention_mask, batch, n_pos, hidden.device)
    layers, g = direct_path(model.blocks, g, act, neurons)  # each block: ln2, the MLP, ln1, the heads, backwards
    terms = {
        "heads": stack_terms(layers, "attn", "units"),
        "attn_bias": stack_terms(layers, "attn", "bias"),
        "mlp": stack_terms(layers, "mlp", "whole"),
        "mlp_bias": stack_terms(layers, "mlp", "bias"),
        "neurons": stack_terms(layers, "mlp", "units") if neurons else None,
        "ln1_bias": torch.stack([layer.norm_biases["ln1"] for layer in layers]),
        "ln2_bias": torch.stack([layer.norm_biases["ln2"] for layer in layers]),
    }
    embedding_norm = _embedding_norm(model)
    embed_ln_bias = torch.zeros_like(value)
    if embedding_norm is not None:
        embed_ln_bias = embedding_norm.bias_term(g)
        g = embedding_norm.pull_back(g, act(embedding_norm.hook_scale.name))
    inputs = {name: read_along(act(model.act_name(name)), g) for name in model.hook_names.input_writers}
    zero = torch.zeros_like(value)
    return EncoderAttribution(
        embed=reduce(inputs["embed"]),
        token_type_embed=reduce(inputs.get("token_type_embed", zero)),
        pos_embed=reduce(inputs.get("pos_embed", zero)),
        embed_ln_bias=reduce(embed_ln_bias),
        value=reduce(value),
        **{name: reduce(term) for name, term in terms.items() if term is not None},
    )


def sentence_embedding_direction(
    cache: ActivationCache, attention_mask: Tensor | None = None
) -> Float[Tensor, "batch d_model"]:
    """The unit mean-pooled sentence embedding ``e / |e|``, ``e = mean over real tokens of h``: ``[batch, d_model]``.

    With it as ``direction`` and ``pos="mean"``, ``encoder_direct_attribution`` splits the
    embedding's norm ``|e| = e . e/|e|`` over the components (what the report shows).
    """
    _checks.check_cache(cache)
    model = cache.model
    _require_post_norm(model, "sentence_embedding_direction")
    name = model.hook_names.final_residual_name(model.cfg.n_layers)
    _checks.require_hooks(cache, [name], "sentence_embedding_direction")
    hidden = _checks.cached(cache, name)
    pooled = _reducer("mean", attention_mask, hidden.shape[0], hidden.shape[1], hidden.device)(
        einops.rearrange(hidden, "batch pos d_model -> d_model batch pos")
    )
    return torch.nn.functional.normalize(einops.rearrange(pooled, "d_model batch -> batch d_model"), dim=-1)


__all__ = [
    "EncoderAttribution",
    "encoder_attribution_hook_names",
    "encoder_direct_attribution",
    "sentence_embedding_direction",
]

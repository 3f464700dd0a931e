"""Mixtures of experts: which experts each token uses, their neurons, and their direct effect on the logits.

A mixture's block ``L`` writes ``mlp_out = sum_E w_E expert_E(x) (+ g * shared(x))`` with
``w_E`` the routing weight of expert ``E`` (0 where the router did not choose it; see
``interp_transformer.parts.moe``). Given the cache, the routing weights and the shared
expert's gate ``g`` are constants, so everything linear in the experts' outputs splits
exactly over experts, and over each expert's neurons:

=================================  ==============================================================
``expert_usage``                   the routing weight of every expert for every token and layer;
                                   ``.fraction()`` the share of tokens choosing each expert
``expert_neuron_activations``      one expert's ``hook_post`` (on every token: the cache holds
                                   the explicit path's values), ``[batch, pos, d_mlp]``
``expert_neuron_summary``          one number per neuron of every expert of a layer, over the
                                   tokens routed to that expert (``chosen_only``)
``expert_top_activations``         the ``k`` (text, position) pairs where an expert's neurons fire
                                   most, among tokens routed to it, streamed over any amount of text
``expert_neuron_logit_effect``     ``W_out[E][n] @ W_U``: one unit of a neuron's activation, through
                                   the unembedding alone
``expert_logit_attribution``       each expert's (and the shared expert's) direct contribution to a
                                   logit (difference): ``w_E (post_E W_out[E] + b_out[E]) . c / scale``
                                   (``c`` pulled back through the final norm, and an output norm if
                                   any); per layer they sum to ``LogitAttribution.mlp``
``expert_neuron_logit_attribution``  the same per neuron, ``w_E post_E[n] W_out[E][n] . c / scale``
=================================  ==============================================================

With soft-capped logits the attributions are of the logit before the cap, as in
``analysis.readouts.attribution``. A mixture's dense blocks (Qwen's ``mlp_only_layers``) are not
listed by ``moe_layers``; their neurons are ordinary ones.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer import ActivationCache

from .. import _checks
from .attribution import POST_NORM_INSTEAD, PosArg, TokenArg, _Readout
from .neurons import NeuronLogitEffect, StreamingTopK, TopActivations, _batches

STATISTICS = ("max", "mean", "abs_mean")


def moe_layers(model: _checks.AnyModel) -> list[int]:
    """The blocks whose MLP is a mixture of experts (``ValueError`` for a model without experts)."""
    layers = [layer for layer, block in enumerate(model.blocks) if _mlp_writer(block).routes_tokens]
    if not layers:
        raise ValueError(
            "this model has no mixture of experts (model.has_experts is False): its MLP neurons are "
            "read with analysis.readouts.neurons"
        )
    return layers


def _mlp_writer(block):
    """Block's MLP writer; an attention-only block has none, and routes no tokens."""
    writer = block.writer("mlp")
    if writer is None:
        raise ValueError("this model is attention-only (d_mlp=None): it has no MLP, so no mixture of experts")
    return writer


def routing_hook_names(model: _checks.AnyModel, layer: int) -> list[str]:
    """The routing hooks of mixture ``layer``: chosen experts, their weights (and the shared expert's gate)."""
    return _mlp_writer(model.blocks[layer]).bias_hooks()


def _mixture(model: _checks.AnyModel, layer, what: str):
    layer = _checks.layer_index(model, layer)
    if layer not in moe_layers(model):
        raise ValueError(
            f"{what}: block {layer}'s MLP is not a mixture of experts; mixtures are in blocks {moe_layers(model)}"
        )
    return layer, model.blocks[layer].mlp


def _expert(mixture, expert, what: str) -> int:
    return _checks._index(expert, mixture.n_experts, f"{what}: expert", "experts per mixture")


def expert_hook_name(model: _checks.AnyModel, layer: int, expert: int, hook: str = "post") -> str:
    """The full name of expert ``expert``'s ``hook_pre``, ``hook_pre_linear`` or ``hook_post`` in block ``layer``."""
    layer, mixture = _mixture(model, layer, "expert_hook_name")
    if hook not in ("pre", "pre_linear", "post"):
        raise ValueError(f"hook must be 'pre', 'pre_linear' or 'post', got {hook!r}")
    return getattr(mixture.experts[_expert(mixture, expert, "expert_hook_name")], f"hook_{hook}").name


def routing_names(model: _checks.AnyModel, layers=None) -> list[str]:
    """The hooks ``expert_usage`` reads (chosen experts and their weights) for ``layers`` (default: every mixture)."""
    if layers is None:
        layers = moe_layers(model)
    else:
        layers = [_mixture(model, layer, "routing_names")[0] for layer in _checks.layer_list(model, layers)]
    return [name for layer in layers for name in routing_hook_names(model, layer)[:2]]


# ---- which experts each token uses ----------------------------------------------------------------


@dataclass
class ExpertUsage:
    """Routing weights ``weights [layer, batch, pos, expert]`` of the mixtures in ``layers`` (0: expert not chosen)."""

    layers: list[int]
    weights: Float[Tensor, "layer batch pos expert"]
    is_real: Tensor | None = None  # [batch, pos]: False at padding, left out of the shares

    @property
    def chosen(self) -> Tensor:
        """``[layer, batch, pos, expert]``: whether each token's router chose each expert."""
        return self.weights != 0

    def fraction(self) -> Float[Tensor, "layer expert"]:
        """The share of (real) tokens whose router chose each expert; each row sums to ``experts_per_token``."""
        return self._mean(self.chosen.to(self.weights.dtype))

    def mean_weight(self) -> Float[Tensor, "layer expert"]:
        """Each expert's routing weight averaged over (real) tokens, 0 counted where not chosen."""
        return self._mean(self.weights)

    def _mean(self, values: Tensor) -> Tensor:
        if self.is_real is None:
            return values.mean(dim=(1, 2))
        mask = self.is_real.to(values.dtype)[None, :, :, None]
        return (values * mask).sum(dim=(1, 2)) / mask.sum(dim=(1, 2))


def expert_usage(cache: ActivationCache, attention_mask: Int[Tensor, "batch pos"] | None = None) -> ExpertUsage:
    """Every mixture's routing weight per token and expert, from the cached router hooks (``routing_names(model)``)."""
    _checks.check_cache(cache)
    model = cache.model
    layers = moe_layers(model)
    names = routing_names(model)
    _checks.require_hooks(cache, names, "expert_usage")
    weights = []
    for layer in layers:
        indices_name, weights_name = routing_hook_names(model, layer)[:2]
        indices, chosen = _checks.cached(cache, indices_name), _checks.cached(cache, weights_name)
        dense = chosen.new_zeros(*chosen.shape[:-1], model.blocks[layer].mlp.n_experts)
        weights.append(dense.scatter_add(-1, indices, chosen))
    is_real = None if attention_mask is None else attention_mask.bool().to(weights[0].device)
    return ExpertUsage(layers, torch.stack(weights), is_real)


# ---- each expert's neurons ------------------------------------------------------------------------


def expert_neuron_activations(
    cache: ActivationCache, layer: int, expert: int, neuron: int | None = None
) -> Float[Tensor, "batch pos d_mlp"] | Float[Tensor, "batch pos"]:
    """Expert ``expert``'s ``hook_post`` in block ``layer``: every neuron, or one; on every token (chosen or not)."""
    _checks.check_cache(cache)
    name = expert_hook_name(cache.model, layer, expert)
    _checks.require_hooks(cache, [name], "expert_neuron_activations")
    post = _checks.cached(cache, name)
    if neuron is None:
        return post
    return post[..., _checks._index(neuron, post.shape[-1], "neuron", "neurons per expert (d_mlp)")]


def expert_neuron_summary(
    cache: ActivationCache, layer: int, statistic: str = "max", chosen_only: bool = True
) -> Float[Tensor, "expert d_mlp"]:
    """One number per neuron of every expert of ``layer``: ``"max"``, ``"mean"`` or ``"abs_mean"`` over the cached
    tokens.

    ``chosen_only`` (default) takes only the tokens routed to that expert (its activation on
    the others never reaches the output); an expert no token chose gets NaN.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    _checks.check_cache(cache)
    model = cache.model
    layer, mixture = _mixture(model, layer, "expert_neuron_summary")
    names = [expert.hook_post.name for expert in mixture.experts] + routing_hook_names(model, layer)[:1]
    _checks.require_hooks(cache, names, "expert_neuron_summary")
    chosen = expert_usage_of(cache, layer).flatten(0, 1)  # [token, expert]
    rows = []
    for number, expert in enumerate(mixture.experts):
        post = _checks.cached(cache, expert.hook_post.name).flatten(0, 1)  # [token, d_mlp]
        if chosen_only:
            post = post[chosen[:, number]]
        if post.shape[0] == 0:
            rows.append(torch.full(post.shape[1:], float("nan"), dtype=post.dtype, device=post.device))
        elif statistic == "max":
            rows.append(post.max(dim=0).values)
        else:
            rows.append((post.abs() if statistic == "abs_mean" else post).mean(dim=0))
    return torch.stack(rows)


def expert_usage_of(cache: ActivationCache, layer: int) -> Tensor:
    """``[batch, pos, expert]``: whether each token's router in block ``layer`` chose each expert."""
    model = cache.model
    indices = _checks.cached(cache, routing_hook_names(model, layer)[0])
    chosen = torch.zeros(
        *indices.shape[:-1], model.blocks[layer].mlp.n_experts, dtype=torch.bool, device=indices.device
    )
    return chosen.scatter(-1, indices, True)


def expert_top_activations(
    model: _checks.AnyModel,
    tokens: Int[Tensor, "n_texts pos"] | Iterable[Int[Tensor, "batch pos"]],
    layer: int,
    expert: int,
    neurons: None | int | Sequence[int] | Tensor = None,
    k: int = 10,
    batch_size: int = 16,
    chosen_only: bool = True,
    progress: bool = False,
) -> TopActivations:
    """The ``k`` (text, position) pairs where each neuron of one expert fires most
    (``analysis.readouts.neurons.top_activations``).

    Only that expert's ``hook_post`` and the layer's chosen experts are cached; with
    ``chosen_only`` (default), tokens not routed to the expert are left out (their values
    are ``-inf`` if fewer than ``k`` tokens chose it).
    """
    _checks.check_model(model)
    layer, mixture = _mixture(model, layer, "expert_top_activations")
    number = _expert(mixture, expert, "expert_top_activations")
    d_mlp = mixture.experts[number].W_out.shape[0]
    selected = torch.arange(d_mlp) if neurons is None else torch.atleast_1d(torch.as_tensor(neurons, dtype=torch.long))
    for neuron in selected.tolist():
        _checks._index(neuron, d_mlp, "neuron", "neurons per expert (d_mlp)")
    post_name, indices_name = mixture.experts[number].hook_post.name, routing_hook_names(model, layer)[0]
    tracker = StreamingTopK(k, selected)
    stop = layer + 1 if layer + 1 < model.cfg.n_layers else None
    with torch.no_grad():
        for batch in tqdm(
            _batches(tokens, batch_size), desc=f"top activations L{layer}E{number}", disable=not progress
        ):
            _, cache = model.run_with_cache(batch, names_filter=[post_name, indices_name], stop_at_layer=stop)
            post = cache[post_name][..., selected.to(cache[post_name].device)]
            if chosen_only:
                routed = (cache[indices_name] == number).any(dim=-1, keepdim=True)
                post = post.masked_fill(~routed, float("-inf"))
            tracker.update(post)
    return tracker.result()


@torch.no_grad()
def expert_neuron_logit_effect(
    model: _checks.AnyModel, layer: int, expert: int, neuron: int, k: int = 10
) -> NeuronLogitEffect:
    """Direct effect of one unit of an expert neuron's activation on every logit: ``W_out[E][n] @ W_U``.

    Like ``analysis.readouts.neurons.neuron_logit_effect`` it ignores the final norm, later layers and
    the routing weight the expert's output is multiplied by.
    """
    _checks.check_model(model)
    _checks.require(model, "linear_logits", "expert_neuron_logit_effect", POST_NORM_INSTEAD)
    layer, mixture = _mixture(model, layer, "expert_neuron_logit_effect")
    W_out = mixture.experts[_expert(mixture, expert, "expert_neuron_logit_effect")].W_out
    neuron = _checks._index(neuron, W_out.shape[0], "neuron", "neurons per expert (d_mlp)")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= model.cfg.d_vocab:
        raise ValueError(f"k must be an int in [1, d_vocab={model.cfg.d_vocab}], got {k!r}")
    effect = W_out[neuron] @ model.W_U
    top, bottom = effect.topk(k), effect.topk(k, largest=False)
    return NeuronLogitEffect(effect, top.indices, top.values, bottom.indices, bottom.values)


# ---- direct logit attribution through the routing weights ----------------------------------------


@dataclass
class ExpertAttribution:
    """Direct contributions of the mixtures' experts to a logit (difference), one value per batch entry.

    ``experts [layer, expert, batch]``: ``w_E (post_E W_out[E] + b_out[E]) . c / scale`` for the
    mixtures in ``layers`` (0 for an expert the token did not choose); ``shared [layer, batch]``
    the shared expert's ``g (post W_out + b_out) . c / scale`` (None without one).
    ``total()`` is each mixture's whole contribution, ``LogitAttribution.mlp`` at those layers.
    """

    layers: list[int]
    experts: Float[Tensor, "layer expert batch"]
    shared: Float[Tensor, "layer batch"] | None
    logit_softcap: float | None = None  # set: contributions to the logit before the cap

    def total(self) -> Float[Tensor, "layer batch"]:
        total = self.experts.sum(dim=1)
        return total + self.shared if self.shared is not None else total


def expert_attribution_hook_names(model: _checks.AnyModel) -> list[str]:
    """The hooks ``expert_logit_attribution`` reads: routing, every expert's ``hook_post``, the final scale."""
    names = []
    for layer in moe_layers(model):
        mixture = model.blocks[layer].mlp
        names += routing_hook_names(model, layer) + [expert.hook_post.name for expert in mixture.experts]
        names += [mixture.shared_expert.hook_post.name] if mixture.shared_expert is not None else []
        writer = model.blocks[layer].writer("mlp")
        names += [writer.scale_hook] if writer.output_norm is not None else []
    return names + _checks.final_scale_names(model)


def _readout(cache: ActivationCache, tokens, incorrect_tokens, pos, what: str) -> _Readout:
    _checks.check_cache(cache)
    _checks.require(cache.model, "linear_logits", what, POST_NORM_INSTEAD)
    return _Readout(cache, tokens, incorrect_tokens, pos, what, expert_attribution_hook_names(cache.model))


def _routing_at_pos(readout: _Readout, layer: int) -> Tensor:
    """``[batch, expert]``: every expert's routing weight at the chosen position (0 where not chosen)."""
    names = routing_hook_names(readout.model, layer)
    indices, weights = readout.at_pos(names[0]), readout.at_pos(names[1])
    dense = weights.new_zeros(weights.shape[0], readout.model.blocks[layer].mlp.n_experts)
    return dense.scatter_add(-1, indices, weights)


@torch.no_grad()
def expert_logit_attribution(
    cache: ActivationCache, tokens: TokenArg, incorrect_tokens: TokenArg | None = None, pos: PosArg = -1
) -> ExpertAttribution:
    """Each expert's direct contribution to ``logit(tokens) - logit(incorrect_tokens)`` (see the module docstring)."""
    readout = _readout(cache, tokens, incorrect_tokens, pos, "expert_logit_attribution")
    model, layers = readout.model, moe_layers(readout.model)
    experts, shared = [], []
    for layer in layers:
        mixture, routing = model.blocks[layer].mlp, _routing_at_pos(readout, layer)
        c_mlp = readout.through(model.blocks[layer].writer("mlp"))
        # [expert, batch, d_mlp]
        posts = torch.stack([readout.at_pos(expert.hook_post.name) for expert in mixture.experts])
        outputs = einops.einsum(
            posts, mixture.stacked("W_out"), "expert batch d_mlp, expert d_mlp d_model -> expert batch d_model"
        )
        outputs = outputs + mixture.stacked("b_out")[:, None]
        experts.append(einops.rearrange(routing, "batch expert -> expert batch") * readout.read(outputs, c_mlp))
        if mixture.shared_expert is not None:
            post = readout.at_pos(mixture.shared_expert.hook_post.name)
            gate = readout.at_pos(routing_hook_names(model, layer)[2])[:, 0]  # [batch]
            shared.append(gate * readout.read(post @ mixture.shared_expert.W_out + mixture.shared_expert.b_out, c_mlp))
    return ExpertAttribution(
        layers, torch.stack(experts), torch.stack(shared) if shared else None, model.read_out.softcap
    )


@torch.no_grad()
def expert_neuron_logit_attribution(
    cache: ActivationCache, tokens: TokenArg, layer: int, incorrect_tokens: TokenArg | None = None, pos: PosArg = -1
) -> Float[Tensor, "expert d_mlp batch"]:
    """Each expert neuron's direct contribution in block ``layer``: ``w_E post_E[n] W_out[E][n] . c / scale``.

    Per expert, the neurons plus ``w_E b_out[E] . c / scale`` sum to ``ExpertAttribution.experts``.
    """
    readout = _readout(cache, tokens, incorrect_tokens, pos, "expert_neuron_logit_attribution")
    layer, mixture = _mixture(readout.model, layer, "expert_neuron_logit_attribution")
    routing = _routing_at_pos(readout, layer)
    c_mlp = readout.through(readout.model.blocks[layer].writer("mlp"))
    posts = torch.stack([readout.at_pos(expert.hook_post.name) for expert in mixture.experts])  # [expert, batch, d_mlp]
    W_out_c = einops.einsum(
        mixture.stacked("W_out"), c_mlp, "expert d_mlp d_model, batch d_model -> expert d_mlp batch"
    )
    weighted = einops.rearrange(
        posts * einops.rearrange(routing, "batch expert -> expert batch 1"), "expert batch d_mlp -> expert d_mlp batch"
    )
    return weighted * W_out_c / readout.scale


__all__ = [
    "ExpertAttribution",
    "ExpertUsage",
    "STATISTICS",
    "expert_attribution_hook_names",
    "expert_hook_name",
    "expert_logit_attribution",
    "expert_neuron_activations",
    "expert_neuron_logit_attribution",
    "expert_neuron_logit_effect",
    "expert_neuron_summary",
    "expert_top_activations",
    "expert_usage",
    "expert_usage_of",
    "moe_layers",
    "routing_names",
]

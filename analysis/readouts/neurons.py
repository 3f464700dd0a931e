"""MLP neurons: activations, top activating examples by streaming, and direct effect on logits.

A neuron ``n`` of block ``layer`` has activation ``post[n] = act(x W_in[:, n] + b_in[n])``
(``blocks.{layer}.mlp.hook_post``; in a gated MLP ``act(gate) * up``) and writes ``post[n] * W_out[n]`` to the residual
stream. Its *direct logit effect* is the vector ``W_out[n] @ W_U`` over ``d_vocab``:
what one unit of activation adds to each token's logit through the unembedding alone,
ignoring the final LayerNorm (fold LayerNorm into the weights first for a real model)
and every later layer.

Encoders (``EncoderTransformer``): activations, summaries and top activating examples
work the same (``top_activations`` runs its batches without a padding mask, so feed it
texts of equal token length). A neuron of a post-LayerNorm encoder has no direct logit
effect: its write passes through every later ``ln1``/``ln2`` and, for MLM logits, a
non-linear head, so ``neuron_logit_effect`` refuses it; ``analysis.readouts.post_norm``
gives exact direct contributions to a chosen output direction instead.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer import ActivationCache
from interp_transformer.core.shape_checks import shape_checked

from .. import _checks


def post_hook_names(model: _checks.AnyModel, layers=None) -> list[str]:
    """The ``mlp.hook_post`` names of ``layers`` (default: all)."""
    _checks.require_mlp(model, "post_hook_names")
    return [model.act_name("post", layer) for layer in _checks.layer_list(model, layers)]


def neuron_activations(
    cache: ActivationCache, layer: int, neuron: int | None = None
) -> Float[Tensor, "batch pos d_mlp"] | Float[Tensor, "batch pos"]:
    """``hook_post`` of ``layer``: every neuron ``[batch, pos, d_mlp]``, or one ``[batch, pos]``."""
    _checks.check_cache(cache)
    model = cache.model
    layer = _checks.layer_index(model, layer)
    name = post_hook_names(model, layer)[0]
    _checks.require_hooks(cache, [name], "neuron_activations")
    post = _checks.cached(cache, name)
    return post if neuron is None else post[..., _checks.neuron_index(model, neuron)]


def neuron_summary(cache: ActivationCache, statistic: str = "max") -> Float[Tensor, "layer d_mlp"]:
    """One number per neuron over every cached (batch, pos): ``"max"``, ``"mean"`` or ``"abs_mean"``."""
    reducers = {
        "max": lambda post: post.flatten(0, 1).max(dim=0).values,
        "mean": lambda post: post.flatten(0, 1).mean(dim=0),
        "abs_mean": lambda post: post.flatten(0, 1).abs().mean(dim=0),
    }
    if statistic not in reducers:
        raise ValueError(f"statistic must be one of {sorted(reducers)}, got {statistic!r}")
    _checks.check_cache(cache)
    names = post_hook_names(cache.model)
    _checks.require_hooks(cache, names, "neuron_summary")
    return torch.stack([reducers[statistic](_checks.cached(cache, name)) for name in names])


# ---- top activating examples, by streaming -------------------------------------------


@dataclass
class TopActivations:
    """The ``k`` largest activations of each neuron and where they occurred, largest first.

    ``values``, ``text_index`` and ``position`` are ``[neuron, k]``: activation
    ``values[i, j]`` of neuron ``neurons[i]`` occurred in text ``text_index[i, j]``
    (counted across all batches fed in) at position ``position[i, j]``.
    """

    neurons: Int[Tensor, "neuron"]
    values: Float[Tensor, "neuron k"]
    text_index: Int[Tensor, "neuron k"]
    position: Int[Tensor, "neuron k"]


class StreamingTopK:
    """Keep the ``k`` largest activations per neuron over batches of any number.

    Memory is ``O(n_neurons * k)`` plus one batch, whatever the amount of data: each
    ``update`` merges the batch's own top-k with the running top-k and keeps the best ``k``.
    The result equals ``topk`` over the whole activation tensor (up to the order of ties).
    """

    def __init__(self, k: int, neurons: int | Sequence[int] | Tensor):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        neurons = torch.arange(neurons) if isinstance(neurons, int) else torch.as_tensor(neurons, dtype=torch.long)
        self.k, self.neurons = k, neurons
        n = len(neurons)
        self.values = torch.empty(n, 0)
        self.text_index = torch.empty(n, 0, dtype=torch.long)
        self.position = torch.empty(n, 0, dtype=torch.long)
        self.n_texts = 0

    @shape_checked
    def update(self, activations: Float[Tensor, "batch pos neuron"]) -> None:
        """Merge ``activations`` of the next ``batch`` texts (the selected neurons, in order)."""
        if activations.shape[-1] != len(self.neurons):
            raise ValueError(
                f"activations have {activations.shape[-1]} neurons, this tracker follows {len(self.neurons)}"
            )
        batch, n_pos, _ = activations.shape
        flat = einops.rearrange(activations.detach().cpu(), "batch pos neuron -> neuron (batch pos)")
        top = flat.topk(min(self.k, flat.shape[1]), dim=1)
        values = torch.cat([self.values.to(flat.dtype), top.values], dim=1)
        text_index = torch.cat([self.text_index, top.indices // n_pos + self.n_texts], dim=1)
        position = torch.cat([self.position, top.indices % n_pos], dim=1)
        best = values.topk(min(self.k, values.shape[1]), dim=1)
        self.values = best.values
        self.text_index = text_index.gather(1, best.indices)
        self.position = position.gather(1, best.indices)
        self.n_texts += batch

    def result(self) -> TopActivations:
        if self.n_texts == 0:
            raise ValueError("StreamingTopK.result(): no activations were fed in")
        return TopActivations(self.neurons, self.values, self.text_index, self.position)


def _batches(tokens, batch_size: int) -> Iterable[Tensor]:
    if isinstance(tokens, Tensor):
        if tokens.ndim != 2:
            raise ValueError(
                f"tokens must be [n_texts, pos] or an iterable of [batch, pos] tensors, got shape {tuple(tokens.shape)}"
            )
        return tokens.split(batch_size)
    return tokens


def top_activations(
    model: _checks.AnyModel,
    tokens: Int[Tensor, "n_texts pos"] | Iterable[Int[Tensor, "batch pos"]],
    layer: int,
    neurons: None | int | Sequence[int] | Tensor = None,
    k: int = 10,
    batch_size: int = 16,
    progress: bool = False,
) -> TopActivations:
    """The ``k`` (text, position) pairs where each neuron of ``layer`` fires most.

    ``tokens`` is one ``[n_texts, pos]`` tensor (run ``batch_size`` texts at a time) or any
    iterable of ``[batch, pos]`` tensors (e.g. a generator reading a dataset; batches may
    differ in length). Only ``layer``'s ``hook_post`` is cached and the model stops after
    that block; memory does not grow with the number of texts. ``neurons`` defaults to all.
    """
    _checks.check_model(model)
    layer = _checks.layer_index(model, layer)
    name = post_hook_names(model, layer)[0]
    if neurons is None:
        neurons = torch.arange(model.cfg.d_mlp)
    elif isinstance(neurons, int):
        neurons = torch.tensor([_checks.neuron_index(model, neurons)])
    else:
        neurons = torch.tensor([_checks.neuron_index(model, int(n)) for n in neurons], dtype=torch.long)
    tracker = StreamingTopK(k, neurons)
    stop = layer + 1 if layer + 1 < model.cfg.n_layers else None
    with torch.no_grad():
        for batch in tqdm(_batches(tokens, batch_size), desc=f"top activations L{layer}", disable=not progress):
            _, cache = model.run_with_cache(batch, names_filter=[name], stop_at_layer=stop)
            tracker.update(cache[name][..., neurons.to(cache[name].device)])
    return tracker.result()


# ---- direct effect on the logits ------------------------------------------------------


@dataclass
class NeuronLogitEffect:
    """``effect = W_out[layer, neuron] @ W_U`` over ``d_vocab`` and its extremes.

    ``top_tokens``/``top_values``: the ``k`` tokens the neuron promotes most, largest first;
    ``bottom_tokens``/``bottom_values``: the ``k`` it suppresses most, most negative first.
    """

    effect: Float[Tensor, "d_vocab"]
    top_tokens: Int[Tensor, "k"]
    top_values: Float[Tensor, "k"]
    bottom_tokens: Int[Tensor, "k"]
    bottom_values: Float[Tensor, "k"]


@torch.no_grad()
def neuron_logit_effect(model: _checks.AnyModel, layer: int, neuron: int, k: int = 10) -> NeuronLogitEffect:
    """Direct effect of one unit of ``neuron``'s activation on every logit: ``W_out[n] @ W_U``."""
    _checks.check_model(model)
    _checks.require(
        model,
        "linear_logits",
        "neuron_logit_effect",
        "reads a neuron's write through every later post-norm LayerNorm (or a non-linear head), so W_out[n] W_U is no "
        "direct logit effect; use analysis.readouts.post_norm.encoder_direct_attribution",
    )
    layer = _checks.layer_index(model, layer)
    neuron = _checks.neuron_index(model, neuron)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= model.cfg.d_vocab:
        raise ValueError(f"k must be an int in [1, d_vocab={model.cfg.d_vocab}], got {k!r}")
    effect = model.blocks[layer].mlp.W_out[neuron] @ model.W_U
    top, bottom = effect.topk(k), effect.topk(k, largest=False)
    return NeuronLogitEffect(effect, top.indices, top.values, bottom.indices, bottom.values)

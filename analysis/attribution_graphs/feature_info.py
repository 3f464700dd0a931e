"""What the graph view shows of a feature when it is clicked: its top-activating contexts and its logit effects.

``feature_info_from(model, transcoders, graph, source)`` computes, for each ``(layer, feature)`` among the pruned
graph's kept feature nodes, a ``FeatureInfo``:

- ``top_activations``: the feature's ``k`` largest activations over a small corpus (``source``: texts or token
  ids, as ``interp_transformer.sae.data.token_batches`` takes them), each with a window of context. The model runs
  once per batch up to the deepest layer needed; each layer's transcoder input is read at its ``reads`` hook and
  encoded by that layer's ``LayerTranscoder`` (``transcoder_layers``), exactly as the graph's features are;
- ``top_logits`` and ``bottom_logits``: the tokens whose logits one unit of the feature raises and lowers most,
  through the frozen final norm and the read-out::

      effect[t] = W_dec[f, 0] . pull_back(W_U[:, t])

  with ``W_dec[f, 0]`` the feature's write to its own layer's MLP output (for a cross-layer transcoder, the first
  of its writes; the later ones reach the logits through the same stream but are left out, as circuit-tracer's
  feature pages do) and ``pull_back`` the final norm's own algebra at scale 1 (``w * d`` for RMSNorm), as
  ``analysis.sae_features.feature_logit_effect`` computes it for an SAE.

Any mapping of the same form can be given to ``graph_view`` instead (e.g. from Neuronpedia): ``checked_feature_info``
says what it must hold.
"""

import difflib
from collections.abc import Mapping
from typing import TypedDict

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.harvest.selection import stop_at_layer_for
from interp_transformer.sae.data import TokenBatches, TokenSource, keep_mask, token_batches

from ..sae_features.dashboard import token_strings
from ..sae_features.examples import PAD, StreamingTopExamples
from ..sae_features.logits import VOCAB_CHUNK
from .graph import AttributionGraph
from .pruning import PruneResult, prune_graph
from .transcoders import transcoder_layers

FIELDS = ("top_activations", "top_logits", "bottom_logits")
HIT_MARKS = ("\u00ab", "\u00bb")  # around the activating token of a context: "the «cat» sat"


class FeatureInfo(TypedDict):
    """One feature's page in the graph view; each list may be empty.

    ``top_activations``: ``(context, activation)`` pairs, largest first; ``context`` is a window of text with the
    activating token between ``«`` and ``»``.
    ``top_logits``: ``(token, effect)`` pairs, the logits one unit of the feature raises most, largest first.
    ``bottom_logits``: the logits it lowers most, most negative first.
    """

    top_activations: list[tuple[str, float]]
    top_logits: list[tuple[str, float]]
    bottom_logits: list[tuple[str, float]]


def kept_features(graph: AttributionGraph, pruned: PruneResult) -> list[tuple[int, int]]:
    """The distinct ``(layer, feature)`` pairs of the kept feature nodes, in node order."""
    kept = graph.active_features[pruned.node_mask[graph.features]]
    return list(dict.fromkeys((int(layer), int(feature)) for layer, _, feature in kept.tolist()))


def checked_feature_info(graph: AttributionGraph, feature_info: Mapping | None) -> dict[tuple[int, int], dict]:
    """``feature_info`` checked against ``graph`` (module docstring), as plain lists of ``[str, float]`` pairs.

    Keys are ``(layer, feature)`` pairs of the graph's active features (``KeyError`` for any other key, naming
    it and the nearest active ones); values hold exactly ``FIELDS``, each a list of ``(str, number)`` pairs.
    """
    if feature_info is None:
        return {}
    if not isinstance(feature_info, Mapping):
        raise TypeError(
            "feature_info must be a dict {(layer, feature): FeatureInfo} (e.g. from feature_info_from), "
            f"got {type(feature_info).__name__}"
        )
    active = {(int(layer), int(feature)) for layer, _, feature in graph.active_features.tolist()}
    checked = {}
    for key, info in feature_info.items():
        if (
            not isinstance(key, tuple)
            or len(key) != 2
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in key)
        ):
            raise TypeError(f"feature_info keys must be (layer, feature) pairs of ints, got {key!r}")
        if key not in active:
            names = {f"L{layer}:F{feature}": (layer, feature) for layer, feature in sorted(active)}
            close = [names[name] for name in difflib.get_close_matches(f"L{key[0]}:F{key[1]}", names, n=3)]
            raise KeyError(
                f"feature_info has an entry for (layer, feature) = {key}, which is no active feature of the graph; "
                f"expected one of its {len(active)} active (layer, feature) pairs"
                + (f", e.g. {close}" if close else "")
            )
        checked[key] = _checked_info(key, info)
    return checked


def _checked_info(key: tuple[int, int], info) -> dict:
    if not isinstance(info, Mapping):
        raise TypeError(f"feature_info[{key}] must be a FeatureInfo dict with keys {FIELDS}, got {type(info).__name__}")
    if set(info) != set(FIELDS):
        missing, extra = sorted(set(FIELDS) - set(info)), sorted(set(info) - set(FIELDS), key=str)
        raise KeyError(f"feature_info[{key}] must have the keys {FIELDS}; missing {missing}, unexpected {extra}")
    checked = {}
    for field in FIELDS:
        pairs = info[field]
        good = isinstance(pairs, (list, tuple)) and all(
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], (int, float))
            and not isinstance(pair[1], bool)
            and abs(float(pair[1])) != float("inf")
            and float(pair[1]) == float(pair[1])
            for pair in pairs
        )
        if not good:
            raise TypeError(
                f"feature_info[{key}][{field!r}] must be a list of (str, finite number) pairs, got {str(pairs)[:120]}"
            )
        checked[field] = [[text, float(value)] for text, value in pairs]
    return checked


@torch.no_grad()
def feature_info_from(
    model,
    transcoders,
    graph: AttributionGraph,
    source: TokenBatches | TokenSource,
    *,
    pruned: PruneResult | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    k: int = 5,
    n_logits: int = 5,
    left: int = 8,
    right: int = 4,
    batch_size: int = 16,
    context_length: int | None = None,
    exclude_special_tokens: bool = True,
) -> dict[tuple[int, int], FeatureInfo]:
    """``{(layer, feature): FeatureInfo}`` for the kept features of ``graph`` (module docstring).

    ``pruned`` (default ``prune_graph(graph, node_threshold, edge_threshold)``) says which features are kept.
    ``k`` contexts per feature (only positive activations; positions holding a special token are left out unless
    ``exclude_special_tokens=False``), each ``left`` tokens before and ``right`` after; ``n_logits`` tokens each
    way. ``ValueError`` when the transcoders are not those of the graph: another number of layers, a feature
    index past a layer's width, or activations on the graph's prompt that differ from the graph's.
    """
    if not isinstance(graph, AttributionGraph):
        raise TypeError(f"graph must be an AttributionGraph (from attribute), got {type(graph).__name__}")
    for name, value, largest in (("k", k, None), ("n_logits", n_logits, model.cfg.d_vocab)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (largest and value > largest):
            bound = f" at most d_vocab={largest}" if largest else ""
            raise ValueError(f"{name} must be a positive int{bound}, got {value!r}")
    layers = transcoder_layers(model, transcoders)
    if len(layers) != graph.n_layers:
        raise ValueError(f"the graph has {graph.n_layers} layers; the transcoders have {len(layers)}")
    pruned = pruned if pruned is not None else prune_graph(graph, node_threshold, edge_threshold)
    if tuple(pruned.node_mask.shape) != (graph.n_nodes,):
        raise ValueError(
            f"pruned.node_mask must have shape [{graph.n_nodes}] (the graph's nodes), "
            f"got {list(pruned.node_mask.shape)}"
        )
    followed = kept_features(graph, pruned)
    for layer, _, feature in graph.active_features.tolist():
        if feature >= layers[layer].d_transcoder:
            raise ValueError(
                f"the graph has feature {feature} in layer {layer}; that layer's transcoder has "
                f"d_transcoder={layers[layer].d_transcoder}: was the graph made with other transcoders?"
            )
    _check_prompt_activations(model, layers, graph)
    if not followed:
        return {}
    examples = _top_examples(
        model, layers, followed, source, (k, left, right), batch_size, context_length, exclude_special_tokens
    )
    effects = _logit_effects(model, layers, followed)
    info = {}
    for row, key in enumerate(followed):
        top, bottom = effects[row].topk(n_logits), effects[row].topk(n_logits, largest=False)
        info[key] = FeatureInfo(
            top_activations=examples[row],
            top_logits=_named(model, top.indices, top.values),
            bottom_logits=_named(model, bottom.indices, bottom.values),
        )
    return info


def _layer_inputs(model, tokens: Int[Tensor, "batch pos"], names: list[str]) -> dict[str, Tensor]:
    """Each hook in ``names`` on ``tokens``, running only the blocks they need."""
    stop = stop_at_layer_for(model, names)
    kwargs = {} if stop is None or stop >= model.cfg.n_layers else {"stop_at_layer": stop}
    _, cache = model.run_with_cache(tokens, names_filter=names, **kwargs)
    return {name: cache[name] for name in names}


def _followed_acts(layers, followed, inputs: dict[str, Tensor]) -> Float[Tensor, "batch pos feature"]:
    """The followed features' activations, in ``followed``'s order, each layer encoded once by its transcoder."""
    by_layer: dict[int, list[int]] = {}
    for column, (layer, _) in enumerate(followed):
        by_layer.setdefault(layer, []).append(column)
    x = inputs[layers[followed[0][0]].reads]
    acts = x.new_zeros(x.shape[0], x.shape[1], len(followed))
    for layer, columns in by_layer.items():
        x = inputs[layers[layer].reads]
        flat = einops.rearrange(x, "batch pos d_model -> (batch pos) d_model")
        encoded = einops.rearrange(layers[layer].encode(flat), "(batch pos) f -> batch pos f", batch=x.shape[0])
        acts[..., columns] = encoded[..., [followed[column][1] for column in columns]]
    return acts


def _check_prompt_activations(model, layers, graph: AttributionGraph) -> None:
    """``ValueError`` unless encoding the graph's prompt gives the graph's activations (same model, transcoders)."""
    features = [(int(layer), int(feature)) for layer, _, feature in graph.active_features.tolist()]
    if not features:
        return
    names = sorted({layers[layer].reads for layer, _ in features})
    acts = _followed_acts(layers, features, _layer_inputs(model, graph.tokens[None].to(model.W_E.device), names))[0]
    positions = graph.active_features[:, 1].to(acts.device)
    found = acts[positions, torch.arange(len(features), device=acts.device)].double().cpu()
    expected = graph.activation_values.double()
    gap = float((found - expected).abs().max())
    if gap > 1e-4 * (1 + float(expected.abs().max())):
        raise ValueError(
            f"the graph's feature activations differ from these transcoders' on its prompt by up to {gap:.3g}: "
            "expected the model and transcoders the graph was made with"
        )


def _top_examples(model, layers, followed, source, window, batch_size, context_length, exclude_special):
    """Per followed feature, its top ``(context, activation)`` pairs over ``source`` (positive activations only)."""
    batches = (
        source
        if isinstance(source, TokenBatches)
        else token_batches(model, source, batch_size=batch_size, context_length=context_length)
    )
    excluded = batches.special_token_ids if exclude_special else ()
    k, left, right = window
    streaming = StreamingTopExamples(k, torch.arange(len(followed)), left, right)
    names = sorted({layers[layer].reads for layer, _ in followed})
    for tokens in batches:
        tokens = tokens.to(model.W_E.device)
        acts = _followed_acts(layers, followed, _layer_inputs(model, tokens, names))
        streaming.update(acts, tokens, keep_mask(tokens, excluded))
    if streaming.n_texts == 0:
        raise ValueError(f"{batches.description} gave no tokens to read")
    found = streaming.result()
    joiner = "" if getattr(model, "tokenizer", None) is not None else " "  # token ids need a space between them
    contexts = []
    for row in range(len(followed)):
        pairs = []
        for value, window in zip(found.values[row].tolist(), found.window_tokens[row].tolist()):
            if not value > 0:  # an unfilled slot (-inf) or a position where the feature is off
                continue
            pieces = token_strings(model, [token for token in window if token != PAD])
            hit = left - sum(token == PAD for token in window[:left])
            pieces[hit] = HIT_MARKS[0] + pieces[hit] + HIT_MARKS[1]
            pairs.append((joiner.join(pieces), float(value)))
        contexts.append(pairs)
    return contexts


def _logit_effects(model, layers, followed) -> Float[Tensor, "feature d_vocab"]:
    """One unit of each followed feature's own-layer write, read through the frozen final norm and the read-out."""
    writes = torch.stack([layers[layer].decoders[feature, 0] for layer, feature in followed])
    W_U, norm = model.read_out.W_U.detach(), model.final_norm
    columns = []
    for W_U_chunk in W_U.split(VOCAB_CHUNK, dim=1):
        pulled = W_U_chunk.T if norm is None else norm.pull_back(W_U_chunk.T)  # [chunk, d_model]
        columns.append(writes.to(pulled.dtype) @ pulled.T)
    return torch.cat(columns, dim=1)


def _named(model, ids: Int[Tensor, "k"], values: Float[Tensor, "k"]) -> list[tuple[str, float]]:
    """``(token, value)`` pairs."""
    return list(zip(token_strings(model, ids.tolist()), (float(v) for v in values)))


__all__ = ["FIELDS", "FeatureInfo", "checked_feature_info", "feature_info_from", "kept_features"]

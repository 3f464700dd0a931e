"""QK attribution: which parts of the residual stream make an attention head attend from one position to another.

An attribution graph freezes every attention pattern; this module opens one up. On the prompt the
residual stream entering block ``L`` at a position is exactly a sum of components (``stream_components``):

=============  =====================================================  ===========================
kind           one per                                                graph node
=============  =====================================================  ===========================
``token``      the stream entering block 0 (positions included)       token ``pos``
``head``       head ``h`` of an earlier block: ``z_h W_O[h]``         no (``L1H3``)
``attn_bias``  an earlier attention's ``b_O``                         no (``L1 b_O``)
``feature``    active feature ``(l, pos, f)``, ``l < L``: its writes  the feature
               to the MLP outputs ``l .. L-1`` (one for a per-layer
               transcoder, several for a cross-layer one)
``b_dec``      an earlier MLP output's decoder bias                   no (``L1 b_dec``)
``error``      an earlier MLP output's error node                     error ``(layer, pos)``
``skip``       a skip transcoder's ``x W_skip^T``                     no (``L1 skip``)
=============  =====================================================  ===========================

An output norm (Gemma 2/3, OLMo 2) is read with its scale frozen, ``apply_frozen``: a head's write is its
image, and the attention's ``b_O`` and the norm's bias form its ``attn_bias``. With the norm before attention,
and any q/k norm, frozen at their scales on the prompt (``hook_scale``), each component ``c`` gives a query and a
key vector, linearly::

    Q_c = R(query_pos) qnorm(N(c) W_Q[h])          K_c = R(key_pos) knorm(N(c) W_K[g])

with ``N`` the frozen norm without its bias, ``R`` the rotary rotation (none with learned positions) and ``g``
head ``h``'s key/value group. What is left, the norm's bias read through ``W_Q`` (``W_K``) plus ``b_Q`` (``b_K``)
and the q (k) norm's bias, is one more component on each side, ``bias``. The score is then bilinear::

    attn_scores[h, query_pos, key_pos] = scale * (sum_i Q_i) . (sum_j K_j) = sum over i, j of terms[i, j]
    terms[i, j] = scale * Q_i . K_j

``score`` is the model's value of the scores hook before any soft-cap (``hook_attn_scores_uncapped`` where the
attention has one, else ``hook_attn_scores``), and ``qk_attribution`` raises ``RuntimeError`` if the terms do not
sum to it within rounding: a model computing its scores in a way this decomposition does not know is never
answered silently. Refused with a ``ValueError``: a score bias (ALiBi), a key the mask hides, a post-norm block
(a norm of the stream itself), a writer other than attention or an MLP, an index out of range.
"""

from dataclasses import dataclass
from typing import NamedTuple

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.hooks.thread_state import restores_thread_state
from interp_transformer.parts.writers import Writer

from .. import _checks
from .replacement import ReplacementModel

BIAS = "bias"  # the label and kind of the component holding every bias a query (key) side adds
KINDS = ("token", "head", "attn_bias", "feature", "b_dec", "error", "skip", BIAS)  # what a component may be


@dataclass(frozen=True)
class StreamComponents:
    """The residual stream entering block ``layer`` at ``pos``: ``vectors.sum(0)`` is ``hook_resid_pre``.

    ``kinds[i]`` is one of the module docstring's kinds; ``nodes[i]`` the component's node in the prompt's
    attribution graph (``attribute``: features, then errors, then tokens), -1 where it is none.
    """

    layer: int
    pos: int
    labels: list[str]
    kinds: list[str]
    nodes: Int[Tensor, "component"]
    vectors: Float[Tensor, "component d_model"]


class QKTerm(NamedTuple):
    """One term of a score: ``value = terms[query_index, key_index]``."""

    value: float
    query_label: str
    key_label: str
    query_node: int
    key_node: int


@dataclass(frozen=True)
class QKAttribution:
    """Head ``head`` of block ``layer``'s score from ``query_pos`` to ``key_pos``, split into bilinear terms.

    ``terms[i, j]`` is ``scale * query_vectors[i] . key_vectors[j]`` (module docstring) and ``terms.sum()``
    equals ``score``, the model's. Rows follow ``query_labels``/``query_kinds``/``query_nodes`` (the components at
    ``query_pos``, then ``bias``), columns the same at ``key_pos``; nodes are -1 for components that are no node.
    """

    layer: int
    head: int
    query_pos: int
    key_pos: int
    query_labels: list[str]
    key_labels: list[str]
    query_kinds: list[str]
    key_kinds: list[str]
    query_nodes: Int[Tensor, "query_component"]
    key_nodes: Int[Tensor, "key_component"]
    query_vectors: Float[Tensor, "query_component d_head"]  # rotated, as the score reads them
    key_vectors: Float[Tensor, "key_component d_head"]
    terms: Float[Tensor, "query_component key_component"]
    score: float
    scale: float

    def top_terms(self, n: int = 10, kinds: tuple[str, str] | None = ("feature", "feature")) -> list[QKTerm]:
        """The ``n`` largest terms by absolute value, largest first, among query components of kind ``kinds[0]``
        and key components of kind ``kinds[1]`` (``None``: every term). Returns a list of ``QKTerm``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        rows, cols = torch.arange(len(self.query_labels)), torch.arange(len(self.key_labels))
        if kinds is not None:
            if len(kinds) != 2 or not set(kinds) <= set(KINDS):
                raise ValueError(f"kinds must be (query kind, key kind) from {KINDS}, or None; got {kinds!r}")
            rows = torch.tensor([i for i, kind in enumerate(self.query_kinds) if kind == kinds[0]], dtype=torch.long)
            cols = torch.tensor([j for j, kind in enumerate(self.key_kinds) if kind == kinds[1]], dtype=torch.long)
        block = self.terms[rows][:, cols].flatten()
        order = block.abs().argsort(descending=True)[:n].tolist()
        found = []
        for index in order:
            i, j = int(rows[index // len(cols)]), int(cols[index % len(cols)])
            found.append(
                QKTerm(
                    float(self.terms[i, j]),
                    self.query_labels[i],
                    self.key_labels[j],
                    int(self.query_nodes[i]),
                    int(self.key_nodes[j]),
                )
            )
        return found


def _replacement(model, transcoders, tokens) -> ReplacementModel:
    if isinstance(model, ReplacementModel):
        if transcoders is not None or tokens is not None:
            raise ValueError("a ReplacementModel already holds its transcoders and prompt: pass neither again")
        return model
    if transcoders is None or tokens is None:
        raise ValueError("qk_attribution needs a ReplacementModel, or a model with its transcoders and tokens")
    return ReplacementModel(model, transcoders, tokens)


def _bias_vector(norm, width: int, like: Tensor) -> Tensor:
    """The norm's bias ``[width]`` (zeros for a norm without one), asked of its algebra: ``bias_term`` of each axis."""
    return norm.bias_term(torch.eye(width, dtype=like.dtype, device=like.device))


def _attention_writer(block, layer: int) -> Writer:
    writer = block.writer("attn")
    units = None if writer is None else writer.units
    if units is None or units.kind != "head":
        raise ValueError(f"block {layer} has no attention with per-head writes: QK attribution reads heads")
    return writer


@restores_thread_state
@torch.no_grad()
def stream_components(replacement: ReplacementModel, layer: int, pos: int, cache=None) -> StreamComponents:
    """The residual stream entering block ``layer`` at ``pos`` as a sum of components (module docstring), from
    ``replacement`` and a ``cache`` holding the earlier attentions' ``hook_z`` (run here when not given)."""
    model, n_pos = replacement.model, replacement.n_pos
    layer = _checks.layer_index(model, layer)
    pos = _checks._index(pos, n_pos, "pos", "positions in the prompt")
    cache = _cached(replacement, _z_hooks(model, layer)) if cache is None else cache
    n_f = replacement.n_features
    if getattr(model, "tokenizer", None) is not None:
        text = list(model.to_str_tokens(replacement.tokens))[pos]
    else:
        text = str(int(replacement.tokens[pos]))
    labels, kinds, nodes, vectors = [f"tok P{pos} {text!r}"], ["token"], [n_f + replacement.n_layers * n_pos + pos], []
    vectors.append(replacement.embed[pos])

    def add(label: str, kind: str, vector: Tensor, node: int = -1) -> None:
        labels.append(label)
        kinds.append(kind)
        nodes.append(node)
        vectors.append(vector)

    for l, block in enumerate(model.blocks[:layer]):
        for step in block.stream():
            if not isinstance(step, Writer) or step.sublayer not in ("attn", "mlp"):
                what = f"writer {step.sublayer!r}" if isinstance(step, Writer) else f"norm of the stream {step.name!r}"
                raise ValueError(
                    f"block {l} has a {what}: QK attribution reads blocks whose stream is a sum of attention and MLP "
                    "writes"
                )
            if step.sublayer == "attn":
                units = _attention_writer(block, l).units
                scale = None if step.output_norm is None else replacement.frozen[step.scale_hook][0, pos]
                heads = step.to_stream(units.writes(cache[units.hook][0, pos]), scale)
                for h, write in enumerate(heads):
                    add(f"L{l}{units.letter}{h}", "head", write)
                bias = step.to_stream(step.bias_write(lambda name: cache[name][0, pos]), scale)
                if step.output_norm is not None:
                    bias = bias + _bias_vector(step.output_norm, bias.shape[-1], bias)
                add(f"L{l} b_O", "attn_bias", bias)
            else:
                _add_mlp_output(replacement, layer, l, pos, add)
    return StreamComponents(layer, pos, labels, kinds, torch.tensor(nodes, dtype=torch.long), torch.stack(vectors))


def _add_mlp_output(replacement: ReplacementModel, layer: int, out_layer: int, pos: int, add) -> None:
    """MLP output ``out_layer`` at ``pos``: ``b_dec``, error, skip, and layer ``out_layer``'s features with all their
    writes to outputs before ``layer``."""
    spec, n_pos = replacement.layers[out_layer], replacement.n_pos
    add(f"L{out_layer} b_dec", "b_dec", spec.b_dec)
    add(
        f"err L{out_layer}/P{pos}",
        "error",
        replacement.errors[out_layer, pos],
        replacement.n_features + out_layer * n_pos + pos,
    )
    skip = spec.skip_term(replacement.inputs[out_layer][pos])
    if skip is not None:
        add(f"L{out_layer} skip", "skip", skip)
    writes = replacement.writes[out_layer]
    n_out = min(writes.writes.shape[2], layer - out_layer)  # a cross-layer feature's outputs before block `layer`
    for local in (writes.pos == pos).nonzero()[:, 0].tolist():
        index = writes.span.start + local
        feature = int(replacement.active_features[index, 2])
        add(f"L{out_layer}/P{pos}/F{feature}", "feature", writes.writes[pos, writes.rank[local], :n_out].sum(0), index)


def _cached(replacement: ReplacementModel, names: list[str]) -> dict:
    """The model's activations at ``names`` on the prompt, by name (empty without names)."""
    if not names:
        return {}
    wanted = set(names)
    _, cache = replacement.model.run_with_cache(replacement.tokens[None], names_filter=lambda name: name in wanted)
    return {name: cache[name] for name in wanted}


def _z_hooks(model, layer: int) -> list[str]:
    """The hooks ``stream_components`` reads: each earlier attention's ``hook_z`` and its bias hooks."""
    names = []
    for l, block in enumerate(model.blocks[:layer]):
        writer = _attention_writer(block, l)
        names += [writer.units.hook] + writer.bias_hooks()
    return names


def _frozen_head_norm(norm, heads: Tensor, scale: Tensor) -> Tensor:
    """A q or k norm with its scale frozen, on ``heads [component, head_index, d_head]`` (the last component the
    bias one, which also gets the norm's bias). ``scale`` is ``[head_index, 1]`` for a norm over each head's
    ``d_head`` (Qwen3, Gemma 3) or ``[1]`` for one over every head together (OLMo 2): either way the heads are
    grouped as the norm reads them."""
    groups = scale.numel()
    grouped = heads.reshape(heads.shape[0], groups, -1)
    normed = norm.apply_frozen(grouped, scale.reshape(groups, 1))
    normed[-1] += _bias_vector(norm, grouped.shape[-1], grouped)
    return normed.reshape(heads.shape)


def _side(replacement: ReplacementModel, attn, norm, parts: StreamComponents, side: str, index: int) -> Tensor:
    """``[component + 1, d_head]``: each component's query (``side="q"``) or key vector for head (or key/value
    head) ``index``, rotated at the components' position, then the bias component's."""
    frozen, pos = replacement.frozen, parts.pos
    x = parts.vectors
    bias = x.new_zeros(x.shape[-1])
    if norm is not None:
        x = norm.apply_frozen(x, frozen[norm.hook_scale.name][0, pos])
        bias = _bias_vector(norm, x.shape[-1], x)
    x = torch.cat([x, bias[None]])
    W, b = (attn.W_Q, attn.b_Q) if side == "q" else (attn.stored("W_K"), attn.stored("b_K"))
    heads = einops.einsum(x, W, "component d_model, head_index d_model d_head -> component head_index d_head")
    heads[-1] += b
    qk_norm = attn.q_norm if side == "q" else attn.k_norm
    if qk_norm is not None:
        if not hasattr(qk_norm, "apply_frozen") or not hasattr(qk_norm, "hook_scale"):
            raise ValueError(
                f"the {side} norm of this attention ({type(qk_norm).__name__}) has no frozen-scale algebra "
                "(apply_frozen, hook_scale): with it the score is not bilinear in the stream"
            )
        heads = _frozen_head_norm(qk_norm, heads, frozen[qk_norm.hook_scale.name][0, pos])
    vectors = heads[:, index]
    if attn.rotary is not None:
        positions = torch.full((vectors.shape[0], 1), pos, dtype=torch.long, device=vectors.device)
        vectors = attn.rotary(vectors[:, None, None], positions)[:, 0, 0]
    return vectors


@restores_thread_state
@torch.no_grad()
def qk_attribution(
    model, transcoders=None, tokens=None, *, layer: int, head: int, query_pos: int, key_pos: int
) -> QKAttribution:
    """Head ``head`` of block ``layer``'s attention score from ``query_pos`` to ``key_pos`` on one prompt, split into
    ``terms[query component, key component]`` that sum to it (module docstring). Returns a ``QKAttribution``.

    ``model`` is a ``ReplacementModel`` (then no ``transcoders`` or ``tokens``), or a model with its
    ``transcoders`` and ``tokens``, from which one is built as ``attribute`` builds it: feature and error
    components are the graph's nodes. Negative indices count from the end.
    """
    replacement = _replacement(model, transcoders, tokens)
    model, n_pos = replacement.model, replacement.n_pos
    layer = _checks.layer_index(model, layer)
    block = model.blocks[layer]
    attn = _attention_writer(block, layer).part
    head = _checks._index(head, attn.n_heads, "head", "query heads per layer")
    query_pos = _checks._index(query_pos, n_pos, "query_pos", "positions in the prompt")
    key_pos = _checks._index(key_pos, n_pos, "key_pos", "positions in the prompt")
    if getattr(attn, "score_bias", None) is not None:
        raise ValueError(
            f"block {layer}'s attention adds a score bias ({type(attn.score_bias).__name__}) that no "
            "stream component carries: QK attribution splits scores of the form scale * q . k only"
        )
    scores_hook = getattr(attn, "hook_attn_scores_uncapped", None)  # before a soft-cap, where there is one
    scores_hook = attn.hook_attn_scores if scores_hook is None else scores_hook
    cache = _cached(replacement, _z_hooks(model, layer) + [scores_hook.name])
    score = cache[scores_hook.name][0, head, query_pos, key_pos]
    if not torch.isfinite(score):
        raise ValueError(
            f"block {layer}'s mask hides key_pos={key_pos} from query_pos={query_pos} (score {float(score)}): "
            "the head cannot attend there"
        )
    readers = block.norm_readers() if hasattr(block, "norm_readers") else []
    norm = next((norm for norm, part in readers if part is attn), None)
    if norm is not None and not (hasattr(norm, "apply_frozen") and hasattr(norm, "hook_scale")):
        raise ValueError(f"block {layer}'s attention reads a {type(norm).__name__}, which has no frozen-scale algebra")
    queries = stream_components(replacement, layer, query_pos, cache)
    keys = stream_components(replacement, layer, key_pos, cache)
    group = attn.n_heads // attn.n_key_value_heads
    query_vectors = _side(replacement, attn, norm, queries, "q", head)
    key_vectors = _side(replacement, attn, norm, keys, "k", head // group)
    terms = einops.einsum(query_vectors, key_vectors, "query d_head, key d_head -> query key") * attn.scale
    _check_sum(terms, score, layer, head)
    no_node = torch.tensor([-1])
    return QKAttribution(
        layer=layer,
        head=head,
        query_pos=query_pos,
        key_pos=key_pos,
        query_labels=queries.labels + [BIAS],
        key_labels=keys.labels + [BIAS],
        query_kinds=queries.kinds + [BIAS],
        key_kinds=keys.kinds + [BIAS],
        query_nodes=torch.cat([queries.nodes, no_node]),
        key_nodes=torch.cat([keys.nodes, no_node]),
        query_vectors=query_vectors,
        key_vectors=key_vectors,
        terms=terms,
        score=float(score),
        scale=float(attn.scale),
    )


def _check_sum(terms: Tensor, score: Tensor, layer: int, head: int) -> None:
    """``RuntimeError`` unless the terms sum to the model's score within rounding (1000 ulps of their magnitude)."""
    total = terms.sum()
    tolerance = 1000 * torch.finfo(terms.dtype).eps * (terms.abs().sum() + score.abs())
    if (total - score).abs() > tolerance:
        raise RuntimeError(
            f"the QK terms of block {layer} head {head} sum to {float(total):.6g}, the model's score is "
            f"{float(score):.6g}: this attention computes its scores in a way the decomposition does not know"
        )


__all__ = ["KINDS", "QKAttribution", "QKTerm", "StreamComponents", "qk_attribution", "stream_components"]

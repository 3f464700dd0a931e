"""``AttributionGraph``: the nodes of one prompt's replacement model and the direct effect of each on each.

Nodes, in circuit-tracer's order (``graph.features``, ``graph.errors``, ``graph.tokens``, ``graph.logits``
are their slices):

=============  ===========================================  ==================================
kind           one per                                      its value
=============  ===========================================  ==================================
feature        active feature ``(layer, pos, feature)``     its activation
error          layer and position (layer-major)             ``mlp_out - reconstruction`` (a vector)
token          position                                     the stream entering block 0 (a vector)
logit          salient next-token logit                     ``logit - mean logit`` at the last
                                                            position (before any soft-cap)
=============  ===========================================  ==================================

``adjacency_matrix[target, source]`` is the direct effect of ``source`` on ``target`` in the replacement
model: how much ``target`` changes when ``source`` is removed and nothing else recomputes (features
keep their activations, attention patterns and norm scales stay frozen). Errors and tokens have no
inputs; features and logits do, and each sums exactly::

    adjacency_matrix[t].sum() + bias[t] + unselected_effect[t] == value[t]

``bias`` is what the target is with every source removed: biases of attention, norms, transcoders
and the read-out, carried through the frozen model. A graph built with ``max_feature_nodes`` holds only
the features visited (``selected_features``: their rows among the prompt's active features); the direct
effect of the other active features on each target is summed in ``unselected_effect`` (0 when every
active feature is a node).
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor


def rows_of(name: str) -> property:
    """A read-only size: the number of rows of the tensor attribute ``name`` (a graph's and a replacement model's
    positions, features, logits and nodes)."""
    return property(lambda self: getattr(self, name).shape[0], doc=f"rows of ``{name}``")


# ``AttributionGraph.label``'s spelling of each kind of node (``node_fields``)
LABELS = {
    "feature": "L{layer}/P{pos}/F{feature}",
    "error": "err L{layer}/P{pos}",
    "token": "tok P{pos} {text!r}",
    "logit": "logit {text!r}",
}


@dataclass
class AttributionGraph:
    """One prompt's attribution graph (module docstring)."""

    tokens: Int[Tensor, "pos"]
    active_features: Int[Tensor, "feature 3"]  # (layer, pos, feature index in its transcoder)
    activation_values: Float[Tensor, "feature"]
    logit_tokens: Int[Tensor, "logit"]
    logit_probabilities: Float[Tensor, "logit"]
    logit_values: Float[Tensor, "logit"]  # logit - mean logit, before any soft-cap
    adjacency_matrix: Float[Tensor, "node node"]  # [target, source]
    bias: Float[Tensor, "node"]  # 0 for errors and tokens
    n_layers: int
    prompt: str = ""
    str_tokens: list[str] | None = None  # the prompt's tokens as text, when the model has a tokenizer
    logit_str_tokens: list[str] | None = None
    scan: str | None = None  # a name for the transcoders (Neuronpedia's "scan")
    d_transcoder: int | None = None  # the widest layer's number of features
    selected_features: Int[Tensor, "feature"] | None = None  # rows among all active features; None: all
    unselected_effect: Float[Tensor, "node"] | None = None  # direct effect of active features left out

    def __post_init__(self) -> None:
        if self.selected_features is None:
            self.selected_features = torch.arange(self.active_features.shape[0])
        if self.unselected_effect is None:
            self.unselected_effect = torch.zeros(self.adjacency_matrix.shape[0], dtype=self.adjacency_matrix.dtype)

    # --- sizes and slices -----------------------------------------------------------------
    n_pos = rows_of("tokens")
    n_features = rows_of("active_features")
    n_logits = rows_of("logit_tokens")
    n_nodes = rows_of("adjacency_matrix")

    @property
    def features(self) -> slice:
        return slice(0, self.n_features)

    @property
    def errors(self) -> slice:
        return slice(self.n_features, self.n_features + self.n_layers * self.n_pos)

    @property
    def token_nodes(self) -> slice:
        return slice(self.errors.stop, self.errors.stop + self.n_pos)

    @property
    def logits(self) -> slice:
        return slice(self.token_nodes.stop, self.n_nodes)

    # --- nodes ------------------------------------------------------------------------------
    def error_node(self, layer: int, pos: int) -> int:
        """The index of layer ``layer``'s error node at position ``pos``."""
        return (
            self.errors.start
            + self._check(layer, self.n_layers, "layer") * self.n_pos
            + self._check(pos, self.n_pos, "pos")
        )

    def token_node(self, pos: int) -> int:
        return self.token_nodes.start + self._check(pos, self.n_pos, "pos")

    def logit_node(self, index: int) -> int:
        """The node of the ``index``-th salient logit (most probable first)."""
        return self.logits.start + self._check(index, self.n_logits, "logit index")

    def feature_node(self, layer: int, pos: int, feature: int) -> int:
        """The node of an active feature; ``KeyError`` if it is not active on the prompt."""
        match = (self.active_features == torch.tensor([layer, pos, feature])).all(dim=1).nonzero()
        if len(match) == 0:
            raise KeyError(f"feature {feature} of layer {layer} is not active at position {pos}")
        return int(match[0, 0])

    @staticmethod
    def _check(value: int, size: int, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
            raise ValueError(f"{name} must be an int in [0, {size}), got {value!r}")
        return value

    def kind(self, node: int) -> str:
        """``"feature"``, ``"error"``, ``"token"`` or ``"logit"``."""
        for name, span in (("feature", self.features), ("error", self.errors), ("token", self.token_nodes)):
            if span.start <= node < span.stop:
                return name
        if self.logits.start <= node < self.logits.stop:
            return "logit"
        raise ValueError(f"node must be in [0, {self.n_nodes}), got {node}")

    def layer_and_pos(self, node: int) -> tuple[int, int]:
        """Where a node sits: its layer (-1 for tokens, ``n_layers`` for logits) and position."""
        kind = self.kind(node)
        if kind == "feature":
            layer, pos, _ = self.active_features[node].tolist()
            return layer, pos
        if kind == "error":
            return divmod(node - self.errors.start, self.n_pos)
        if kind == "token":
            return -1, node - self.token_nodes.start
        return self.n_layers, self.n_pos - 1

    def node_fields(self, node: int) -> dict:
        """What names a node, for a spelling's ``str.format``: its ``kind``, ``layer`` and ``pos``, a feature's
        ``feature`` (its index in its transcoder), a token's or logit's ``token`` (id) and ``text`` (else None)."""
        kind = self.kind(node)
        layer, pos = self.layer_and_pos(node)
        fields = dict(kind=kind, layer=layer, pos=pos, feature=None, token=None, text=None)
        if kind == "feature":
            fields["feature"] = int(self.active_features[node, 2])
        elif kind in ("token", "logit"):
            index = pos if kind == "token" else node - self.logits.start
            ids, texts = (
                (self.tokens, self.str_tokens) if kind == "token" else (self.logit_tokens, self.logit_str_tokens)
            )
            fields["token"] = int(ids[index])
            fields["text"] = texts[index] if texts else str(fields["token"])
        return fields

    def label(self, node: int) -> str:
        """A short name: ``L1/P3/F17``, ``err L1/P3``, ``tok P3 'cat'``, ``logit ' dog'``."""
        fields = self.node_fields(node)
        return LABELS[fields["kind"]].format(**fields)

    @property
    def values(self) -> Float[Tensor, "node"]:
        """Each target's value (features: activation; logits: ``logit - mean logit``); 0 for errors and tokens."""
        values = torch.zeros(self.n_nodes, dtype=self.adjacency_matrix.dtype)
        values[self.features] = self.activation_values.to(values.dtype)
        values[self.logits] = self.logit_values.to(values.dtype)
        return values

    def logit_weights(self) -> Float[Tensor, "node"]:
        """The logits' probabilities at the logit nodes, 0 elsewhere: where influence starts."""
        weights = torch.zeros(self.n_nodes, dtype=self.adjacency_matrix.dtype)
        weights[self.logits] = self.logit_probabilities.to(weights.dtype)
        return weights


__all__ = ["AttributionGraph"]

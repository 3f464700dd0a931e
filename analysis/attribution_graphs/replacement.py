"""The replacement model of one prompt: the model made linear from its feature activations to its logits.

On the prompt, every attention pattern (with the queries and keys that made it) and every norm's
scale (``hook_scale``, the denominator: pre-norms, output norms as Gemma 2/3's, stream norms and the
final norm) is frozen at its value, and each MLP's write ``mlp_out_o`` becomes::

    mlp_out_o = b_dec_o + sum over active features (l, p, f) writing to o of a_f W_dec_l[f, o - l] at p
                + error_o + x_o W_skip^T

with ``error_o = mlp_out_o(prompt) - reconstruction_o(prompt)`` a constant (the error node) and the
feature activations ``a_f`` held at their values on the prompt. Nothing else in the model is
non-linear in the stream, so every logit, and every feature's pre-activation ``x_l W_enc + b_enc``,
is an affine function of the sources: the active features, the error nodes (one per layer and
position) and the token embeddings (the stream entering block 0, positions included). On the prompt
it computes exactly what the model computes.

It runs the model's own forward with hooks (``model.hooks``): nothing is rewritten, and an
architecture whose blocks declare their parts gets its replacement model without an edit here.
The MLPs still run (on one row, detached), their outputs unused.

All of it belongs to the thread running it (``interp_transformer.hooks.thread_state``): the hooks, the frozen
patterns, the one-row MLPs, and the weights, read as their detached views in that thread only (no
``requires_grad`` is switched on the shared parameters), so another thread may run or train the same model
meanwhile. Each call (``ReplacementModel(...)``, ``run``, ``attribute``) leaves its thread as it found it, also when
interrupted; what a ``with replacement.backward_pass(...)`` block interrupted before its body leaves,
``model.reset_hooks()`` removes.

``run(...)`` evaluates the replacement model with each source scaled (a forward pass, no gradient):
what an edge's intervention check compares against. ``backward_pass(batch)`` runs it once with the
sources as leaves of a graph whose gradients give direct effects (``attribute``).
"""

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.hooks.thread_state import attach_forward_hooks, restores_thread_state, with_parameters_detached
from interp_transformer.text.special_tokens import SPECIAL_TOKEN_ATTRIBUTES, special_token_ids

from .. import _checks
from .graph import rows_of
from .transcoders import LayerTranscoder, mlp_slots, transcoder_layers


@dataclass
class ReplacementRun:
    """What ``ReplacementModel.run`` gives, one row per intervention.

    ``features [row, feature]``: each active feature's pre-activation ``x_l W_enc + b_enc``;
    ``logits [row, (pos,) d_vocab]``: as the model gives them (after any soft-cap); ``uncapped [row, d_vocab]``:
    the last position's logits before the read-out's soft-cap (the same where there is none).
    """

    features: Tensor
    logits: Tensor
    uncapped: Tensor


def frozen_hook_names(model) -> tuple[list[str], list[str]]:
    """``(every hook the replacement model freezes, the attention patterns among them)``: each attention's
    ``hook_q``, ``hook_k`` and ``hook_pattern``, and each norm's ``hook_scale`` (asked of the parts: whatever has an
    attention pattern, and whatever norm owns its algebra)."""
    names, patterns = [], []
    for module in model.modules():
        if hasattr(module, "hook_pattern") and hasattr(module, "hook_q") and hasattr(module, "hook_k"):
            names += [module.hook_q.name, module.hook_k.name, module.hook_pattern.name]
            patterns.append(module.hook_pattern.name)
        if hasattr(module, "apply_frozen") and hasattr(module, "hook_scale"):
            names.append(module.hook_scale.name)
    return names, patterns


def _excluded_positions(model, tokens: Tensor, exclude) -> Tensor:
    """``[pos]`` bool: the positions whose features are left out (their MLP outputs become error nodes entirely).

    ``exclude`` is True (the tokenizer's special tokens: the BOS, which transcoders are not trained on, and its
    massive activations), False, or a list of token ids; None means True for a model whose tokenizer names special
    tokens, else False."""
    if exclude is None:
        tokenizer = getattr(model, "tokenizer", None)
        exclude = tokenizer is not None and any(
            getattr(tokenizer, attr, None) is not None for attr in SPECIAL_TOKEN_ATTRIBUTES
        )
    ids = special_token_ids(model, exclude)
    if not ids:
        return torch.zeros_like(tokens, dtype=torch.bool)
    return torch.isin(tokens, torch.tensor(ids, device=tokens.device))


class ReplacementModel:
    """The replacement model of ``model`` with ``transcoders`` on one prompt (module docstring).

    Attributes read by the graph: ``tokens [pos]``; ``layers`` (one ``LayerTranscoder`` per layer);
    ``active_features [n_features, 3]`` as ``(layer, pos, feature)``, ordered by layer, then position,
    then feature; ``activations [n_features]``; ``errors [layer, pos, d_model]``; ``embed [pos, d_model]``;
    ``logits [pos, d_vocab]`` (the model's, on the prompt); ``excluded [pos]``: positions without features
    (``exclude_special_tokens``: by default those of the tokenizer's special tokens, as circuit-tracer leaves the
    BOS without features; their MLP outputs are error nodes entirely).
    """

    @restores_thread_state
    def __init__(self, model, transcoders, tokens: Int[Tensor, "pos"], exclude_special_tokens=None):
        model = _checks.check_model(model)
        _checks.require(model, "next_token_logits", "an attribution graph", "does not give next-token logits")
        if model.read_out is None or model.writers_that("reads_source"):
            raise ValueError("an attribution graph needs a decoder whose logits are a linear read-out of its stream")
        self.model = model
        self.layers: list[LayerTranscoder] = transcoder_layers(model, transcoders)
        self.slots = mlp_slots(model)
        tokens = model.prepare_tokens(tokens)
        if tokens.shape[0] != 1:
            raise ValueError(
                f"an attribution graph reads one prompt: tokens [pos] or [1, pos], got {list(tokens.shape)}"
            )
        self.tokens = tokens[0]
        self.excluded = _excluded_positions(model, self.tokens, exclude_special_tokens)
        self.n_layers = len(self.layers)
        self.embed_hook = model.act_name("resid_pre", 0)
        self.frozen_names, self.pattern_names = frozen_hook_names(model)
        # the attentions that take their frozen pattern whole (``pattern_given``), so that no row makes the scores
        # the pattern replaces; by pattern hook
        self.pattern_parts = {m.hook_pattern.name: m for m in model.modules() if hasattr(m, "pattern_given")}
        names = set(self.frozen_names) | {self.embed_hook}
        names |= {layer.reads for layer in self.layers} | {layer.writes for layer in self.layers}
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
            self.logits = logits[0]
            self.frozen = {name: cache[name] for name in self.frozen_names}
            self.embed = cache[self.embed_hook][0]
            self.inputs = [cache[layer.reads][0] for layer in self.layers]
            self._setup_features([cache[layer.writes][0] for layer in self.layers])

    n_pos = rows_of("tokens")
    n_features = rows_of("active_features")

    def _setup_features(self, outputs: list[Tensor]) -> None:
        """Active features, their writes and the error nodes, from the MLP inputs and outputs on the prompt."""
        found, values, self.writes = [], [], []
        start = 0
        for layer, x in zip(self.layers, self.inputs):
            act = layer.encode(x)
            act[self.excluded] = 0  # no feature at a special token's position: its MLP's write is all error
            pos, feature = act.nonzero(as_tuple=True)  # by position, then feature
            found.append(torch.stack([torch.full_like(pos, layer.layer), pos, feature], dim=1))
            values.append(act[pos, feature])
            self.writes.append(FeatureWrites.of(layer, slice(start, start + len(pos)), pos, feature, act, self.n_pos))
            start += len(pos)
        self.active_features = torch.cat(found)
        self.activations = torch.cat(values)
        recons = [self._written(o) for o in range(self.n_layers)]
        skips = [self._skip(o, x) for o, x in enumerate(self.inputs)]
        self.errors = torch.stack([out - recon - skip for out, recon, skip in zip(outputs, recons, skips)])

    @property
    def feature_slices(self) -> list[slice]:
        """Each layer's features' rows in ``active_features``."""
        return [writes.span for writes in self.writes]

    def _skip(self, out_layer: int, x: Tensor) -> Tensor:
        skip = self.layers[out_layer].skip_term(x)
        return torch.zeros_like(x) if skip is None else skip

    def _written(self, out_layer: int, feature_scale: Tensor | None = None) -> Tensor:
        """``b_dec`` plus what the active features write to MLP output ``out_layer``: ``[pos, d_model]``, or
        ``[row, pos, d_model]`` with each feature's write scaled by ``feature_scale [row, feature]``."""
        shape = (self.n_pos, self.model.cfg.d_model)
        if feature_scale is not None:
            shape = (feature_scale.shape[0],) + shape
        out = self.layers[out_layer].b_dec.expand(shape).clone()
        for layer, writes in zip(self.layers[: out_layer + 1], self.writes):
            if out_layer not in layer.out_layers:
                continue
            to_out = writes.writes[:, :, out_layer - layer.layer]
            if feature_scale is None:
                out += to_out.sum(dim=1)
            else:
                scale = writes.scatter(feature_scale[:, writes.span])
                out += einops.einsum(scale, to_out, "row pos n, pos n d_model -> row pos d_model")
        return out

    def mlp_outputs(self) -> list[Tensor]:
        """Each MLP's output on the prompt, ``[pos, d_model]``, as its sources make it (features, error, skip)."""
        return [self._written(o) + self.errors[o] + self._skip(o, self.inputs[o]) for o in range(self.n_layers)]

    # --- the frozen forward ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _frozen_forward(
        self, embed: Tensor, mlp_out: Callable[[int, Tensor], Tensor], frozen: dict[str, Tensor] | None = None
    ) -> Iterator[dict]:
        """Hooks making the model this replacement model: ``embed`` enters block 0, MLP output ``o`` is
        ``mlp_out(o, x_o)`` with ``x_o`` what layer ``o``'s features read (kept in the yielded dict by layer).
        ``frozen`` (default: the prompt's) holds the value of each frozen hook, one row or one per row."""
        inputs: dict[int, Tensor] = {}
        frozen = self.frozen if frozen is None else frozen

        def freeze(activation: Tensor, hook) -> Tensor:
            return frozen[hook.name].expand_as(activation)

        def keep(layer: int) -> Callable:
            def hook_fn(activation: Tensor, hook) -> Tensor:
                inputs[layer] = activation
                return activation

            return hook_fn

        def replace(layer: int) -> Callable:
            return lambda activation, hook: mlp_out(layer, inputs[layer])

        hooks = [(name, freeze) for name in self.frozen_names] + [(self.embed_hook, lambda act, hook: embed)]
        for layer in self.layers:
            hooks += [(layer.reads, keep(layer.layer)), (layer.writes, replace(layer.layer))]
        with contextlib.ExitStack() as stack:
            # the MLPs' own outputs are replaced: they run on one row, detached, so autograd keeps nothing of them
            # (in this thread: another running the model meanwhile runs them whole)
            for slot in self.slots:
                one_row = _OneRow()
                attach_forward_hooks(stack, slot.part, one_row.before, one_row.after)
            for name, part in self.pattern_parts.items():
                stack.enter_context(part.pattern_given(frozen[name]))
            stack.enter_context(self.model.hooks(hooks))
            yield inputs

    def _forward(self, rows: int, tokens: Tensor | None = None) -> Tensor:
        """The final norm's output ``[rows, pos, d_model]`` (scale frozen), inside ``_frozen_forward``; ``tokens``
        (default: the prompt's, on every row) only set the shape, as the embedding is replaced. The weights are read
        detached, in this thread only: autograd keeps nothing for their gradients, and another thread training the
        model meanwhile is untouched."""
        model = self.model
        tokens = self.tokens.expand(rows, -1) if tokens is None else tokens

        def forward() -> Tensor:
            resid = model(tokens, stop_at_layer=model.cfg.n_layers)
            return resid if model.final_norm is None else model.final_norm(resid)

        return with_parameters_detached(model, forward)

    @restores_thread_state
    @torch.no_grad()
    def run(
        self,
        feature_scale: Float[Tensor, "row feature"] | None = None,
        error_scale: Float[Tensor, "row layer pos"] | None = None,
        token_scale: Float[Tensor, "row pos"] | None = None,
        all_positions: bool = False,
    ) -> ReplacementRun:
        """The replacement model with each source's value multiplied by its scale (1 where a scale is not given).

        Row ``r`` runs feature ``i`` at ``feature_scale[r, i] * a_i``, error node ``(o, p)`` at
        ``error_scale[r, o, p] * error_o[p]`` and the embedding of position ``p`` at ``token_scale[r, p] * embed[p]``.
        Features do not recompute: each keeps its (scaled) prompt activation, so a target changes only by the direct
        effects of the sources scaled.
        """
        rows = next((s.shape[0] for s in (feature_scale, error_scale, token_scale) if s is not None), 1)
        dtype = self.embed.dtype
        shapes = {
            "feature_scale": (rows, self.n_features),
            "error_scale": (rows, self.n_layers, self.n_pos),
            "token_scale": (rows, self.n_pos),
        }
        given = {"feature_scale": feature_scale, "error_scale": error_scale, "token_scale": token_scale}
        scales = {}
        for name, shape in shapes.items():
            scale = given[name]
            if scale is not None and tuple(scale.shape) != shape:
                raise ValueError(f"{name} must have shape {list(shape)}, got {list(scale.shape)}")
            scales[name] = (
                torch.ones(shape, dtype=dtype, device=self.embed.device) if scale is None else scale.to(self.embed)
            )
        embed = scales["token_scale"][..., None] * self.embed

        def mlp_out(layer: int, x: Tensor) -> Tensor:
            errors = scales["error_scale"][:, layer, :, None] * self.errors[layer]
            return self._written(layer, scales["feature_scale"]) + errors + self._skip(layer, x)

        with self._frozen_forward(embed, mlp_out) as inputs:
            normed = self._forward(rows)
        _, pos, feature = self.active_features.unbind(-1)
        pre = torch.empty(rows, self.n_features, dtype=dtype, device=self.embed.device)
        for spec, span in zip(self.layers, self.feature_slices):
            x = inputs[spec.layer][:, pos[span]]
            pre[:, span] = (x * spec.W_enc.detach().T[feature[span]]).sum(-1) + spec.b_enc.detach()[feature[span]]
        read_out = self.model.read_out
        last = normed[:, -1]
        uncapped = last @ read_out.W_U + read_out.b_U
        logits = read_out(normed if all_positions else normed[:, -1:])
        return ReplacementRun(pre, logits if all_positions else logits[:, 0], uncapped)

    def run_without(self, graph, removed: list[list[int]]) -> ReplacementRun:
        """The replacement model once per entry of ``removed``, each without the source nodes of ``graph`` (this
        prompt's ``AttributionGraph``) it lists: a feature, an error node or a token's embedding at scale 0, the
        rest at 1. What an edge's intervention check, or an ablation's prediction, compares against."""
        dtype, device = self.embed.dtype, self.embed.device
        feature_scale = torch.ones(len(removed), self.n_features, dtype=dtype, device=device)
        error_scale = torch.ones(len(removed), self.n_layers, self.n_pos, dtype=dtype, device=device)
        token_scale = torch.ones(len(removed), self.n_pos, dtype=dtype, device=device)
        for row, nodes in enumerate(removed):
            for node in nodes:
                kind, (layer, pos) = graph.kind(node), graph.layer_and_pos(node)
                if kind == "feature":
                    feature_scale[row, int(graph.selected_features[node])] = 0
                elif kind == "error":
                    error_scale[row, layer, pos] = 0
                elif kind == "token":
                    token_scale[row, pos] = 0
                else:
                    raise ValueError(f"node {node} is a {kind} node: only sources (features, errors, tokens) go")
        return self.run(feature_scale, error_scale, token_scale)

    def intervention_effects(self, graph, targets: Sequence[int], sources: Sequence[int]) -> Float[Tensor, "t s"]:
        """``[target, source]``: how much each target of ``graph`` (a feature, or a logit: its logit less the mean
        logit) drops when one source alone is removed, the rest held; one forward row per source. Each edge
        ``graph.adjacency_matrix[target, source]`` equals it: the check of an edge by intervention."""
        kinds = {node: graph.kind(node) for node in targets}
        if any(kind not in ("feature", "logit") for kind in kinds.values()):
            raise ValueError(f"targets must be feature or logit nodes, got {kinds}")

        def values(run: ReplacementRun) -> Tensor:
            mean = run.uncapped.mean(dim=-1)
            return torch.stack(
                [
                    run.features[:, int(graph.selected_features[node])]
                    if kinds[node] == "feature"
                    else run.uncapped[:, int(graph.logit_tokens[node - graph.logits.start])] - mean
                    for node in targets
                ]
            )

        return values(self.run()) - values(self.run_without(graph, [[source] for source in sources]))

    @contextlib.contextmanager
    def backward_pass(self, batch: int) -> Iterator["Gradients"]:
        """The replacement model run once on ``batch`` copies of the prompt with its sources as leaves; the yielded
        ``Gradients`` gives, for a batch of targets (one per row), every source's gradient."""
        embed = self.embed.expand(batch, -1, -1).clone().requires_grad_(True)
        outs = [w.expand(batch, -1, -1).clone().requires_grad_(True) for w in self.mlp_outputs()]

        def mlp_out(layer: int, x: Tensor) -> Tensor:
            skip = self.layers[layer].skip_term(x)
            return outs[layer] if skip is None else outs[layer] + (skip - skip.detach())

        with torch.enable_grad(), self._frozen_forward(embed, mlp_out) as inputs:
            normed = self._forward(batch)
            with Gradients(embed, outs, [inputs[o] for o in range(self.n_layers)], normed) as grads:
                yield grads


@dataclass(frozen=True)
class FeatureWrites:
    """One layer's active features and what they write, laid out by position.

    ``writes[p, n, j]`` is what the ``n``-th active feature at position ``p`` writes to MLP output ``layer + j``:
    ``a_f W_dec[f, j]`` (0 past a position's last active feature). ``span`` holds the features' rows in
    ``active_features``; feature ``i`` of the layer sits at ``(pos[i], rank[i])``.
    """

    span: slice
    writes: Tensor  # [pos, n, n_out, d_model]
    pos: Tensor
    rank: Tensor

    @classmethod
    def of(cls, layer: LayerTranscoder, span: slice, pos: Tensor, feature: Tensor, acts: Tensor, n_pos: int):
        counts = torch.bincount(pos, minlength=n_pos)
        starts = counts.cumsum(0) - counts
        rank = torch.arange(len(pos), device=pos.device) - starts[pos]
        decoders = layer.decoders
        writes = decoders.new_zeros(n_pos, int(counts.max()) if len(pos) else 0, *decoders.shape[1:])
        writes[pos, rank] = decoders[feature] * acts[pos, feature, None, None]
        return cls(span, writes, pos, rank)

    def scatter(self, values: Tensor) -> Tensor:
        """``[..., n_features]`` laid out as ``[..., pos, n]`` (0 where no feature is)."""
        out = values.new_zeros(*values.shape[:-1], *self.writes.shape[:2])
        out[..., self.pos, self.rank] = values
        return out

    def gather(self, laid_out: Tensor) -> Tensor:
        """The inverse of ``scatter``: ``[..., pos, n]`` -> ``[..., n_features]``."""
        return laid_out[..., self.pos, self.rank]


class _OneRow:
    """A part's forward on the first row of its input, detached, its output broadcast back over the rows (attached
    with ``attach_forward_hooks``: in the thread that attached it only)."""

    def __init__(self) -> None:
        self.rows = 1

    def before(self, module, args):
        self.rows = args[0].shape[0]
        return (args[0][:1].detach(),) + tuple(args[1:])

    def after(self, module, args, output):
        return output.expand(self.rows, *output.shape[1:])


@dataclass
class Gradients:
    """A retained graph of the replacement model over ``batch`` rows: ``embed`` and ``outs`` (each MLP output) are its
    leaves, ``inputs`` (what each layer's features read) and ``normed`` (the final norm's output) where targets read."""

    embed: Tensor
    outs: list[Tensor]
    inputs: list[Tensor]
    normed: Tensor

    def __enter__(self) -> "Gradients":
        return self

    def __exit__(self, *exc) -> None:
        """Drops the retained graph once the passes are over, even where a caller still holds this object (the name
        a ``with ... as grads`` binds outlives the block): the memory is free for what comes next."""
        self.embed = self.normed = None
        self.outs, self.inputs = [], []

    def of(self, reads: list[tuple[int | None, Tensor, Tensor, Tensor]]) -> tuple[Tensor, list[Tensor]]:
        """Gradients ``(at embed [batch, pos, d_model], at each MLP output)`` of ``sum over targets of x[row, pos] .
        direction``; ``reads`` holds ``(layer or None for the final norm's output, rows, positions, directions)``."""
        total = self.embed.new_zeros(())
        for layer, rows, positions, directions in reads:
            x = self.normed if layer is None else self.inputs[layer]
            total = total + (x[rows, positions] * directions).sum()
        leaves = [self.embed] + self.outs
        grads = torch.autograd.grad(total, leaves, retain_graph=True, allow_unused=True)
        grads = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]
        return grads[0], grads[1:]


__all__ = ["Gradients", "ReplacementModel", "ReplacementRun", "frozen_hook_names"]

"""Each analysis tool's documented identity, checked on one random spec (``spec_generator``): held, refused or failed.

``check(tool, drawn)`` runs ``TOOLS[tool]`` on the model and prompts of ``drawn`` and returns an
``Outcome``:

- ``held``: the tool returned and its identity holds (float64; ``close`` below: 1e-10 relative to
  the size of what is compared, 1e-9 through an attribution graph's sparse solve);
- ``refused``: the tool refused the spec at the call with a ``ValueError``, ``TypeError`` or
  ``KeyError`` that has a message (``reason``: the message with its numbers blanked, so that
  refusals group by why);
- ``n/a``: the identity is not stated for this kind of spec (e.g. EAP equals patching only on a
  norm-free spec made linear);
- ``failed``: any other exception, a refusal without a message, or an identity broken (``reason``
  says which, and by how much).

Only a tool's own call is read for a refusal (``call``): a named error raised by the checking code
itself is a failure, never a refusal.
"""

import copy
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from analysis.attribution_graphs import (
    CLTConfig,
    CrossLayerTranscoder,
    ReplacementModel,
    attribute,
    random_transcoders,
)
from analysis.attribution_graphs.transcoders import mlp_slots
from analysis.discovery import (
    SourceTarget,
    attribution_patching,
    edge_attribution_patching,
    faithfulness_curve,
    logit_diff_per_row,
    patch_sites,
    patch_sites_one_by_one,
    run_circuit,
    sites,
)
from analysis.readouts import attribution
from interp_transformer.models.processing import fold_ln

from .spec_generator import N_POS, RandomSpec, prompts

NAMED_ERRORS = (ValueError, TypeError, KeyError)
RTOL = 1e-10  # float64: what rounding leaves of an exact identity, relative to the size of the values
GRAPH_RTOL = 1e-9  # an attribution graph's edges come from a backward pass per target row, summed in other orders


class Refused(Exception):
    """The tool refused the spec at the call, by name."""


class Broken(Exception):
    """An identity did not hold, or a tool failed in a way that is no refusal."""


class NotApplicable(Exception):
    """The identity is not stated for this kind of spec."""


class Outcome(NamedTuple):
    status: str  # "held", "refused", "n/a" or "failed"
    reason: str = ""


def reason_of(error: BaseException) -> str:
    """The refusal's message with its numbers and bracketed lists blanked, so refusals group by why; one line."""
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    message = str(message).splitlines()[0] if str(message) else ""
    message = re.sub(r"\[[^\]]*\]", "[...]", message)  # lists (of hook names, of suggestions) vary by spec
    message = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", message)
    return f"{type(error).__name__}: {message[:110]}"


def call(function: Callable, *args, **kwargs):
    """``function(*args, **kwargs)``; a named error with a message becomes ``Refused``, anything else escapes."""
    try:
        return function(*args, **kwargs)
    except NAMED_ERRORS as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        if not str(message).strip():
            raise Broken(f"{function.__name__} raised {type(error).__name__} with no message") from error
        raise Refused(reason_of(error)) from error


def close(actual, expected, what: str, rtol: float = RTOL) -> None:
    """``|actual - expected| <= rtol * max(1, max |expected|)`` everywhere, or ``Broken`` saying by how much."""
    actual, expected = torch.as_tensor(actual).detach().double(), torch.as_tensor(expected).detach().double()
    if actual.shape != expected.shape:
        raise Broken(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    error = float((actual - expected).abs().max()) if expected.numel() else 0.0
    if not error <= rtol * scale:  # NaN fails too
        raise Broken(f"{what}: off by {error:.3g} (tolerance {rtol * scale:.3g})")


def responsive(case: "Case") -> None:
    """``NotApplicable`` where the metric does not tell the clean prompts from the corrupted ones (a soft-cap or an
    activation saturated): every effect is then zero and no identity of effects can be told from a vacuous one."""
    if not float((case.metric_of(case.clean) - case.metric_of(case.corrupted)).abs().max()) > 1e-6:
        raise NotApplicable("the metric is the same on the clean and the corrupted prompts: every effect is zero")


def nonzero(values, what: str, above: float = 1e-6) -> None:
    """The identity is not vacuous: some value it compared is away from zero (``responsive`` checked first)."""
    if not float(torch.as_tensor(values).detach().abs().max()) > above:
        raise Broken(f"{what}: every value is within {above:g} of zero, so the check would pass on anything")


@dataclass
class Case:
    """One spec's model, its clean/corrupted prompts and the metric every tool scores by."""

    drawn: RandomSpec
    model: torch.nn.Module
    clean: object  # tokens [batch, pos], or a SourceTarget
    corrupted: object
    metric: Callable

    @property
    def seq2seq(self) -> bool:
        return self.drawn.kind == "encoder_decoder"

    def args(self, inputs) -> tuple:
        """The model's positional inputs: the tokens, or an encoder-decoder's source and target."""
        return tuple(inputs) if self.seq2seq else (inputs,)

    def logits(self, inputs, hooks=()) -> torch.Tensor:
        with torch.no_grad():
            return self.model.run_with_hooks(*self.args(inputs), fwd_hooks=list(hooks))

    def final_residual(self) -> str:
        """The hook of the last residual stream the read-out reads (an encoder-decoder's: the decoder's)."""
        if self.seq2seq:
            return f"decoder.blocks.{self.model.cfg.n_decoder_layers - 1}.hook_resid_post"
        return self.model.hook_names.final_residual_name(self.model.cfg.n_layers)

    def metric_of(self, inputs, hooks=()) -> torch.Tensor:
        return self.metric(self.logits(inputs, hooks), torch.arange(2)).double()

    def prefix(self, stack: str) -> str:
        """The hook prefix of a stack: ``encoder.``/``decoder.`` in an encoder-decoder, nothing otherwise."""
        return f"{stack}." if self.seq2seq else ""


def make_case(drawn: RandomSpec, model=None) -> Case:
    model = drawn.build() if model is None else model
    p = prompts(drawn, model)
    answer, wrong = p["answers"]
    if drawn.kind == "encoder_decoder":  # the metric reads the target's last position
        metric = logit_diff_per_row(answer, wrong, torch.tensor([3, 3]))
        return Case(drawn, model, SourceTarget(*p["clean"]), SourceTarget(*p["corrupted"]), metric)
    return Case(drawn, model, p["clean"], p["corrupted"], logit_diff_per_row(answer, wrong))


# --- read-outs ------------------------------------------------------------------------------------------------------
def check_decompose_resid(case: Case) -> None:
    """The decomposed residual stream (embeddings, every writer's output) sums to the final stream."""
    _, cache = case.model.run_with_cache(*case.args(case.clean))
    parts = call(cache.decompose_resid)
    close(parts.sum(dim=0), cache[case.final_residual()], "decompose_resid summed vs the final residual stream")


def check_direct_logit_attribution(case: Case) -> None:
    """The terms sum to the logit difference at the last position (the uncapped one where the logits are capped)."""
    logits, cache = case.model.run_with_cache(*case.args(case.clean))
    answer, wrong = prompts(case.drawn, case.model)["answers"]
    attr = call(attribution.direct_logit_attribution, cache, answer, incorrect_tokens=wrong, pos=-1)
    if attr.logit_softcap is not None:
        logits = cache["unembed.hook_logits_uncapped"]
    rows = torch.arange(2)
    expected = logits[rows, -1, answer] - logits[rows, -1, wrong]
    close(attr.total(), expected, "direct_logit_attribution total() vs the logit difference")
    nonzero(attr.heads, "direct_logit_attribution heads")


def check_logit_lens(case: Case) -> None:
    """The lens at the final residual stream is the model's logits."""
    logits, cache = case.model.run_with_cache(*case.args(case.clean))
    lens = call(attribution.logit_lens, cache)
    close(lens[-1], logits, "logit_lens at the last layer vs the logits")


# --- patching -------------------------------------------------------------------------------------------------------
def _patch_sites(case: Case) -> list:
    """The stream entering each block and the heads at corrupted positions (the last one too: a window of one key
    or no MLP still carries its token to the metric), each MLP's output, and two neurons of block 0."""
    model = case.model
    last = N_POS - 1
    chosen = call(sites, model, "resid_pre", positions=[1, 3, last])
    if any(block.writer("attn") is not None for block in model.blocks):
        chosen += call(sites, model, "heads", positions=[3, last])
    if "blocks.0.hook_mlp_out" in model.hook_dict:
        chosen += call(sites, model, "mlp_out")
        writer = model.blocks[0].writer("mlp")
        if writer is not None and writer.units is not None and writer.units.kind == "neuron":
            chosen += call(sites, model, "neurons", layers=[0], units=[0, 2], positions=[1])
    return chosen


def check_patch_sites(case: Case) -> None:
    """Many sites patched in one batched forward equal patching one site at a time."""
    responsive(case)
    if case.seq2seq:
        call(patch_sites, case.model, case.clean, case.corrupted, case.metric, [], progress=False)
        raise Broken("patch_sites took an encoder-decoder's (source, target) pairs with no site list to check")
    chosen = _patch_sites(case)
    batched = call(patch_sites, case.model, case.clean, case.corrupted, case.metric, chosen, progress=False)
    one_by_one = call(
        patch_sites_one_by_one, case.model, case.clean, case.corrupted, case.metric, chosen, progress=False
    )
    close(batched, one_by_one, "patch_sites vs patch_sites_one_by_one")
    nonzero(batched - case.metric_of(case.corrupted), "patching effects")


# --- discovery ------------------------------------------------------------------------------------------------------
def autograd_atp(case: Case, hooks: list[str]) -> dict[str, torch.Tensor]:
    """``(clean - corrupt) * d metric / d act`` at each hook, at the corrupted run: a forward and backward of our own
    (no tool involved), ``[batch, ...]`` per hook."""
    _, clean = case.model.run_with_cache(*case.args(case.clean), names_filter=hooks)
    kept = {}

    def keep(activation, hook):
        kept[hook.name] = activation

    with torch.enable_grad():
        logits = case.model.run_with_hooks(*case.args(case.corrupted), fwd_hooks=[(hook, keep) for hook in hooks])
        values = case.metric(logits, torch.arange(2)).sum()
        grads = torch.autograd.grad(values, [kept[hook] for hook in hooks], allow_unused=True)
    return {
        hook: (clean[hook] - kept[hook].detach()) * (grad if grad is not None else torch.zeros_like(kept[hook]))
        for hook, grad in zip(hooks, grads)
    }


def _site_sum(values: torch.Tensor, site) -> torch.Tensor:
    where = (slice(None), slice(None) if site.pos is None else site.pos) + tuple(site.index)
    selected = values[where]
    return selected.reshape(selected.shape[0], -1).sum(dim=-1)


def check_attribution_patching(case: Case) -> None:
    """AtP at every site equals ``(clean - corrupt) . d metric / d act`` from autograd at the corrupted run."""
    responsive(case)
    if case.seq2seq:
        call(attribution_patching, case.model, case.clean, case.corrupted, case.metric, [])
        raise Broken("attribution_patching took an encoder-decoder's (source, target) pairs")
    chosen = _patch_sites(case)
    atp = call(attribution_patching, case.model, case.clean, case.corrupted, case.metric, chosen)
    products = autograd_atp(case, list(dict.fromkeys(site.hook for site in chosen)))
    expected = torch.stack([_site_sum(products[site.hook], site) for site in chosen])
    close(atp, expected, "attribution_patching vs the autograd product")
    nonzero(atp, "attribution_patching")


def node_site(case: Case, name: str) -> tuple[str, int | None]:
    """The hook a node of the edge graph writes from, and its head (None: the whole activation)."""
    stack = "encoder" if name.startswith("enc.") else "decoder"
    bare, pre = name.removeprefix("enc."), case.prefix(stack)
    if bare == "input":
        return f"{pre}blocks.0.hook_resid_pre", None
    if match := re.fullmatch(r"MLP(\d+)(\.E\d+)?", bare):  # a mixture's experts sum to its output together
        return f"{pre}blocks.{match.group(1)}.hook_mlp_out", None
    if match := re.fullmatch(r"L(\d+)\.(attn|cross_attn)", bare):  # a sublayer behind an output norm is one node
        return f"{pre}blocks.{match.group(1)}.hook_{'attn' if match.group(2) == 'attn' else 'cross_attn'}_out", None
    if match := re.fullmatch(r"L(\d+)([HC])(\d+)", bare):
        layer, letter, head = match.groups()
        return f"{pre}blocks.{layer}.{'attn' if letter == 'H' else 'cross_attn'}.hook_z", int(head)
    raise Broken(f"edge_attribution_patching named a node {name!r} this check does not know")


def _edges(case: Case, **options):
    return call(edge_attribution_patching, case.model, case.clean, case.corrupted, case.metric, **options)


def check_eap_node_sums(case: Case) -> None:
    """Each node's edges sum to its AtP (a mixture's experts together); on an additive stream the logits' edges sum
    to the final residual stream's AtP."""
    responsive(case)
    edges = _edges(case)
    located = [node_site(case, name) for name in edges.upstream]
    hooks = list(dict.fromkeys(hook for hook, _ in located))
    final = case.final_residual() if case.model.capabilities.additive_residual else None
    if final is not None:
        hooks.append(final)
    products = autograd_atp(case, hooks)
    sums: dict[tuple, torch.Tensor] = {}
    for row, site in enumerate(located):
        sums[site] = sums.get(site, 0) + edges.scores[row].sum(dim=0)
    for (hook, head), total in sums.items():
        values = products[hook] if head is None else products[hook][:, :, head]
        close(total, values.flatten(1).sum(dim=1), f"the edges out of {hook}{'' if head is None else f'[{head}]'}")
    if final is not None:
        logits = edges.scores[:, edges.readers.index("logits")].sum(dim=0)
        close(logits, products[final].flatten(1).sum(dim=1), "the logits' edges vs the final stream's AtP")
    nonzero(edges.scores, "edge scores")


def check_run_circuit(case: Case) -> None:
    """Every edge kept gives the clean metric, none the corrupted one; so do the faithfulness curve's endpoints."""
    responsive(case)
    edges = _edges(case)
    options = {}
    clean, corrupted = case.metric_of(case.clean), case.metric_of(case.corrupted)
    every = call(run_circuit, case.model, case.clean, case.corrupted, case.metric, edges.edge.clone(), **options)
    none = call(run_circuit, case.model, case.clean, case.corrupted, case.metric, torch.zeros_like(edges.edge))
    close(every, clean, "run_circuit with every edge vs the clean metric")
    close(none, corrupted, "run_circuit with no edge vs the corrupted metric")
    n_edges = int(edges.edge.sum())
    curve = call(faithfulness_curve, case.model, case.clean, case.corrupted, case.metric, edges, [0, n_edges])
    close(curve.metric, torch.stack([corrupted, clean]), "faithfulness_curve at 0 and every edge")
    nonzero(clean - corrupted, "clean minus corrupted metric")


def linearized(model):
    """``model`` (a norm-free decoder) with nothing nonlinear left: ``W_Q = W_K = 0`` (every query attends to its keys
    with weights that do not depend on the input), MLP activations the identity (a gated MLP's gate 1), routers that
    read nothing (fixed routing)."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.stored("W_K").zero_()
            mlp = getattr(block, "mlp", None)
            experts = list(getattr(mlp, "experts", [])) if mlp is not None else []
            if experts:
                mlp.W_router.zero_()
            for part in experts or ([mlp] if mlp is not None else []):
                part.act_fn = torch.ones_like if hasattr(part, "W_gate") else (lambda x: x)
    model.setup()
    return model.eval()


def linear_case(case: Case) -> Case:
    spec = case.drawn.fields
    if case.drawn.kind != "decoder" or spec.get("norm") != "none":
        raise NotApplicable("EAP equals patching only where nothing is nonlinear: norm-free decoders")
    if spec.get("final_softcap") is not None:
        raise NotApplicable("soft-capped logits are not linear")
    return make_case(case.drawn, linearized(case.drawn.build()))


def check_eap_is_patching(case: Case) -> None:
    """On a norm-free spec made linear: a sample of edges each equal patching that edge alone (``run_circuit`` with
    the prompts swapped), EAP-IG on inputs and on activations equals EAP, the logits' edges sum to the total effect."""
    case = linear_case(case)
    responsive(case)
    edges = _edges(case)
    corrupt = case.metric_of(case.corrupted)
    chosen = edges.edge.nonzero().tolist()
    for i, j in chosen[:: max(1, len(chosen) // 12)]:
        alone = edges.edge.clone()
        alone[i, j] = False
        patched = call(run_circuit, case.model, case.corrupted, case.clean, case.metric, alone)
        close(edges.scores[i, j], patched - corrupt, f"edge {edges.upstream[i]} -> {edges.readers[j]} vs patching it")
    total = case.metric_of(case.clean) - corrupt
    for ig_on in ("inputs", "activations"):
        ig = _edges(case, method="EAP-IG", steps=3, ig_on=ig_on)
        close(ig.scores, edges.scores, f"EAP-IG ({ig_on}) vs EAP")
        close(ig.scores[:, ig.readers.index("logits")].sum(dim=0), total, f"EAP-IG ({ig_on}) logits' edges vs total")
    nonzero(total, "the total effect")


# --- attribution graphs ---------------------------------------------------------------------------------------------
D_TRANSCODER = 12


def _transcoders(case: Case, kind: str) -> tuple:
    """The model and random transcoders of ``kind`` reading the stream where each MLP reads it (``mlp_slots``): one
    per layer, or one cross-layer transcoder. Where that stream is a post-norm block's normalized one, the model's
    norms are folded first, as ``attribute`` asks of transcoders reading a norm's output."""
    model = case.model
    slots = call(mlp_slots, model)
    if case.drawn.kind == "decoder" and any("hook_normalized" in slot.inputs[-1] for slot in slots):
        model = call(fold_ln, copy.deepcopy(model))
    if kind == "per_layer":
        return model, call(random_transcoders, model, D_TRANSCODER, reads="stream", seed=case.drawn.seed)
    input_hook = slots[0].inputs[-1].removeprefix("blocks.0.")
    cfg = call(CLTConfig, model.cfg.n_layers, D_TRANSCODER, model.cfg.d_model, input_hook=input_hook)
    return model, call(CrossLayerTranscoder.random, cfg, seed=case.drawn.seed, dtype=model.W_E.dtype)


def _graph_prompt(case: Case) -> torch.Tensor:
    """One prompt: the clean pair's first (an encoder-decoder's first source, which a graph tool must refuse)."""
    return case.clean.source[0] if case.seq2seq else case.clean[0]


def check_replacement_model(case: Case, kind: str) -> None:
    """With error nodes, the replacement model (per-layer transcoders, or a cross-layer one) gives the logits."""
    prompt = _graph_prompt(case)
    with torch.no_grad():
        expected = case.model(prompt)[0]
    model, tc = _transcoders(case, kind)
    replacement = call(ReplacementModel, model, tc, prompt)
    logits = call(replacement.run, all_positions=True).logits[0]
    close(logits, expected, f"the replacement model's logits ({kind} transcoders) vs the model's", GRAPH_RTOL)
    nonzero(replacement.errors, f"error nodes ({kind})")


def check_graph_edges(case: Case, kind: str) -> None:
    """Every node's edges plus its bias sum to its value, and the strongest edges into the top logit and into two
    features each equal removing the source in the frozen replacement model."""
    prompt = _graph_prompt(case)
    model, tc = _transcoders(case, kind)
    graph = call(attribute, model, tc, prompt, batch_size=64)
    replacement = call(ReplacementModel, model, tc, prompt)
    edges = graph.adjacency_matrix
    targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logits.start, graph.n_nodes)])
    close(edges[targets].sum(1) + graph.bias[targets], graph.values[targets], f"node sums ({kind})", GRAPH_RTOL)
    chosen = [graph.logits.start]
    if graph.n_features:
        chosen += edges[graph.features].abs().amax(1).topk(min(2, graph.n_features)).indices.tolist()
    for target in chosen:
        row = edges[target, : graph.logits.start]
        sources = row.abs().topk(min(6, len(row))).indices.tolist()
        effects = call(replacement.intervention_effects, graph, [target], sources)[0]
        close(effects, row[sources], f"edges into {graph.label(target)} vs removing their sources ({kind})", GRAPH_RTOL)
    nonzero(edges[graph.logits.start, : graph.logits.start], f"edges into the top logit ({kind})")


TOOLS: dict[str, Callable[[Case], None]] = {
    "decompose_resid": check_decompose_resid,
    "direct_logit_attribution": check_direct_logit_attribution,
    "logit_lens": check_logit_lens,
    "patch_sites": check_patch_sites,
    "attribution_patching": check_attribution_patching,
    "eap_node_sums": check_eap_node_sums,
    "eap_is_patching": check_eap_is_patching,
    "run_circuit": check_run_circuit,
    "replacement_model": lambda case: check_replacement_model(case, "per_layer"),
    "replacement_model_clt": lambda case: check_replacement_model(case, "cross_layer"),
    "graph_edges": lambda case: check_graph_edges(case, "per_layer"),
    "graph_edges_clt": lambda case: check_graph_edges(case, "cross_layer"),
}


def check(tool: str, drawn: RandomSpec, case: Case | None = None) -> Outcome:
    """Run ``TOOLS[tool]`` on ``drawn`` (or its ``case``, built once for several tools) and say what came of it."""
    torch.manual_seed(0)
    try:
        TOOLS[tool](case if case is not None else make_case(drawn))
    except Refused as refusal:
        return Outcome("refused", str(refusal))
    except NotApplicable as why:
        return Outcome("n/a", str(why))
    except Broken as broken:
        return Outcome("failed", str(broken))
    except Exception as error:  # anything else a tool raises is a crash: reported with where it came from
        frames = traceback.extract_tb(error.__traceback__)
        where = next((f for f in reversed(frames) if "site-packages" not in f.filename), frames[-1])
        return Outcome("failed", f"{type(error).__name__}: {str(error)[:200]} ({where.filename}:{where.lineno})")
    return Outcome("held")


__all__ = ["TOOLS", "Case", "Outcome", "check", "make_case"]

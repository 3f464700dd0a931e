"""Helpers of the attribution-graph tests: small models and transcoders, interventions, a hand-built graph, and
the memory measurement (in a forked process)."""

import ctypes
import re
from pathlib import Path

import torch

from analysis.attribution_graphs import (
    CLTConfig,
    CrossLayerTranscoder,
    ReplacementModel,
    attribute,
    attribute_prompts,
    plan_memory,
    plan_prompts,
    random_transcoders,
)
from analysis.attribution_graphs.graph import AttributionGraph
from interp_transformer import TransformerConfig
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.models.processing import fold_ln

from .perturbed import SMALL_SHAPE as SHAPE
from .perturbed import perturbed_decoder

PROMPT = torch.tensor([1, 5, 9, 2, 7, 3])
CONFIGS = {
    "llama_gqa": lambda: LlamaConfig(**SHAPE, n_key_value_heads=2),
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "gemma2_output_norms": lambda: GemmaConfig(**SHAPE, n_key_value_heads=2, sliding_window=3),
}


def folded(name: str, dtype: torch.dtype = torch.float32):
    """A perturbed model with its norms folded (``fold_ln``): what transcoders reading ``hook_normalized`` expect."""
    return fold_ln(perturbed_decoder(CONFIGS[name](), dtype=dtype))


def transcoders(model, kind: str):
    """Random transcoders of one kind: per-layer SAEs, or a cross-layer transcoder reading each MLP's input."""
    if kind == "jumprelu":
        return random_transcoders(model, 20, threshold=0.05)
    if kind == "topk":
        return random_transcoders(model, 20, architecture="topk", k=5)
    if kind == "skip":
        return random_transcoders(model, 20, architecture="skip_transcoder", reads="stream")
    n_layers, d_model = model.cfg.n_layers, model.cfg.d_model
    activation, k = ("topk", 4) if kind == "clt_topk" else ("jumprelu", None)
    cfg = CLTConfig(n_layers, 20, d_model, activation=activation, k=k, input_hook="ln2.hook_normalized")
    return CrossLayerTranscoder.random(cfg, dtype=model.W_E.dtype)


def intervention_effects(replacement: ReplacementModel, graph: AttributionGraph) -> torch.Tensor:
    """``[target, source]``: how much each target drops when one source is removed, the rest held (one forward row per
    source, in the replacement model); zero where the target is a source."""
    n_sources = graph.logits.start
    targets = [*range(graph.n_features), *range(n_sources, graph.n_nodes)]
    effects = torch.zeros(graph.n_nodes, n_sources, dtype=graph.adjacency_matrix.dtype)
    effects[targets] = replacement.intervention_effects(graph, targets, range(n_sources)).to(effects)
    return effects


def hand_graph(error_weight: float) -> AttributionGraph:
    """One layer, one position: feature <- token (2); logit <- feature (3), error (``error_weight``), token (-1)."""
    adjacency = torch.zeros(4, 4, dtype=torch.float64)  # feature, error, token, logit
    adjacency[0, 2] = 2.0
    adjacency[3, 0], adjacency[3, 1], adjacency[3, 2] = 3.0, error_weight, -1.0
    one = torch.ones(1, dtype=torch.float64)
    return AttributionGraph(
        tokens=torch.tensor([4]),
        active_features=torch.tensor([[0, 0, 7]]),
        activation_values=one,
        logit_tokens=torch.tensor([2]),
        logit_probabilities=one,
        logit_values=one,
        adjacency_matrix=adjacency,
        bias=torch.zeros(4, dtype=torch.float64),
        n_layers=1,
    )


def resident(key: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, in bytes."""
    return int(re.search(key + r":\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def measure_peak(connection, batched: bool = False) -> None:
    """In a process of its own: the planned and the measured peak of one attribution graph, or of three prompts'
    graphs sharing their passes (``batched``), sent back as a dict."""
    try:
        # every allocation of 64 KiB or more gets a mapping of its own, returned when freed (glibc's M_MMAP_THRESHOLD):
        # resident memory then follows torch's allocations
        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)
        cfg = LlamaConfig(
            **dict(SHAPE, d_model=64, n_layers=4, d_head=16, d_mlp=128, d_vocab=1000, n_ctx=128), n_key_value_heads=2
        )
        model = fold_ln(perturbed_decoder(cfg, torch.float32))
        tc = random_transcoders(model, 256, architecture="topk", k=8)
        tokens = torch.arange(64)
        attribute(model, tc, tokens[:8], batch_size=4)  # every kernel's first call before measuring
        if batched:
            prompts = [tokens, tokens[:40], tokens[20:36]]
            attribute_prompts(model, tc, [tokens[:8], tokens[:3]], batch_size=4, max_padding=float("inf"))
            (plan,) = plan_prompts(model, tc, prompts, batch_size=256, max_padding=float("inf"))
        else:
            n_features = ReplacementModel(model, tc, tokens).n_features
            plan = plan_memory(model, tc, n_pos=64, n_features=n_features, batch_size=256, n_logits=10)
        base = resident("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
        if batched:
            attribute_prompts(model, tc, prompts, batch_size=256, max_padding=float("inf"))
        else:
            attribute(model, tc, tokens, batch_size=256)
        connection.send({"planned": plan.peak, "measured": resident("VmHWM") - base})
    except BaseException as error:  # the parent reports it
        connection.send({"error": repr(error)})


def check_real_model_graph(model, prompt: str, n_targets: int = 3, n_edges: int = 8) -> None:
    """A real model (norms folded) with random TopK transcoders: its replacement model gives its logits, every node
    sums, and the strongest edges into the top logit and into the features of most input each equal an
    intervention (circuit-tracer's tolerances: 1e-5 on logits, 1e-3 on features; relative as well as absolute)."""
    tc = random_transcoders(model, 256, architecture="topk", k=4)
    tokens = model.to_tokens(prompt)[0]
    graph = attribute(model, tc, tokens, batch_size=64)
    replacement = ReplacementModel(model, tc, tokens)
    with torch.no_grad():
        expected = model(tokens)[0]
    torch.testing.assert_close(replacement.run(all_positions=True).logits[0], expected, rtol=0, atol=1e-4)
    edges = graph.adjacency_matrix
    targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logits.start, graph.n_nodes)])
    torch.testing.assert_close(edges[targets].sum(1) + graph.bias[targets], graph.values[targets], rtol=0, atol=1e-4)
    features = edges[graph.features].abs().amax(1).topk(n_targets).indices.tolist()
    for target, atol, rtol in [(graph.logits.start, 1e-5, 1e-5)] + [(feature, 1e-3, 0) for feature in features]:
        row = edges[target, : graph.logits.start]
        sources = row.abs().topk(n_edges).indices.tolist()
        assert row[sources].abs().max() > 0.1, f"the edges into {graph.label(target)} are too weak to check"
        effects = replacement.intervention_effects(graph, [target], sources)[0]
        # float32 rounding grows with the value: a logit edge of 1.5 differs from its intervention by about 1e-5
        # (6e-6 relative) with some CPUs' kernels, so the logits' bound is relative too
        torch.testing.assert_close(effects, row[sources], rtol=rtol, atol=atol)

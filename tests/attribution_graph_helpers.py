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
from interp_transformer.architectures.gemma import GemmaConfig
from interp_transformer.architectures.llama import LlamaConfig
from interp_transformer.models.processing import fold_ln

from .perturbed import SMALL_SHAPE as SHAPE, perturbed_decoder

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
    source, in the replacement model)."""
    n_sources, dtype = graph.logits.start, graph.adjacency_matrix.dtype
    full, removed = replacement.run(), replacement.run_without(graph, [[source] for source in range(n_sources)])

    def demeaned(logits):
        return logits[:, graph.logit_tokens] - logits.mean(dim=-1, keepdim=True)

    effects = torch.zeros(graph.n_nodes, n_sources, dtype=dtype)
    effects[graph.features] = (full.features - removed.features).T
    effects[graph.logits] = (demeaned(full.uncapped) - demeaned(removed.uncapped)).T
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

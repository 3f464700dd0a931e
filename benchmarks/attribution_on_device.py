"""The attribution engine on an accelerator: the CPU's graphs, shared passes equal to one prompt at a time, and the
planned peak beside the device's measured one, on SmolLM2-135M's shape with random weights (no download).

    python benchmarks/attribution_on_device.py --device cuda
    python benchmarks/attribution_on_device.py --device cpu --n-pos 64 --n-prompts 2     # the same steps here
    python benchmarks/attribution_on_device.py --long-only --n-pos 1024 2304 --batch-size 64

1. Small float64 decoders (Llama with grouped keys, Gemma 3 with qk norms and windows, a mixture of experts) and
   three transcoder kinds: the graph on the device against the graph on the CPU, each edge of the device's graph
   against an intervention on the device, every node's sum, and shared passes against one prompt at a time.
2. A Llama of SmolLM2-135M's shape, random weights, float32, with random TopK transcoders (4,096 features per
   layer, k=4): an ``--n-pos``-token graph of its ``--max-feature-nodes`` features of most influence, timed, its
   planned peak (``plan_memory``) beside the device's peak of allocated memory above the loaded weights. The
   target batch shrinks as the prompt grows: ``--batch-size`` at 1,024 tokens.
3. The same model, ``--n-prompts`` prompts of 8 to 16 tokens: ``attribute_prompts`` against ``attribute``, timed.
"""

import argparse
import time

import torch

from analysis.attribution_graphs import (
    ReplacementModel,
    attribute,
    attribute_prompts,
    plan_memory,
    random_transcoders,
)
from interp_transformer import DemoTransformer
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.models.processing import fold_ln
from tests.attribution_graph_helpers import PROMPT, intervention_effects, transcoders
from tests.perturbed import SMALL_SHAPE as SHAPE
from tests.perturbed import perturbed_decoder

SMALL = {
    "llama_gqa": lambda: LlamaConfig(**SHAPE, n_key_value_heads=2),
    "gemma3_qk_norms_windows": lambda: GemmaConfig(
        **SHAPE, n_key_value_heads=2, post_norms=True, qk_norm=True, query_pre_attn_scalar=7.0, sliding_window=3
    ),
    "moe_experts": lambda: MoEConfig(**dict(SHAPE, d_mlp=8, n_key_value_heads=2), n_experts=4, experts_per_token=2),
}
PROMPTS = [PROMPT, torch.tensor([4, 2]), torch.tensor([3, 3, 8, 1, 0, 6, 2, 5, 7, 1])]


def moved(transcoders_, device):
    return [sae.to(device) for sae in transcoders_] if isinstance(transcoders_, list) else transcoders_.to(device)


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu() - b.cpu()).abs().max())


def exactness(device: torch.device) -> None:
    """Section 1 of the module docstring."""
    for name, cfg in SMALL.items():
        for kind in ("jumprelu", "skip", "clt_topk"):
            model = perturbed_decoder(cfg())
            model = fold_ln(model) if name == "llama_gqa" else model
            tc = transcoders(model, kind) if name == "llama_gqa" else random_transcoders(model, 20, reads="stream")
            on_cpu = attribute(model, tc, PROMPT, batch_size=16)
            model, tc = model.to(device), moved(tc, device)
            graph = attribute(model, tc, PROMPT.to(device), batch_size=16)
            effects = intervention_effects(ReplacementModel(model, tc, PROMPT.to(device)), graph)
            edges = graph.adjacency_matrix[:, : graph.logits.start]
            targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logits.start, graph.n_nodes)])
            sums = graph.adjacency_matrix[targets].sum(1) + graph.bias[targets]
            shared = attribute_prompts(model, tc, [p.to(device) for p in PROMPTS], batch_size=9)
            alone = [attribute(model, tc, p.to(device), batch_size=9) for p in PROMPTS]
            versus_cpu = gap(graph.adjacency_matrix, on_cpu.adjacency_matrix)
            versus_alone = max(gap(s.adjacency_matrix, a.adjacency_matrix) for s, a in zip(shared, alone))
            print(
                f"{name:24s} {kind:9s} {graph.n_nodes:4d} nodes | device - cpu {versus_cpu:.1e}"
                f" | edge - intervention {gap(edges, effects):.1e} | sums {gap(sums, graph.values[targets]):.1e}"
                f" | shared - alone {versus_alone:.1e}"
            )
            if name != "llama_gqa":
                break  # one transcoder kind reading the stream is enough for the other blocks


def smollm2_shaped(device: torch.device):
    model = fold_ln(DemoTransformer(LlamaConfig(name="smollm2-135m-shape (random)"), seed=0)).to(device).eval()
    return model, moved(random_transcoders(model, 4096, architecture="topk", k=4), device)


def long_graph(model, tc, device, n_pos: int, max_feature_nodes: int, batch_size: int) -> None:
    """Section 2 of the module docstring."""
    tokens = torch.randint(1, model.cfg.d_vocab, (n_pos,), generator=torch.Generator().manual_seed(0)).to(device)
    n_features = ReplacementModel(model, tc, tokens).n_features
    batch_size = min(batch_size, min(max_feature_nodes, n_features) + 10)  # as attribute does (10 logits at most)
    plan = plan_memory(
        model, tc, n_pos=n_pos, n_features=n_features, batch_size=batch_size, max_feature_nodes=max_feature_nodes
    )
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    graph = attribute(model, tc, tokens, batch_size=batch_size, max_feature_nodes=max_feature_nodes)
    synchronize(device)
    seconds = time.perf_counter() - start
    targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logits.start, graph.n_nodes)])
    sums = graph.adjacency_matrix[targets].sum(1) + graph.bias[targets] + graph.unselected_effect[targets]
    print(f"{n_pos}-token graph: {graph.n_features} of {n_features} features kept, {seconds:.1f} s")
    print(f"  sums: {gap(sums, graph.values[targets]):.1e}; planned {plan}")
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
        print(
            f"  measured peak of allocated device memory: {peak / 2**30:.2f} GiB; "
            f"plan / measured {plan.peak / peak:.3f}"
        )


def shared_passes(model, tc, device, n_prompts: int, batch_size: int) -> None:
    """Section 3 of the module docstring."""
    generator = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(1, model.cfg.d_vocab, (8 + i % 9,), generator=generator).to(device) for i in range(n_prompts)
    ]
    timings = {}
    for how in ("shared", "alone"):
        synchronize(device)
        start = time.perf_counter()
        if how == "shared":
            graphs = attribute_prompts(model, tc, prompts, batch_size=batch_size)
        else:
            alone = [attribute(model, tc, p, batch_size=batch_size) for p in prompts]
        synchronize(device)
        timings[how] = time.perf_counter() - start
    n_targets = sum(g.n_features + g.n_logits for g in alone)
    difference = max(gap(s.adjacency_matrix, a.adjacency_matrix) for s, a in zip(graphs, alone))
    print(
        f"{n_prompts} prompts, {n_targets} targets, {batch_size} rows per pass: "
        f"one at a time {timings['alone']:.1f} s, "
        f"shared {timings['shared']:.1f} s ({timings['alone'] / timings['shared']:.2f}x); "
        f"largest difference {difference:.1e}"
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n-pos", type=int, nargs="+", default=[1024], help="one long graph per length")
    parser.add_argument("--max-feature-nodes", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--n-prompts", type=int, default=10)
    parser.add_argument("--long-only", action="store_true", help="only section 2")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}")
    if not args.long_only:
        exactness(device)
    model, tc = smollm2_shaped(device)
    if not args.long_only:
        shared_passes(model, tc, device, args.n_prompts, args.batch_size)
    for n_pos in args.n_pos:
        batch_size = max(args.batch_size * 1024 // n_pos, 1)  # the retained graph grows with the length
        long_graph(model, tc, device, n_pos, args.max_feature_nodes, batch_size)


if __name__ == "__main__":
    main()

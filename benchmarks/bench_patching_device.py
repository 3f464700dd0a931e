"""Batched patching and EAP-IG at SmolLM2-135M's shape on any device (random weights: the time does not depend on them).

    python benchmarks/bench_patching_device.py --device cuda
    python benchmarks/bench_patching_device.py --device cpu --prompts 4 --batched-sample 20 --loop-sample 4 \\
        --timing-prompts 4                                                        # a quick run on the CPU

The prompts are random tokens, ``--prompts`` of ``--positions`` (IOI's size: 20 of 17), the
corrupted ones differing at two positions, and the metric a logit difference at the last one.
Prints:

1. batched patching of every head at every position (``--batched-sample`` sites, 0 for all)
   against one patch per forward (``--loop-sample`` sites): seconds per site each, their ratio,
   and the largest difference on the sites both ran;
2. EAP-IG (``--steps``) over every edge on ``--timing-prompts`` prompts: seconds, and on CUDA the
   peak memory allocated against ``edges.memory_estimate`` (the writes' differences, the readers'
   gradients and one backward pass's activations).
"""

import argparse
import time

import torch

from analysis.discovery import edge_attribution_patching, logit_diff_per_row, patch_sites, patch_sites_one_by_one, sites
from analysis.discovery.edges import memory_estimate
from interp_transformer import DemoTransformer
from interp_transformer.families.llama.recipe import preset


def timed(run, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def pairs(model, n_prompts: int, n_pos: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, model.cfg.d_vocab, (n_prompts, n_pos), generator=generator)
    corrupted = clean.clone()
    corrupted[:, [2, n_pos - 4]] = torch.randint(1, model.cfg.d_vocab, (n_prompts, 2), generator=generator)
    answer, wrong = torch.randint(1, model.cfg.d_vocab, (2, n_prompts), generator=generator)
    device = model.W_E.device
    return clean.to(device), corrupted.to(device), logit_diff_per_row(answer.to(device), wrong.to(device))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--positions", type=int, default=17)
    parser.add_argument("--batched-sample", type=int, default=0)
    parser.add_argument("--loop-sample", type=int, default=200)
    parser.add_argument("--timing-prompts", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--memory-budget", type=float, default=8.0, help="GiB of activations one forward may hold")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {name}")
    model = DemoTransformer(preset("SmolLM2-135M"), device=device, seed=0).eval()
    clean, corrupted, metric = pairs(model, args.prompts, args.positions, seed=0)
    with torch.no_grad():
        model(clean)  # warm-up
    every = sites(model, "heads", positions="each", n_pos=args.positions)
    order = torch.randperm(len(every), generator=torch.Generator().manual_seed(0)).tolist()
    batched_sites = [every[i] for i in (order[: args.batched_sample] if args.batched_sample else order)]
    loop_sites = [every[i] for i in order[: args.loop_sample]]
    budget = int(args.memory_budget * 2**30)
    run = (model, clean, corrupted, metric)
    batched, batched_s = timed(lambda: patch_sites(*run, batched_sites, memory_budget=budget, progress=False), device)
    loop, loop_s = timed(lambda: patch_sites_one_by_one(*run, loop_sites, progress=False), device)
    per_batched, per_loop = batched_s / len(batched_sites), loop_s / len(loop_sites)
    gap = float((batched[: len(loop_sites)] - loop).abs().max())
    print(
        f"patching {len(batched_sites)} of {len(every)} head x position sites, {args.prompts} prompts of "
        f"{args.positions}: batched {batched_s:.1f} s ({per_batched * 1e3:.2f} ms per site); one per forward "
        f"{per_loop * 1e3:.2f} ms per site ({len(loop_sites)} sites): {per_loop / per_batched:.1f}x; "
        f"max difference {gap:.1e}"
    )
    clean, corrupted, metric = pairs(model, args.timing_prompts, args.positions, seed=1)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    edges, eap_s = timed(
        lambda: edge_attribution_patching(model, clean, corrupted, metric, method="EAP-IG", steps=args.steps), device
    )
    estimate = memory_estimate(model, *clean.shape) / 2**30
    peak = (
        f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated" if device.type == "cuda" else ""
    )
    print(
        f"EAP-IG ({args.steps} steps), {args.timing_prompts} prompts of {args.positions}, {int(edges.edge.sum())} "
        f"edges: {eap_s:.1f} s{peak}; estimate (analysis.discovery.edges.memory_estimate) {estimate:.2f} GiB"
    )


if __name__ == "__main__":
    main()

"""Several prompts' attribution graphs on the real SmolLM2-135M: shared, left-padded passes (``attribute_prompts``)
against one prompt at a time (``attribute``), timed in the same run, with the largest difference between the two.

    python benchmarks/bench_attribution_prompts.py --transcoders DIR           # the ten study prompts
    python benchmarks/bench_attribution_prompts.py --n-prompts 4 --batch-size 64 --threads 2

Without ``--transcoders`` each layer gets a random-init TopK transcoder (``--k`` features per position), as in
``bench_attribution_graph.py``. The prompts are those of ``real_model_circuits.py`` (the study of ten prompts),
3 to 9 tokens long with the BOS: short prompts are where shared passes help, since a prompt alone leaves its last
pass part empty and pays a forward of its own.
"""

import argparse
import time
from pathlib import Path

import torch

from analysis.attribution_graphs import attribute, attribute_prompts, load_transcoders, plan_prompts, random_transcoders
from analysis.attribution_graphs.batched import length_groups, rows_per_prompt
from interp_transformer import from_pretrained
from interp_transformer.models.processing import fold_ln
from real_model_circuits import PROMPTS  # noqa: E402 (the study's prompts, beside this script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--batch-size", type=int, default=64, help="rows per backward pass, over all prompts")
    parser.add_argument("--transcoders", type=Path, help="a folder written by interp-transformer train-transcoders")
    parser.add_argument("--k", type=int, default=4, help="random TopK transcoders: features per position and layer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = fold_ln(from_pretrained(args.model))
    if args.transcoders is not None:
        transcoders, what = load_transcoders(args.transcoders), f"trained, from {args.transcoders}"
    else:
        transcoders = random_transcoders(model, 4096, architecture="topk", k=args.k)
        what = f"RANDOM-INIT TopK (k={args.k}, 4096 features per layer): untrained"
    prompts = [prompt for prompt, _ in PROMPTS[: args.n_prompts]]
    print(f"{args.model}, {len(prompts)} prompts, {args.threads} thread(s), {args.batch_size} rows per pass")
    print(f"transcoders: {what}")
    plans = plan_prompts(model, transcoders, prompts, batch_size=args.batch_size)
    for plan in plans:
        print(f"planned peak of the shared passes: {plan}")

    start, cpu = time.perf_counter(), time.process_time()
    shared = attribute_prompts(model, transcoders, prompts, batch_size=args.batch_size, progress=True)
    shared_s, shared_cpu = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    alone = [attribute(model, transcoders, prompt, batch_size=args.batch_size) for prompt in prompts]
    alone_s, alone_cpu = time.perf_counter() - start, time.process_time() - cpu

    n_targets = sum(g.n_features + g.n_logits for g in alone)
    passes_alone = sum(-(-(g.n_features + g.n_logits) // args.batch_size) for g in alone)
    gap = max(float((a.adjacency_matrix - b.adjacency_matrix).abs().max()) for a, b in zip(shared, alone))
    scale = max(float(g.adjacency_matrix.abs().max()) for g in alone)
    print(f"{n_targets} targets ({', '.join(str(g.n_features + g.n_logits) for g in alone)} per prompt)")
    print(f"one at a time: {passes_alone} passes, {alone_s:.1f} s ({alone_cpu:.1f} s of CPU time)")
    counts = [g.n_features + g.n_logits for g in alone]
    groups = [[counts[k] for k in group] for group in length_groups([g.n_pos for g in alone], args.batch_size)]
    passes = sum(max(-(-c // r) for c, r in zip(g, rows_per_prompt(g, args.batch_size))) for g in groups)
    print(
        f"shared passes: {passes} passes, {shared_s:.1f} s ({shared_cpu:.1f} s of CPU time): {alone_s / shared_s:.2f}x"
    )
    print(f"largest edge difference: {gap:.2e} (largest edge {scale:.2f}; float32 rounding)")


if __name__ == "__main__":
    main()

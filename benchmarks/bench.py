"""Speed and memory of interp_transformer against Hugging Face and TransformerLens, in one run.

    python benchmarks/bench.py                 # full run, GPT-2 small shape (about 15 minutes)
    python benchmarks/bench.py --quick         # fewer rounds, one forward shape (about 3 minutes)
    python benchmarks/bench.py --update-docs   # also write the table into docs/performance.md

Everything runs on random weights at the GPT-2 small shape, float32, ``--threads``
threads (default 2), under ``torch.inference_mode()``. Each measurement is
interleaved A/B: every round runs each contender once, in a rotating order, so a
busy machine slows all of them alike; the table reports medians over rounds and
ratios taken within the same run. TransformerLens 4.x runs in its own venv
(``benchmarks/tl_env.sh``) as a subprocess (``benchmarks/tl_worker.py --serve``),
built from the same seed; its weights' sha256 is checked against ours.

Sections: forward logits; ``run_with_cache`` (everything / attention patterns /
``resid_post``) with the bytes each cache holds; greedy generation (64 new tokens
after a 16-token prompt) with and without the key/value cache against HF
``generate``; ``from_pretrained`` from an in-memory HF model and from a
safetensors directory (time and peak RSS, each in a fresh process); achieved
GFLOP/s of the forward against a plain large matmul.
"""

import argparse
import collections
import contextlib
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import tqdm as tqdm_module
from tqdm import tqdm

# tqdm's monitor thread wakes while a measurement runs and was seen to stretch a 2 ms
# forward to 80 ms; the bars refresh between rounds without it
tqdm_module.tqdm.monitor_interval = 0

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_load import GPT2_SMALL, TINY, build_hf_model, measure_loading, weights_nbytes, weights_sha256  # noqa: E402
from bench_report import Table, markdown_report, update_docs  # noqa: E402
from tl_worker import random_tokens  # noqa: E402

SHAPES = [(1, 128), (1, 1024), (8, 128)]
QUICK_SHAPES = [(1, 128)]
PROMPT_LEN, NEW_TOKENS = 16, 64
TARGETS = {"forward": 1.05, "cache_all": 1.15, "generate_vs_hf": 0.9, "generate_vs_no_cache": 3.0, "load_rss": 1.5}


# --- interleaved A/B timing -------------------------------------------------------------------
def interleaved(contenders: dict[str, Callable[[], float]], rounds: int, warmup: int, label: str) -> dict[str, list[float]]:
    """Run every contender once per round, rotating the order; seconds per contender per round.

    A contender returns its own elapsed seconds (so a subprocess can time itself).
    """
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    for round_index in tqdm(range(rounds), desc=label, leave=False):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            times[name].append(contenders[name]())
    return times


def timed(fn: Callable[[], object], faults: Optional[list] = None) -> Callable[[], float]:
    """A contender that runs ``fn`` under ``inference_mode`` and returns its seconds.

    With ``faults`` it also appends the minor page faults of each run (first touches of
    fresh memory) to that list.
    """

    def run() -> float:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with torch.inference_mode():
            start = time.perf_counter()
            fn()
            seconds = time.perf_counter() - start
        if faults is not None:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return seconds

    return run


# --- TransformerLens worker -------------------------------------------------------------------
class TransformerLensWorker:
    """``tl_worker.py --serve`` in the TransformerLens venv: one JSON command, one JSON answer."""

    def __init__(self, python: str, threads: int, seed: int, shapes):
        shape_text = ",".join(f"{b}x{p}" for b, p in shapes)
        self.process = subprocess.Popen(
            [python, str(HERE / "tl_worker.py"), "--serve", "--threads", str(threads), "--seed", str(seed), "--shapes", shape_text],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self.info = self._read()
        if not self.info.get("ready"):
            raise RuntimeError(f"TransformerLens worker did not start: {self.info}")

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"TransformerLens worker exited with code {self.process.wait()}")
        return json.loads(line)

    def ask(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise RuntimeError(f"TransformerLens worker refused {command}: {answer.get('error')}")
        return answer

    def timer(self, op: str, batch: int, pos: int) -> Callable[[], float]:
        return lambda: self.ask(op=op, batch=batch, pos=pos)["seconds"]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask(op="quit")
        self.process.wait(timeout=30)


def start_transformer_lens(args, shapes) -> tuple[Optional[TransformerLensWorker], str]:
    if args.no_tl or args.config != "gpt2-small":
        return None, "not run (--no-tl or a non-GPT-2-small config)"
    python = Path(args.tl_python)
    if not python.exists():
        return None, f"not run: {python} does not exist (create it with benchmarks/tl_env.sh)"
    worker = TransformerLensWorker(str(python), args.threads, args.seed, shapes)
    versions = worker.info["versions"]
    return worker, f"transformer-lens {versions['transformer-lens']} (transformers {versions['transformers']}, TransformerBridge)"


# --- sections ---------------------------------------------------------------------------------
def bench_forward(ours, hf_eager, hf_sdpa, tl, shapes, rounds, warmup, seed, vocab) -> Table:
    from interp_transformer import shape_checking

    table = Table("Forward pass (tokens -> logits)", ["shape", "contender", "median ms", "x HF best", f"target <= {TARGETS['forward']}x"])
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, vocab)

        def unchecked():
            with shape_checking(False):
                ours(tokens)

        contenders = {
            "interp_transformer": timed(lambda: ours(tokens)),
            "interp_transformer, shape checks off": timed(unchecked),
            "HF eager": timed(lambda: hf_eager(tokens)),
            "HF sdpa": timed(lambda: hf_sdpa(tokens)),
        }
        if tl is not None:
            contenders["TransformerLens"] = tl.timer("forward", batch, pos)
        medians = {k: statistics.median(v) for k, v in interleaved(contenders, rounds, warmup, f"forward {batch}x{pos}").items()}
        best = min(medians["HF eager"], medians["HF sdpa"])
        for name, median in medians.items():
            verdict = meets(median / best, TARGETS["forward"], lower_is_better=True) if name.startswith("interp") else ""
            table.add(f"{batch}x{pos}", name, f"{median * 1e3:.1f}", f"{median / best:.3f}", verdict)
    return table


def bench_cache(ours, tl, shapes, rounds, warmup, seed, vocab) -> Table:
    n_layers = ours.cfg.n_layers
    filters = {
        "everything": None,
        "attention patterns": [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)],
        "resid_post": [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)],
    }
    tl_ops = {"everything": "cache_all", "attention patterns": "cache_pattern", "resid_post": "cache_resid_post"}
    table = Table(
        "run_with_cache",
        ["shape", "contender", "cached", "median ms", "x our forward", "MiB held", "estimate exact", "page faults",
         f"target (all) <= {TARGETS['cache_all']}x"],
    )
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, vocab)
        held: dict[str, tuple[int, int]] = {}

        faults: dict[str, list[int]] = collections.defaultdict(list)

        def cache_run(name, names_filter, dtype=None):
            estimate = ours.estimate_cache_bytes(batch, pos, names_filter=names_filter, dtype=dtype)

            def keep():
                _, cache = ours.run_with_cache(tokens, names_filter=names_filter, dtype=dtype)
                held[name] = (cache.nbytes(), estimate)

            return timed(keep, faults[name])

        contenders = {"forward": timed(lambda: ours(tokens), faults["forward"])}
        for name, names_filter in filters.items():
            contenders[name] = cache_run(name, names_filter)
        contenders["everything, bfloat16 storage"] = cache_run("everything, bfloat16 storage", None, torch.bfloat16)
        tl_bytes: dict[str, int] = {}
        if tl is not None:
            contenders["TL forward"] = tl.timer("forward", batch, pos)
            for name, op in tl_ops.items():
                def tl_run(op=op, name=name):
                    answer = tl.ask(op=op, batch=batch, pos=pos)
                    tl_bytes[name] = answer["cache_bytes_unique"]
                    return answer["seconds"]

                contenders[f"TL {name}"] = tl_run
        medians = {k: statistics.median(v) for k, v in interleaved(contenders, rounds, warmup, f"cache {batch}x{pos}").items()}
        shape = f"{batch}x{pos}"
        table.add(shape, "interp_transformer", "nothing (forward)", f"{medians['forward'] * 1e3:.1f}", "1.000", "0", "",
                  f"{statistics.median(faults['forward']):.0f}", "")
        for name in ["everything", "everything, bfloat16 storage", "attention patterns", "resid_post"]:
            ratio = medians[name] / medians["forward"]
            verdict = meets(ratio, TARGETS["cache_all"], lower_is_better=True) if name == "everything" else ""
            nbytes, estimate = held[name]
            exact = "yes" if nbytes == estimate else f"NO ({estimate} estimated, {nbytes} held)"
            table.add(shape, "interp_transformer", name, f"{medians[name] * 1e3:.1f}", f"{ratio:.3f}", f"{nbytes / 2**20:.1f}", exact,
                      f"{statistics.median(faults[name]):.0f}", verdict)
        if tl is not None:
            for name in tl_ops:
                ratio = medians[f"TL {name}"] / medians["TL forward"]
                table.add(shape, "TransformerLens", name, f"{medians[f'TL {name}'] * 1e3:.1f}", f"{ratio:.3f} (of its own)", f"{tl_bytes[name] / 2**20:.1f}", "", "", "")
    return table


def bench_generate(ours, hf_sdpa, rounds, warmup, seed, vocab) -> Table:
    prompt = random_tokens(1, PROMPT_LEN, seed, vocab)
    outputs: dict[str, torch.Tensor] = {}

    def ours_run(use_kv_cache):
        def run():
            outputs[f"ours {use_kv_cache}"] = ours.generate(prompt, max_new_tokens=NEW_TOKENS, temperature=0.0, stop_at_eos=False, use_kv_cache=use_kv_cache)

        return timed(run)

    def hf_run():
        outputs["hf"] = hf_sdpa.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
            do_sample=False, pad_token_id=0,
        )

    contenders = {"with key/value cache": ours_run(True), "without key/value cache": ours_run(False), "HF generate (sdpa)": timed(hf_run)}
    medians = {k: statistics.median(v) for k, v in interleaved(contenders, rounds, warmup, "generate").items()}
    rate = {name: NEW_TOKENS / seconds for name, seconds in medians.items()}
    same = torch.equal(outputs["ours True"], outputs["hf"]) and torch.equal(outputs["ours False"], outputs["hf"])
    table = Table(
        f"Greedy generation, {NEW_TOKENS} new tokens after a {PROMPT_LEN}-token prompt (ids equal to HF's: {'yes' if same else 'NO'})",
        ["contender", "median s", "tokens/s", "x HF", "x ours without cache", "target"],
    )
    hf_rate, slow_rate = rate["HF generate (sdpa)"], rate["without key/value cache"]
    for name in contenders:
        verdict = ""
        if name == "with key/value cache":
            verdict = f"x HF >= {TARGETS['generate_vs_hf']}: {meets(rate[name] / hf_rate, TARGETS['generate_vs_hf'])}; " \
                      f"x no cache >= {TARGETS['generate_vs_no_cache']}: {meets(rate[name] / slow_rate, TARGETS['generate_vs_no_cache'])}"
        table.add(name, f"{medians[name]:.3f}", f"{rate[name]:.1f}", f"{rate[name] / hf_rate:.2f}", f"{rate[name] / slow_rate:.2f}", verdict)
    return table


def bench_loading(hf_model, hf_config: dict, threads: int, seed: int) -> Table:
    checkpoint = weights_nbytes(hf_model)
    table = Table(
        f"from_pretrained (a fresh process each; the HF float32 weights are {checkpoint / 2**20:.0f} MiB)",
        ["source", "seconds", "peak RSS above baseline, MiB", "our model's weights, MiB", "peak x our weights",
         f"target <= {TARGETS['load_rss']}x", "peak x HF weights"],
    )
    with tempfile.TemporaryDirectory(prefix="bench_load_") as directory:
        hf_model.save_pretrained(directory)
        for source in ("in-memory", "safetensors directory"):
            result = measure_loading(source, directory, hf_config, threads, seed)
            peak, ours = result["peak_above_baseline"], result["model_bytes"]
            table.add(source, f"{result['seconds']:.2f}", f"{peak / 2**20:.0f}", f"{ours / 2**20:.0f}", f"{peak / ours:.2f}",
                      meets(peak / ours, TARGETS["load_rss"], lower_is_better=True), f"{peak / checkpoint:.2f}")
    return table


def forward_flops(cfg, batch: int, pos: int) -> float:
    """Multiply-adds x 2 of one forward: projections, MLP and unembedding, plus attention's two ``pos x pos`` products."""
    d_mlp = cfg.d_mlp or 0
    per_token = cfg.n_layers * (4 * cfg.d_model * cfg.n_heads * cfg.d_head + 2 * cfg.d_model * d_mlp) + cfg.d_model * cfg.d_vocab
    attention = cfg.n_layers * 2 * batch * cfg.n_heads * pos * pos * cfg.d_head
    return 2.0 * (per_token * batch * pos + attention)


def bench_flops(ours, hf_sdpa, shapes, rounds, warmup, seed) -> Table:
    size = 2048
    a, b = torch.randn(size, size), torch.randn(size, size)
    table = Table(f"Achieved GFLOP/s against a plain {size}x{size} @ {size}x{size} float32 matmul", ["shape", "contender", "GFLOP/s", "x plain matmul"])
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, ours.cfg.d_vocab)
        contenders = {"plain matmul": timed(lambda: torch.mm(a, b)), "interp_transformer": timed(lambda: ours(tokens)), "HF sdpa": timed(lambda: hf_sdpa(tokens))}
        medians = {k: statistics.median(v) for k, v in interleaved(contenders, rounds, warmup, f"flops {batch}x{pos}").items()}
        rates = {"plain matmul": 2 * size**3 / medians["plain matmul"] / 1e9}
        for name in ("interp_transformer", "HF sdpa"):
            rates[name] = forward_flops(ours.cfg, batch, pos) / medians[name] / 1e9
        for name, rate in rates.items():
            table.add(f"{batch}x{pos}", name, f"{rate:.1f}", f"{rate / rates['plain matmul']:.2f}")
    return table


def meets(ratio: float, target: float, lower_is_better: bool = False) -> str:
    ok = ratio <= target if lower_is_better else ratio >= target
    return "met" if ok else f"MISSED ({ratio:.2f} vs {target})"


# --- main -------------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warmup, forward/cache/FLOP/s at 1x128 only")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per measurement (default 7, quick 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", choices=["gpt2-small", "tiny"], default="gpt2-small", help="tiny: a 2-layer model, to smoke-test this script")
    parser.add_argument("--sections", default="forward,cache,generate,load,flops")
    parser.add_argument("--tl-python", default=str(REPO / ".venv-tl" / "bin" / "python"), help="python of the TransformerLens venv")
    parser.add_argument("--no-tl", action="store_true", help="skip TransformerLens")
    parser.add_argument("--out", default=str(HERE / "results" / "latest.md"), help="write the markdown report here")
    parser.add_argument("--json", default=None, help="also write the tables as JSON here")
    parser.add_argument("--update-docs", action="store_true", help="write the report into docs/performance.md")
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - {"forward", "cache", "generate", "load", "flops"}
    if unknown:
        parser.error(f"--sections takes forward,cache,generate,load,flops; received unknown {sorted(unknown)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from interp_transformer import DemoTransformer

    torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    warmup = 1 if args.quick else 2
    shapes = QUICK_SHAPES if args.quick else SHAPES
    sections = args.sections.split(",")
    hf_config = GPT2_SMALL if args.config == "gpt2-small" else TINY
    if args.config == "tiny":
        shapes = [(1, 16), (2, 8)]

    started = time.time()
    hf_eager = build_hf_model(hf_config, args.seed, "eager")
    hf_sdpa = build_hf_model(hf_config, args.seed, "sdpa")
    ours = DemoTransformer.from_pretrained(hf_eager).eval()
    vocab = hf_config["vocab_size"]
    tl, tl_note = start_transformer_lens(args, shapes) if {"forward", "cache"} & set(sections) else (None, "not needed")
    try:
        if tl is not None:
            if tl.info["weights_sha256"] != weights_sha256(hf_eager):
                raise RuntimeError("TransformerLens worker built other weights than this process (sha256 differs)")
        tables = []
        if "forward" in sections:
            tables.append(bench_forward(ours, hf_eager, hf_sdpa, tl, shapes, rounds, warmup, args.seed, vocab))
        if "cache" in sections:
            tables.append(bench_cache(ours, tl, shapes, rounds, warmup, args.seed, vocab))
    finally:
        if tl is not None:
            tl.close()
    if "generate" in sections:
        tables.append(bench_generate(ours, hf_sdpa, max(3, rounds // 2), 1, args.seed, vocab))
    if "load" in sections:
        tables.append(bench_loading(hf_eager, hf_config, args.threads, args.seed))
    if "flops" in sections:
        tables.append(bench_flops(ours, hf_sdpa, shapes, rounds, warmup, args.seed))

    command = "python benchmarks/bench.py" + ("" if argv is None and len(sys.argv) == 1 else " " + " ".join(argv if argv is not None else sys.argv[1:]))
    context = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "minutes": f"{(time.time() - started) / 60:.1f}",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, torch {torch.__version__}, {args.threads} threads",
        "load average": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rounds": f"{rounds} interleaved rounds after {warmup} warmup",
        "TransformerLens": tl_note,
        "model": f"{args.config}: {json.dumps(hf_config)}",
    }
    report = markdown_report(tables, context)
    print(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps([t.as_dict() for t in tables], indent=1), encoding="utf-8")
    if args.update_docs:
        update_docs(REPO / "docs" / "performance.md", report)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

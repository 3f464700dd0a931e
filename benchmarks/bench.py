"""Speed and memory of interp_transformer against Hugging Face and TransformerLens, in one run.

    python benchmarks/bench.py                   # GPT-2 small and SmolLM2-135M shapes (about 40 minutes)
    python benchmarks/bench.py --config smollm2  # one model
    python benchmarks/bench.py --config pythia-160m,gemma2,mixtral  # GPT-NeoX, Gemma 2 and Mixtral shapes
    python benchmarks/bench.py --quick           # fewer rounds, 1x128 only
    python benchmarks/bench.py --update-docs     # also write the report into docs/performance.md

Each model (``--config``, names of ``BENCH_MODELS``) runs on random weights, float32,
``--threads`` threads (default 2), under ``torch.inference_mode()``: a Hugging Face
model built from a seed (``hf_models.py``; eager and sdpa attention, eager only for
Gemma 2, which Hugging Face refuses to run with sdpa) and ours made from it by
``interp_transformer.from_pretrained``, whose logits must match Hugging Face's
before anything is timed. Each measurement is interleaved
A/B: every round runs each contender once, in an order shuffled per round, so a busy machine
slows all of them alike; the tables report medians over rounds and ratios taken
within the same run. TransformerLens 4.x runs in its own venv
(``benchmarks/tl_env.sh``) as a subprocess (``benchmarks/tl_worker.py --serve``),
built from the same seed; its weights' sha256 is checked against ours. A model
TransformerLens cannot build or run gets a note saying why, in place of its rows.

Sections: forward logits; ``run_with_cache`` (everything / attention patterns /
``resid_post``) with the bytes each cache holds; greedy generation (64 new tokens
after a 16-token prompt) with and without the key/value cache against HF
``generate``; loading (``from_pretrained`` from an in-memory HF model, a safetensors
directory and, for SmolLM2, its GGUF file beside transformers' own GGUF loading:
time and peak RSS, each in a fresh process); achieved GFLOP/s of the forward
against a plain large matmul.
"""

import argparse
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_load import bench_loading  # noqa: E402
from bench_report import Table, markdown_report, update_docs  # noqa: E402
from bench_sections import bench_cache, bench_flops, bench_forward, bench_generate  # noqa: E402
from bench_timing import start_transformer_lens  # noqa: E402
from hf_models import build_hf_model, family_of, model_spec, weights_sha256  # noqa: E402

SECTIONS = ("forward", "cache", "generate", "load", "flops")
GPT2_TARGETS = {"forward": 1.05, "cache_all": 1.15, "generate_vs_hf": 0.9, "generate_vs_no_cache": 3.0, "load_rss": 1.5}
LLAMA_TARGETS = {
    "forward": 1.05,
    "cache_all": 1.15,
    "generate_vs_hf": 0.9,
    "load_rss": 1.5,
    "gguf_seconds": 15.0,
    "gguf_rss": 2.0,
}
# Gemma 3 270M's GGUF file: faster than transformers' GGUF loader (about 60 s here), peak RSS <= 2x the float32 weights
GEMMA3_TARGETS = {
    "forward": 1.05,
    "cache_all": 1.15,
    "generate_vs_hf": 0.9,
    "load_rss": 1.5,
    "gguf_seconds": 30.0,
    "gguf_rss": 2.0,
}
DECODER_TARGETS = {"forward": 1.05, "cache_all": 1.15, "generate_vs_hf": 0.9, "load_rss": 1.5}  # no GGUF file for these


@dataclass(frozen=True)
class BenchModel:
    """What the benchmark runs for one model of ``hf_models.HF_MODELS``."""

    shapes: tuple[tuple[int, int], ...]  # (batch, pos) of forward, cache and FLOP/s
    quick_shapes: tuple[tuple[int, int], ...]  # the same with --quick
    targets: dict  # ratio targets, see GPT2_TARGETS / LLAMA_TARGETS / DECODER_TARGETS
    gguf: str | None = None  # GGUF file or name the load section reads (ours and transformers')


BENCH_MODELS = {
    "gpt2-small": BenchModel(((1, 128), (1, 1024), (8, 128)), ((1, 128),), GPT2_TARGETS),
    "smollm2": BenchModel(((1, 128), (1, 512)), ((1, 128),), LLAMA_TARGETS, gguf="smollm2-135m"),
    "pythia-160m": BenchModel(((1, 128), (1, 1024), (8, 128)), ((1, 128),), DECODER_TARGETS),
    "gemma2": BenchModel(((1, 128), (4, 128), (1, 512)), ((1, 128),), DECODER_TARGETS),
    "mixtral": BenchModel(((1, 128), (4, 128), (1, 512)), ((1, 128),), DECODER_TARGETS),
    "gemma3-270m": BenchModel(((1, 128), (1, 512)), ((1, 128),), GEMMA3_TARGETS, gguf="gemma3-270m"),
    "tiny": BenchModel(((1, 16), (2, 8)), ((1, 16), (2, 8)), GPT2_TARGETS),
    "tiny-llama": BenchModel(((1, 16), (2, 8)), ((1, 16), (2, 8)), LLAMA_TARGETS),
    "tiny-neox": BenchModel(((1, 16), (2, 8)), ((1, 16), (2, 8)), DECODER_TARGETS),
    "tiny-gemma2": BenchModel(((1, 16), (2, 8)), ((1, 16), (2, 8)), DECODER_TARGETS),
    "tiny-mixtral": BenchModel(((1, 16), (2, 8)), ((1, 16), (2, 8)), DECODER_TARGETS),
}
# Encoder-decoders (``bench_encdec.py``): a forward on a batch x source x target shape and greedy
# generation, against Hugging Face's T5 in the same run; the decoder sections above do not apply.
ENCDEC_MODELS = {
    "t5-small": dict(tiny=False, batch=4, source_len=64, target_len=32, new_tokens=32),
    "tiny-t5": dict(tiny=True, batch=2, source_len=12, target_len=6, new_tokens=6),
}


def bench_encdec_model(name: str, args, rounds: int, warmup: int) -> tuple[list[Table], dict[str, str]]:
    """An encoder-decoder's forward and generation tables (the sections that apply to it)."""
    from bench_encdec import t5_tables

    wanted = {"forward", "generate"} & set(args.sections.split(","))
    if not wanted:
        return [], {f"model {name}": "not run: an encoder-decoder has only the forward and generate sections"}
    tables, context = t5_tables(seed=args.seed, rounds=rounds, warmup=warmup, **ENCDEC_MODELS[name])
    kept = [table for table, section in zip(tables, ("forward", "generate")) if section in wanted]
    for table in kept:
        table.title = f"{name}: {table.title}"
    return kept, {f"model {name}": f"T5ForConditionalGeneration, {context['shape']}, {context['dtype']}"}


def bench_model(name: str, args, rounds: int, warmup: int) -> tuple[list[Table], dict[str, str]]:
    """Every chosen section for one model: its tables, and lines for the report's header."""
    import interp_transformer

    if name in ENCDEC_MODELS:
        return bench_encdec_model(name, args, rounds, warmup)
    spec = BENCH_MODELS[name]
    family, config = model_spec(name)
    shapes = args.shapes or (spec.quick_shapes if args.quick else spec.shapes)
    sections = args.sections.split(",")
    seed = args.seed
    hf = {attention: build_hf_model(family, config, seed, attention) for attention in family_of(family).attention}
    hf_eager = hf["eager"]
    ours = interp_transformer.from_pretrained(hf_eager).eval()
    tl, tl_note = None, "not needed (no forward or cache section)"
    if {"forward", "cache"} & set(sections):
        tl, tl_note = (
            (None, "not run (--no-tl)")
            if args.no_tl
            else start_transformer_lens(args.tl_python, name, args.threads, seed, shapes)
        )
    tables: list[Table] = []

    def add(make_table: Callable[[], Table]) -> None:
        """Run one section; its title records the 1-minute load average before and after (the machine's business)."""
        before = os.getloadavg()[0]
        table = make_table()
        table.title += f" [load average {before:.1f} -> {os.getloadavg()[0]:.1f}]"
        tables.append(table)

    # objects alive now (modules, models) stay: the collection before each timed run then scans
    # only what the runs made, in milliseconds rather than the half second a full scan takes
    gc.collect()
    gc.freeze()
    try:
        if tl is not None and tl.info["weights_sha256"] != weights_sha256(hf_eager):
            raise RuntimeError(
                f"the TransformerLens worker built other weights than this process for {name} (sha256 differs)"
            )
        if "forward" in sections:
            add(lambda: bench_forward(name, ours, hf, tl, tl_note, shapes, rounds, warmup, seed, spec.targets))
        if "cache" in sections:
            add(lambda: bench_cache(name, ours, tl, shapes, rounds, warmup, seed, spec.targets))
        if tl is not None:
            tl.close()
            worst = max(
                value
                for check in tl.info["verification"]
                for key, value in check.items()
                if key.startswith("max_abs_diff")
            )
            tl_note += f", weights sha256 equal to ours, {tl.info['hook_points']} hook points"
            tl_note += f", max |logits - HF logits| {worst:.1e}"
            tl = None
        if "generate" in sections:
            add(lambda: bench_generate(name, ours, hf, rounds, 1, seed, spec.targets))
        if "load" in sections:
            gguf = args.tiny_gguf if name == "tiny-llama" else spec.gguf
            add(lambda: bench_loading(name, hf_eager, args.threads, seed, spec.targets, gguf))
        if "flops" in sections:
            add(lambda: bench_flops(name, ours, hf, shapes, rounds, warmup, seed))
    finally:
        if tl is not None:
            tl.close()
        gc.unfreeze()  # this model's objects may go once the caller drops them
    context = {f"model {name}": f"{type(hf_eager).__name__} {json.dumps(config)}", f"TransformerLens, {name}": tl_note}
    return tables, context


def parse_shapes(parser: argparse.ArgumentParser, text: str) -> tuple[tuple[int, int], ...]:
    """``"1x128,1x512"`` -> ``((1, 128), (1, 512))``; a parser error naming what was received otherwise."""
    shapes = []
    for item in text.split(","):
        batch, _, pos = item.strip().partition("x")
        if not (batch.isdigit() and pos.isdigit() and int(batch) > 0 and int(pos) > 0):
            parser.error(f"--shapes takes batch x pos pairs such as 1x128,8x128; received {item!r}")
        shapes.append((int(batch), int(pos)))
    return tuple(shapes)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warmup, forward/cache/FLOP/s at 1x128 only")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per measurement (default 7, quick 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--config",
        default="gpt2-small,smollm2",
        help=f"comma-separated models from {sorted({*BENCH_MODELS, *ENCDEC_MODELS})}; t5-small and "
        "tiny-t5: encoder-decoders (forward and generate only); tiny*: 2-layer models, to "
        "smoke-test this script",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument(
        "--shapes",
        default=None,
        help="batch x pos of forward, cache and FLOP/s for every model, e.g. 1x512 (default: the model's)",
    )
    parser.add_argument(
        "--tl-python", default=str(REPO / ".venv-tl" / "bin" / "python"), help="python of the TransformerLens venv"
    )
    parser.add_argument("--no-tl", action="store_true", help="skip TransformerLens")
    parser.add_argument(
        "--tiny-gguf", default=None, help="a GGUF file for tiny-llama's load section (the test suite writes one)"
    )
    parser.add_argument("--out", default=str(HERE / "results" / "latest.md"), help="write the markdown report here")
    parser.add_argument("--json", default=None, help="also write the tables as JSON here")
    parser.add_argument("--update-docs", action="store_true", help="write the report into docs/performance.md")
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections takes {','.join(SECTIONS)}; received unknown {sorted(unknown)}")
    unknown = set(args.config.split(",")) - set(BENCH_MODELS) - set(ENCDEC_MODELS)
    if unknown:
        parser.error(
            f"--config takes models from {sorted({*BENCH_MODELS, *ENCDEC_MODELS})}; received unknown {sorted(unknown)}"
        )
    args.shapes = parse_shapes(parser, args.shapes) if args.shapes else None
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be at least 1, received {args.rounds}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    warmup = 1 if args.quick else 2

    started = time.time()
    tables: list[Table] = []
    model_context: dict[str, str] = {}
    for name in args.config.split(","):
        model_tables, context = bench_model(name, args, rounds, warmup)
        tables += model_tables
        model_context.update(context)

    given = sys.argv[1:] if argv is None else list(argv)
    context = {
        "command": " ".join(["python benchmarks/bench.py", *given]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "minutes": f"{(time.time() - started) / 60:.1f}",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, torch "
        f"{torch.__version__}, {args.threads} threads",
        "load average": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rounds": f"{rounds} interleaved rounds after {warmup} warmup",
        **model_context,
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

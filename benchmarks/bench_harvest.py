"""Harvest throughput with 1 and 2 processes, and peak memory against the estimate.

    python benchmarks/bench_harvest.py                 # 45 to 80 s on 2 CPU cores, with their load
    python benchmarks/bench_harvest.py --contexts 64   # shorter

Builds a random-weight GPT-2 (``--layers``, ``--d-model``; GPT-2's vocabulary), saves
it as a Hugging Face directory, writes a corpus of random token ids, then runs the
same harvest command three times, each in fresh processes:

- 1 process (``python -m interp_transformer.harvest``), with torch's default threads and with one;
- 2 processes (``torchrun --nproc_per_node 2``, one thread each, torchrun's default).

It prints, from each run's ``runs.jsonl``: tokens per second of the harvest loop,
the whole command's wall time, the peak resident memory during the loop above
what the process held when the loop started, and the activations the budget
accounts for (one batch's ``estimate_cache_bytes`` and output, plus one shard); then the
2-process / 1-process ratio, the bytes on disk against ``n_contexts x
bytes_per_context``, and whether both runs wrote identical shards.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from interp_transformer.harvest.budget import format_bytes  # noqa: E402
from interp_transformer.harvest.manifest import Manifest  # noqa: E402


def write_model(directory: Path, layers: int, d_model: int, n_ctx: int) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=d_model, n_head=d_model // 64, n_positions=n_ctx, vocab_size=50257)
    GPT2LMHeadModel(config).save_pretrained(directory)


def write_corpus(path: Path, n_tokens: int) -> None:
    generator = torch.Generator().manual_seed(0)
    written = 0
    with open(path, "w") as handle:
        while written < n_tokens:
            length = int(torch.randint(50, 400, (1,), generator=generator))
            handle.write(json.dumps({"text": torch.randint(0, 50256, (length,), generator=generator).tolist()}) + "\n")
            written += length + 1


def run(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"command failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--contexts", type=int, default=384, help="contexts to harvest (default: 384)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--shard-contexts", type=int, default=32)
    parser.add_argument(
        "--hooks",
        nargs="+",
        default=["blocks.1.hook_resid_post", "blocks.3.hook_resid_post"],
        help="hooks to keep (default: two middle layers, where SAEs are usually trained)",
    )
    parser.add_argument("--keep", type=Path, help="keep the model, corpus and harvests in this folder")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-harvest-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir, corpus = work / "model", work / "corpus.jsonl"
    write_model(model_dir, args.layers, args.d_model, args.context_length)
    write_corpus(corpus, args.contexts * (args.context_length - 1))
    common = [
        "--model",
        str(model_dir),
        "--corpus",
        str(corpus),
        "--context-length",
        str(args.context_length),
        "--batch-size",
        str(args.batch_size),
        "--shard-contexts",
        str(args.shard_contexts),
        "--hooks",
        *args.hooks,
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("OMP_NUM_THREADS", None)
    single = [sys.executable, "-m", "interp_transformer.harvest", *common, "--out"]
    runs = {  # label: (command, OMP_NUM_THREADS or None for torch's default)
        f"1 process, {torch.get_num_threads()} threads": (single + [str(work / "one")], None),
        "1 process, 1 thread": (single + [str(work / "one-thread")], "1"),
        "2 processes (torchrun), 1 thread each": (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                "-m",
                "interp_transformer.harvest",
                *common,
                "--out",
                str(work / "two"),
            ],
            None,
        ),
    }
    for folder in ("one", "one-thread", "two"):
        if (work / folder).exists():
            raise SystemExit(
                f"{work / folder} exists: the benchmark measures fresh harvests (remove it, or pick another --keep)"
            )
    results = {}
    for label, (command, threads) in runs.items():
        wall = run(command, env if threads is None else {**env, "OMP_NUM_THREADS": threads})
        out = Path(command[command.index("--out") + 1])
        results[label] = (
            wall,
            json.loads((out / "runs.jsonl").read_text().splitlines()[-1]),
            Manifest.read(out).verify(),
        )

    one, _, two = (results[label][2] for label in runs)
    print(
        f"model: random GPT-2, {args.layers} layers, d_model {args.d_model}, vocab 50257; "
        f"{one.n_contexts} contexts x {one.context_length} tokens = {one.total_tokens()} tokens; hooks "
        f"{one.hook_names}; "
        f"batch {args.batch_size}, {args.shard_contexts} contexts per shard; torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| run | tokens/s (harvest loop) | wall s (command) | peak RSS above loop start, per rank | estimate (batch "
        "cache + output + shard) |"
    )
    print("|---|---|---|---|---|")
    for label, (wall, log, _) in results.items():
        above = [format_bytes(peak - before) for peak, before in zip(log["peak_rss_bytes"], log["rss_before_bytes"])]
        print(
            f"| {label} | {log['tokens_per_second']:,.0f} | {wall:.1f} | {', '.join(above)} | "
            f"{format_bytes(log['estimated_held_bytes'])} |"
        )
    speed = [results[label][1]["tokens_per_second"] for label in runs]
    print(
        f"\n2 processes / 1 process, tokens/s: {speed[2] / speed[0]:.2f}x against {list(runs)[0]}, "
        f"{speed[2] / speed[1]:.2f}x against 1 thread"
    )
    on_disk = sum(shard.bytes for shard in one.shards)
    itemsize = torch.empty((), dtype=getattr(torch, one.fingerprint["dtype"])).element_size()
    per_context = sum(math.prod(hook["shape"]) for hook in one.hooks) * itemsize + 4 * one.context_length + 8
    print(
        f"on disk: {format_bytes(on_disk)} in {len(one.shards)} shards; n_contexts x bytes_per_context = "
        f"{one.n_contexts} x {per_context:,} = {format_bytes(one.n_contexts * per_context)} (the rest: safetensors "
        "headers)"
    )
    print(
        "identical shards from 1 and 2 processes: "
        f"{'yes' if [s.sha256 for s in one.shards] == [s.sha256 for s in two.shards] else 'NO'}"
    )
    if args.keep:
        print(f"folder: {work}")
    else:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

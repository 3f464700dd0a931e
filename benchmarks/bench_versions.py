"""Two versions of interp_transformer and Hugging Face, timed in one interleaved run: did a change cost speed?

    python benchmarks/bench_versions.py --base 483b7b0            # that commit against the working tree
    python benchmarks/bench_versions.py --base main --rounds 9 --shapes 1x128,1x1024

Each version runs in its own worker process (``PYTHONPATH`` set to its checkout; the
base commit is checked out into a temporary git worktree, removed afterwards), and so
does Hugging Face's model (sdpa attention). Every worker builds the same random-weight
model (``--config``: GPT-2 small by default, or ``smollm2``, SmolLM2-135M's shape; see
``hf_models.py``) from the same seed (ours through ``DemoTransformer.from_pretrained`` of the
Hugging Face model) and times one operation per request under ``torch.inference_mode()``:
the forward pass and ``run_with_cache`` keeping everything. Each round asks every worker
once, in an order shuffled per round, so a busy machine slows all of them alike; the table gives
medians and the ratios of both versions to Hugging Face, and of the new to the base, in wall
time and in CPU time (``time.process_time``: less sensitive to other processes on the machine).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
import hf_models
family, config = hf_models.model_spec(sys.argv[3])
hf = hf_models.build_hf_model(family, config, seed=0, attn_implementation="sdpa" if sys.argv[2] == "hf" else "eager")
vocab = hf.config.vocab_size
if sys.argv[2] == "hf":
    run = {"forward": lambda tokens: hf(tokens, use_cache=False).logits}
else:
    from interp_transformer import DemoTransformer
    model = DemoTransformer.from_pretrained(hf).eval()
    del hf
    run = {"forward": lambda tokens: model(tokens), "cache_all": lambda tokens: model.run_with_cache(tokens)}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "quit":
        break
    tokens = hf_models.random_tokens(request["batch"], request["pos"], 1, vocab)
    with torch.inference_mode():
        start, cpu_start = time.perf_counter(), time.process_time()
        out = run[request["op"]](tokens)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    del out
    print(json.dumps({"seconds": seconds, "cpu": cpu}), flush=True)
"""


class Worker:
    def __init__(self, name: str, kind: str, pythonpath: str, threads: int, config: str):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([pythonpath, str(REPO / "benchmarks")]))
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(threads), kind, config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        if not json.loads(self.process.stdout.readline()).get("ready"):
            raise RuntimeError(f"worker {name} did not start")

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.process.stdin.flush()
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="git revision to compare the working tree against")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", default="1x128,1x1024,8x128")
    parser.add_argument("--config", default="gpt2-small", help="a model of hf_models.py: gpt2-small, smollm2, ...")
    args = parser.parse_args()
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        base_dir = Path(scratch) / "base"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_dir), args.base],
            check=True,
            capture_output=True,
        )
        try:
            workers = [
                Worker("base", "ours", str(base_dir), args.threads, args.config),
                Worker("new", "ours", str(REPO), args.threads, args.config),
                Worker("HF sdpa", "hf", str(REPO), args.threads, args.config),
            ]
            rows = []
            for batch, pos in shapes:
                for op in ("forward", "cache_all"):
                    contenders = [w for w in workers if op == "forward" or w.name != "HF sdpa"]
                    times = {w.name: [] for w in contenders}
                    cpu = {w.name: [] for w in contenders}
                    for round_index in range(args.warmup + args.rounds):
                        for worker in random.Random(round_index).sample(contenders, len(contenders)):
                            answer = worker.ask(op=op, batch=batch, pos=pos)
                            if round_index >= args.warmup:
                                times[worker.name].append(answer["seconds"])
                                cpu[worker.name].append(answer["cpu"])
                    medians = {name: statistics.median(values) for name, values in times.items()}
                    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
                    rows.append((f"{batch}x{pos}", op, medians, cpu_medians))
                    print(
                        f"{batch}x{pos} {op}: " + ", ".join(f"{n} {m * 1e3:.1f} ms" for n, m in medians.items()),
                        file=sys.stderr,
                    )
            for worker in workers:
                worker.close()
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_dir)],
                check=False,
                capture_output=True,
            )
    forward = {shape: medians for shape, op, medians, _ in rows if op == "forward"}
    print(
        "| shape | measure | base ms | new ms | HF sdpa ms | base x HF | new x HF | new x base | new x base, CPU time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for shape, op, medians, cpu in rows:
        hf = forward[shape]["HF sdpa"]
        what = "forward" if op == "forward" else "run_with_cache everything"
        print(
            f"| {shape} | {what} | {medians['base'] * 1e3:.1f} | {medians['new'] * 1e3:.1f} | {hf * 1e3:.1f} | "
            f"{medians['base'] / hf:.3f} | {medians['new'] / hf:.3f} | {medians['new'] / medians['base']:.3f} | "
            f"{cpu['new'] / cpu['base']:.3f} |"
        )


if __name__ == "__main__":
    main()

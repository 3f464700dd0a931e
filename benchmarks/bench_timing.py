"""Interleaved A/B timing, and the TransformerLens worker as one more contender.

Every round runs each contender once, in a rotating order, so that whatever else
the machine is doing slows all of them alike; ratios are taken between medians of
the same run.
"""

import contextlib
import gc
import json
import resource
import statistics
import subprocess
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


def interleaved_medians(contenders: dict[str, Callable[[], float]], rounds: int, warmup: int, label: str) -> dict[str, float]:
    """Median seconds of each contender over ``interleaved`` rounds."""
    return {name: statistics.median(times) for name, times in interleaved(contenders, rounds, warmup, label).items()}


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


def meets(ratio: float, target: float, lower_is_better: bool = False) -> str:
    ok = ratio <= target if lower_is_better else ratio >= target
    return "met" if ok else f"MISSED ({ratio:.2f} vs {target})"


class TransformerLensWorker:
    """``tl_worker.py --serve`` in the TransformerLens venv: one JSON command, one JSON answer."""

    def __init__(self, python: str, model: str, threads: int, seed: int, shapes):
        shape_text = ",".join(f"{b}x{p}" for b, p in shapes)
        self.stderr = open(HERE / "results" / f"tl_worker_{model}.log", "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(
            [python, str(HERE / "tl_worker.py"), "--serve", "--model", model, "--threads", str(threads), "--seed", str(seed),
             "--shapes", shape_text],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
        )
        try:
            self.info = self._read()
        except RuntimeError:
            self.stderr.close()
            raise
        if not self.info.get("ready"):
            self.close()
            raise RuntimeError(f"TransformerLens worker did not start: {self.info}")

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"TransformerLens worker exited with code {self.process.wait()} (its log: {self.stderr.name})")
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
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            self.ask(op="quit")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def start_transformer_lens(tl_python: str, model: str, threads: int, seed: int, shapes) -> tuple[Optional[TransformerLensWorker], str]:
    """The worker for ``model``, and a note for the report: its versions, or why it was not run."""
    python = Path(tl_python)
    if not python.exists():
        return None, f"not run: {python} does not exist (create it with benchmarks/tl_env.sh)"
    (HERE / "results").mkdir(exist_ok=True)
    try:
        worker = TransformerLensWorker(str(python), model, threads, seed, shapes)
    except RuntimeError as error:
        return None, f"could not load this model: {error}"
    versions = worker.info["versions"]
    return worker, f"transformer-lens {versions['transformer-lens']} (transformers {versions['transformers']}, TransformerBridge)"

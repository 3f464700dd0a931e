"""Interleaved A/B timing, and the TransformerLens worker as one more contender.

Every round runs each contender once, in an order shuffled per round, so that
whatever else the machine is doing slows all of them alike; ratios are taken between
medians of the same run.
"""

import contextlib
import gc
import json
import random
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
import tqdm as tqdm_module
from tqdm import tqdm

from hf_models import model_spec

# tqdm's monitor thread wakes while a measurement runs and was seen to stretch a 2 ms
# forward to 80 ms; the bars refresh between rounds without it
tqdm_module.tqdm.monitor_interval = 0

HERE = Path(__file__).resolve().parent


def interleaved(
    contenders: dict[str, Callable[[], tuple[float, float]]], rounds: int, warmup: int, label: str
) -> dict[str, list[tuple[float, float]]]:
    """Run every contender once per round, in a shuffled order; ``(wall, CPU)`` seconds per contender per round.

    A contender returns its own elapsed wall-clock and CPU seconds (so a subprocess can time itself).
    The order is a permutation seeded by the round index, not a rotation: a rotation keeps
    the cyclic order, so one contender ran right after the same neighbour every round, and
    the one after the TransformerLens subprocess came out up to 10% slower than an
    identical contender (our model with and without shape checks).
    """
    names = list(contenders)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    for round_index in tqdm(range(rounds), desc=label, leave=False):
        for name in random.Random(round_index).sample(names, len(names)):
            gc.collect()
            times[name].append(contenders[name]())
    return times


def interleaved_medians(
    contenders: dict[str, Callable[[], tuple[float, float]]], rounds: int, warmup: int, label: str
) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall-clock seconds and median CPU seconds of each contender over ``interleaved`` rounds.

    CPU time (``time.process_time``, every thread of the process) counts only what the contender
    computed, so other processes on the machine disturb it less than the wall clock; with several
    threads it also counts their waits for one another.
    """
    times = interleaved(contenders, rounds, warmup, label)
    wall = {name: statistics.median(t[0] for t in runs) for name, runs in times.items()}
    cpu = {name: statistics.median(t[1] for t in runs) for name, runs in times.items()}
    return wall, cpu


def timed(fn: Callable[[], object], faults: list | None = None) -> Callable[[], tuple[float, float]]:
    """A contender that runs ``fn`` under ``inference_mode`` and returns its wall-clock and CPU seconds.

    With ``faults`` it also appends the minor page faults of each run (first touches of
    fresh memory) to that list.
    """

    def run() -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with torch.inference_mode():
            start, cpu_start = time.perf_counter(), time.process_time()
            fn()
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        if faults is not None:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return seconds, cpu

    return run


def meets(ratio: float, target: float, lower_is_better: bool = False) -> str:
    ok = ratio <= target if lower_is_better else ratio >= target
    return "met" if ok else f"MISSED ({ratio:.2f} vs {target})"


class TransformerLensCannotRun(RuntimeError):
    """The worker said, or showed by exiting, that TransformerLens cannot build or run the model; the message says
    why."""


class TransformerLensWorker:
    """``tl_worker.py --serve`` in the TransformerLens venv: one JSON command, one JSON answer.

    ``TransformerLensCannotRun`` if the worker is not ready: it answered ``{"ready": false,
    "error": ...}`` or exited before answering (the reason is then its log's last line).
    """

    def __init__(self, python: str, model: str, threads: int, seed: int, shapes):
        shape_text = ",".join(f"{b}x{p}" for b, p in shapes)
        log = HERE / "results" / f"tl_worker_{model}.log"
        self.stderr = open(log, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(
            [
                python,
                str(HERE / "tl_worker.py"),
                "--serve",
                "--model",
                model,
                "--threads",
                str(threads),
                "--seed",
                str(seed),
                "--shapes",
                shape_text,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        try:
            self.info = self._read()
        except RuntimeError as error:
            self.stderr.close()
            raise TransformerLensCannotRun(str(error)) from error
        if not self.info.get("ready"):
            self.close()
            raise TransformerLensCannotRun(f"{self.info.get('error', self.info)} (its log: {self.stderr.name})")

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            self.stderr.flush()
            logged = [
                text.strip() for text in Path(self.stderr.name).read_text(encoding="utf-8").splitlines() if text.strip()
            ]
            raise RuntimeError(
                f"worker exited with code {code}: {logged[-1] if logged else 'no output'} (its log: {self.stderr.name})"
            )
        return json.loads(line)

    def ask(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise RuntimeError(f"TransformerLens worker refused {command}: {answer.get('error')}")
        return answer

    def timer(self, op: str, batch: int, pos: int) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            answer = self.ask(op=op, batch=batch, pos=pos)
            return answer["seconds"], answer["cpu_seconds"]

        return run

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            self.ask(op="quit")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def start_transformer_lens(
    tl_python: str, model: str, threads: int, seed: int, shapes
) -> tuple[TransformerLensWorker | None, str]:
    """The worker for ``model``, and a note for the report: its versions, or why it was not run.

    A model TransformerLens cannot build or run is not an error of the benchmark: the
    note says ``not run: TransformerLens cannot build <family>: <reason>`` and the
    other contenders go on.
    """
    python = Path(tl_python)
    if not python.exists():
        return None, f"not run: {python} does not exist (create it with benchmarks/tl_env.sh)"
    (HERE / "results").mkdir(exist_ok=True)
    try:
        worker = TransformerLensWorker(str(python), model, threads, seed, shapes)
    except TransformerLensCannotRun as error:
        return None, f"not run: TransformerLens cannot build {model_spec(model)[0]}: {error}"
    versions = worker.info["versions"]
    return (
        worker,
        f"transformer-lens {versions['transformer-lens']} (transformers {versions['transformers']}, TransformerBridge)",
    )

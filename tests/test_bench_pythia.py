"""The Pythia benchmark runs end to end (on a tiny model) and reports what it measured; timings are not asserted."""

import subprocess
import sys
from pathlib import Path

from .test_benchmarks import table_rows

REPO = Path(__file__).resolve().parents[1]


def test_bench_pythia_runs_on_a_tiny_model(tmp_path):
    out = tmp_path / "report.md"
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_pythia.py"),
        "--config",
        "tiny",
        "--rounds",
        "1",
        "--out",
        str(out),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = out.read_text()
    forward = table_rows(report, "Forward pass")
    assert {row[1] for row in forward} == {"interp_transformer", "HF eager", "HF sdpa"} and all(
        float(row[2]) > 0 for row in forward
    )
    cache = table_rows(report, "run_with_cache")
    assert {row[1] for row in cache} == {"nothing (forward)", "everything", "attention patterns", "resid_post"}
    held = {row[1]: float(row[4]) for row in cache}  # MiB each cache held
    assert held["nothing (forward)"] == 0 and held["everything"] > held["resid_post"] > 0

"""The Gemma/Mixtral benchmark script runs end to end on tiny models and its logits agree with Hugging Face's.

Timings are not asserted (they belong to the benchmark's report); every contender's row is,
and its largest logit difference from Hugging Face.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_benchmark_runs_and_agrees_with_hugging_face(tmp_path):
    out = tmp_path / "report.md"
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_gemma_moe.py"),
        "--config",
        "tiny",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.read_text().splitlines()[4:]]
    assert {(row[0], row[2]) for row in rows} == {
        ("Gemma 2", "interp_transformer"),
        ("Gemma 2", "Hugging Face"),
        ("Mixtral", "interp_transformer"),
        ("Mixtral", "Hugging Face"),
        ("Mixtral", "interp_transformer, explicit experts"),
    }
    assert all(float(row[3]) > 0 and float(row[5]) < 1e-4 for row in rows)

"""The encoder-decoder benchmark runs end to end on a tiny T5 and its generation gives Hugging Face's ids."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_encdec_runs_on_a_tiny_t5(tmp_path):
    out = tmp_path / "report.md"
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_encdec.py"),
        "--tiny",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--batch",
        "2",
        "--source",
        "12",
        "--target",
        "6",
        "--new",
        "6",
        "--out",
        str(out),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = out.read_text()
    assert "### Forward pass, source (2, 12), target (2, 6)" in report
    assert "ids equal to HF's: yes" in report
    assert report.count("| interp_transformer |") == 1 and "| with key/value cache |" in report


def test_bench_script_holds_the_t5_rows(tmp_path):
    """``bench.py --config tiny-t5`` gives the same two tables, titled by model, with HF's ids."""
    out = tmp_path / "report.md"
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "bench.py"),
        "--config",
        "tiny-t5",
        "--rounds",
        "1",
        "--out",
        str(out),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = out.read_text()
    assert "### tiny-t5: Forward pass, source (2, 12), target (2, 6)" in report
    assert "### tiny-t5: Greedy generation" in report and "ids equal to HF's: yes" in report
    assert "| interp_transformer |" in report and "| HF sdpa |" in report
    only_forward = subprocess.run(
        command + ["--sections", "forward,cache"], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert only_forward.returncode == 0, only_forward.stderr[-3000:]
    report = out.read_text()
    assert "Forward pass" in report and "Greedy generation" not in report

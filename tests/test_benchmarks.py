"""The benchmark script runs end to end (on a tiny model) and reports what it measured.

Timings are not asserted here (they belong to the benchmark's own report); what is
asserted is that every section ran, that the memory estimate equals what the caches
held, and that greedy generation produced Hugging Face's ids.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def table_rows(report: str, title_start: str) -> list[list[str]]:
    lines = report.split("### " + title_start, 1)[1].split("\n\n", 2)[1].splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:] if line.startswith("|")]


def test_bench_script_runs_every_section_on_a_tiny_model(tmp_path):
    out = tmp_path / "report.md"
    command = [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--config", "tiny", "--quick", "--rounds", "1", "--no-tl", "--out", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = out.read_text()
    for title in ("Forward pass", "run_with_cache", "Greedy generation", "from_pretrained", "Achieved GFLOP/s"):
        assert f"### {title}" in report
    forward = table_rows(report, "Forward pass")
    assert {row[1] for row in forward} == {"interp_transformer", "interp_transformer, shape checks off", "HF eager", "HF sdpa"}
    assert all(float(row[2]) > 0 for row in forward)
    cache = table_rows(report, "run_with_cache")
    assert {row[2] for row in cache} == {"nothing (forward)", "everything", "everything, bfloat16 storage", "attention patterns", "resid_post"}
    kept = [row for row in cache if row[2] != "nothing (forward)"]
    assert [row[6] for row in kept] == ["yes"] * len(kept), "the cache memory estimate missed what the cache held"
    assert "ids equal to HF's: yes" in report
    assert len(table_rows(report, "from_pretrained")) == 2

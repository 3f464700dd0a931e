"""The package type-checks: mypy, with pyproject.toml's [tool.mypy] settings, finds 0 errors in interp_transformer.

.ci/run runs the same command; this test keeps it true between CI runs. mypy over the package takes about a minute
from a cold cache (a few seconds warm), hence `slow`.
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_mypy(*targets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *targets], cwd=ROOT, capture_output=True, text=True, timeout=900
    )


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if re.search(r":\d+: error:", line)]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (it is in the dev extra: pip install -e '.[dev]')",
)
def test_the_package_has_no_type_errors():
    result = run_mypy("interp_transformer")
    errors = error_lines(result)
    assert result.returncode == 0 and not errors, (
        f"mypy found {len(errors)} errors:\n" + "\n".join(errors[:50]) + ("\n" + result.stderr if result.stderr else "")
    )


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_the_check_fails_on_a_known_bad_module(tmp_path):
    # the check can fail: the same settings find a wrong return type and an Optional used as a value
    bad = tmp_path / "bad_module.py"
    bad.write_text(
        "from typing import Optional\n\n\n"
        "def width(d_model: int) -> str:\n    return d_model\n\n\n"
        "def double(n: Optional[int]) -> int:\n    return n * 2\n"
    )
    result = run_mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad))
    errors = error_lines(result)
    assert result.returncode == 1 and len(errors) == 2, result.stdout

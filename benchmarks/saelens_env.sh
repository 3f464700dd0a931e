#!/usr/bin/env bash
# Build the separate virtual environment in which SAELens writes the parity
# fixtures of interp_transformer.sae (benchmarks/saelens_parity.py) and reads our
# harvest exports (benchmarks/saelens_worker.py, driven by tests/test_harvest.py).
#
# SAELens pins TransformerLens < 4, which pins typeguard 4; interp_transformer
# pins typeguard==2.13.3. The two cannot share an environment, so SAELens gets
# its own venv and is run as a separate program.
#
# Usage: benchmarks/saelens_env.sh [VENV_DIR]
#   VENV_DIR defaults to <repo>/.venv-saelens (git-ignored by the `.venv-*/` rule).
#   PYTHON selects the interpreter that creates the venv (default: python3).
#   SAELENS_VERSION selects the sae-lens release (default below).
#
# Idempotent: if VENV_DIR already holds torch 2.13.0 and that sae-lens release,
# nothing is installed and the versions are printed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${1:-$repo/.venv-saelens}"
python="${PYTHON:-python3}"
saelens_version="${SAELENS_VERSION:-6.54.12}"

# torch is always pinned in the same pip command as sae-lens: its open torch
# requirement would otherwise pull a multi-GB CUDA build instead of the CPU
# wheel that is on the machine's disk.
requirements=(
    "torch==2.13.0"
    "sae-lens==$saelens_version"
)

# Exit status 0 when the venv already has what the parity script needs.
check_installed() {
    [ -x "$venv/bin/python" ] || return 1
    SAELENS_VERSION="$saelens_version" "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md
import os
import sys

ok = (
    md.version("torch").split("+")[0] == "2.13.0"
    and md.version("sae-lens") == os.environ["SAELENS_VERSION"]
)
sys.exit(0 if ok else 1)
PY
}

print_versions() {
    "$venv/bin/python" - <<'PY'
import importlib.metadata as md
import sys

print(f"python            {sys.version.split()[0]}")
for name in ["torch", "sae-lens", "transformer-lens", "transformers", "typeguard", "safetensors"]:
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = "(not installed)"
    print(f"{name:<17} {version}")
PY
    echo "venv size         $(du -sh "$venv" | cut -f1)"
}

if check_installed; then
    echo "SAELens venv already set up at $venv"
    print_versions
    exit 0
fi

start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    echo "creating venv at $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet "${requirements[@]}"

if ! check_installed; then
    echo "error: $venv does not have torch 2.13.0 and sae-lens $saelens_version after installing;" \
         "pip resolved:" >&2
    print_versions >&2
    exit 1
fi
echo "SAELens venv ready at $venv in $(( $(date +%s) - start )) s"
print_versions

#!/usr/bin/env bash
# Build the separate virtual environment in which SAELens reads our exports
# (tests/test_harvest.py::test_saelens_activations_store_reads_the_export).
#
# SAELens pins TransformerLens, which needs typeguard>=4.2 and so cannot live
# beside interp_transformer's typeguard==2.13.3: it gets its own venv and is
# driven as a subprocess (benchmarks/saelens_worker.py).
#
# Usage: benchmarks/saelens_env.sh [VENV_DIR]
#   VENV_DIR defaults to <repo>/.venv-saelens (git-ignored by the `.venv-*/` rule),
#   where the test looks for it (or set INTERP_TRANSFORMER_SAELENS_PYTHON).
# torch is pinned in the same pip command: an open torch requirement would pull a CUDA build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${1:-$repo/.venv-saelens}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet "torch==2.13.0" "sae-lens>=6"
"$venv/bin/python" -c "import importlib.metadata as md; print('sae-lens', md.version('sae-lens'), 'datasets', md.version('datasets'), 'torch', md.version('torch'))"

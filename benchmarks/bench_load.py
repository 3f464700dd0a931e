"""Loading time and memory, each source in a fresh process, and the table of ``bench.py``'s load section.

Run as a script, it is the fresh process that loads one model and reports (JSON on
stdout) the load time and the peak resident memory above the baseline it had with
every library already imported (and, for the in-memory source, the HF model built):

    python benchmarks/bench_load.py --source "safetensors directory" --model gpt2-small --dir DIR
    python benchmarks/bench_load.py --source GGUF --model smollm2 --gguf smollm2-135m
    python benchmarks/bench_load.py --source "GGUF, Hugging Face" --model smollm2 --gguf smollm2-135m
    python benchmarks/bench_load.py --source GGUF --model gemma3-270m --gguf gemma3-270m

Sources: ``in-memory`` (our ``from_pretrained`` of a random-weight HF model built in
the process), ``safetensors directory`` (a ``save_pretrained`` directory of that
model), ``GGUF`` (our ``from_pretrained`` of a GGUF file or name, e.g.
``"smollm2-135m"``) and ``GGUF, Hugging Face`` (transformers' own
``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` of the same file,
timed beside ours for comparison).
"""

import argparse
import gc
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench_report import Table
from bench_sections import LOGITS_TOLERANCE
from bench_timing import meets
from hf_models import build_hf_model, model_spec, random_tokens, weights_nbytes

SOURCES = ("in-memory", "safetensors directory", "GGUF", "GGUF, Hugging Face")
TINY_FIELDS = {  # a one-layer model of each family, loaded first so that the baseline holds every import
    "gpt2": dict(n_layer=1, n_embd=8, n_head=2, vocab_size=50257, n_positions=8),
    "llama": dict(
        num_hidden_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=16,
        vocab_size=64,
        max_position_embeddings=8,
    ),
    **{
        family: dict(model_spec(name)[1], num_hidden_layers=1)
        for family, name in (("gpt_neox", "tiny-neox"), ("gemma2", "tiny-gemma2"), ("mixtral", "tiny-mixtral"))
    },
    "gemma3": dict(
        model_spec("gemma3-270m")[1],
        num_hidden_layers=1,
        vocab_size=64,
        hidden_size=8,
        head_dim=4,
        intermediate_size=16,
        sliding_window=4,
    ),
}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux: ``5`` into ``/proc/self/clear_refs`` resets VmHWM)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def gguf_file(gguf: str) -> Path:
    """The file a GGUF source names: a ``.gguf`` path or a name such as ``"smollm2-135m"``."""
    from interp_transformer.loading.gguf_source import gguf_path_of

    path = gguf_path_of(gguf)
    if path is None:
        raise ValueError(f"expected a .gguf file or a GGUF model name, received {gguf!r}")
    return path


def gguf_float32_nbytes(gguf: str) -> int:
    """float32 bytes of the checkpoint's weights (each tensor once, from the file's header; nothing is dequantized)."""
    from interp_transformer.loading.gguf import read_gguf

    shapes = read_gguf(gguf_file(gguf), load_tokenizer=False).state_dict.shapes()
    return 4 * sum(math.prod(shape) for shape in shapes.values())


def measure_loading(
    source: str, model: str, threads: int, seed: int, directory: str | None = None, gguf: str | None = None
) -> dict:
    """Run this file in a fresh interpreter for ``source`` (one of ``SOURCES``)."""
    command = [
        sys.executable,
        __file__,
        "--source",
        source,
        "--model",
        model,
        "--threads",
        str(threads),
        "--seed",
        str(seed),
    ]
    command += ["--dir", directory] if directory else []
    command += ["--gguf", gguf] if gguf else []
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"loading benchmark failed ({source}):\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def assert_same_model(model, hf_model) -> None:
    """The loaded model must compute the source model's logits (8 random tokens, within ``LOGITS_TOLERANCE``)."""
    tokens = random_tokens(1, 8, 0, hf_model.config.vocab_size)
    with torch.inference_mode():
        difference = float((model(tokens) - hf_model(tokens).logits).abs().max())
    if not difference <= LOGITS_TOLERANCE:
        raise RuntimeError(
            f"the loaded model's logits differ from the source model's by {difference:.3e} (expected at "
            f"most {LOGITS_TOLERANCE})"
        )


def _load(source: str, hf_model, directory: str | None, gguf: str | None):
    if source == "GGUF, Hugging Face":
        from transformers import AutoModelForCausalLM

        path = gguf_file(gguf)
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    from interp_transformer import from_pretrained

    return from_pretrained({"in-memory": hf_model, "safetensors directory": directory, "GGUF": gguf}[source])


def load_once(source: str, model: str, threads: int, seed: int, directory: str | None, gguf: str | None) -> dict:
    torch.set_num_threads(threads)
    family, config = model_spec(model)
    from interp_transformer import from_pretrained

    # warm every code path (imports, tokenizer files) on a tiny model, so the baseline holds them
    from_pretrained(build_hf_model(family, TINY_FIELDS[family], seed))
    if source.startswith("GGUF"):
        import gguf as _gguf_package  # noqa: F401  (transformers' GGUF reader)
        import tokenizers  # noqa: F401
        from transformers import AutoModelForCausalLM  # noqa: F401
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: F401
    # built here rather than read with from_pretrained, whose weights may stay file-backed
    # until touched: the in-memory source must really be in memory before the baseline
    hf_model = build_hf_model(family, config, seed) if source == "in-memory" else None
    gc.collect()
    window = _reset_peak_rss()
    baseline = _status_kib("VmRSS") * 1024
    start = time.perf_counter()
    loaded = _load(source, hf_model, directory, gguf)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM") * 1024 if window else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    loaded_bytes = (
        weights_nbytes(loaded)
        if source == "GGUF, Hugging Face"
        else sum(p.numel() * p.element_size() for p in loaded.parameters())
    )
    if source == "in-memory":
        assert_same_model(loaded, hf_model)
    return {
        "source": source,
        "seconds": seconds,
        "baseline": baseline,
        "peak": peak,
        "peak_above_baseline": peak - baseline,
        "model_bytes": loaded_bytes,
        "peak_window": "VmHWM reset before loading" if window else "ru_maxrss (process lifetime)",
    }


def bench_loading(model: str, hf_model, threads: int, seed: int, targets: dict, gguf: str | None) -> Table:
    """Every source of ``model`` in a fresh process: the GGUF ones when ``gguf`` names a file, the others always."""
    checkpoint = weights_nbytes(hf_model)
    table = Table(
        f"{model}: loading (a fresh process each; the float32 weights of the random HF model are "
        f"{checkpoint / 2**20:.0f} MiB)",
        [
            "source",
            "loader",
            "seconds",
            "peak RSS above baseline, MiB",
            "process peak RSS, MiB",
            "loaded weights, MiB",
            "peak x loaded weights",
            "peak x float32 checkpoint",
            "target",
        ],
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_load_") as directory:
        hf_model.save_pretrained(directory)
        for source, given in (("in-memory", None), ("safetensors directory", directory)):
            rows.append(
                (
                    source,
                    "interp_transformer.from_pretrained",
                    measure_loading(source, model, threads, seed, directory=given),
                    checkpoint,
                )
            )
    if gguf is not None:
        gguf_bytes = gguf_float32_nbytes(gguf)
        rows.append(
            (
                f"GGUF {gguf}",
                "interp_transformer.from_pretrained",
                measure_loading("GGUF", model, threads, seed, gguf=gguf),
                gguf_bytes,
            )
        )
        rows.append(
            (
                f"GGUF {gguf}",
                "transformers AutoModelForCausalLM (gguf_file=)",
                measure_loading("GGUF, Hugging Face", model, threads, seed, gguf=gguf),
                gguf_bytes,
            )
        )
    for source, loader, result, checkpoint_bytes in rows:
        peak, loaded = result["peak_above_baseline"], result["model_bytes"]
        if result["source"] == "GGUF":
            verdict = (
                f"<= {targets['gguf_seconds']} s: "
                f"{meets(result['seconds'], targets['gguf_seconds'], lower_is_better=True)}; "
                f"peak <= {targets['gguf_rss']}x float32: "
                f"{meets(peak / checkpoint_bytes, targets['gguf_rss'], lower_is_better=True)}"
            )
        elif result["source"] == "GGUF, Hugging Face":
            verdict = "(for comparison)"
        else:
            met = meets(peak / loaded, targets["load_rss"], lower_is_better=True)
            verdict = f"peak <= {targets['load_rss']}x loaded: {met}"
        table.add(
            source,
            loader,
            f"{result['seconds']:.2f}",
            f"{peak / 2**20:.0f}",
            f"{result['peak'] / 2**20:.0f}",
            f"{loaded / 2**20:.0f}",
            f"{peak / loaded:.2f}",
            f"{peak / checkpoint_bytes:.2f}",
            verdict,
        )
    if gguf is None:
        table.add("GGUF", "-", "-", "-", "-", "-", "-", "-", "not run (no GGUF file for this model)")
    return table


def _source_flag(source: str) -> str:
    """The option a source needs: a safetensors directory takes --dir, a GGUF source --gguf, the others neither."""
    if source == "safetensors directory":
        return "--dir"
    return "--gguf" if source.startswith("GGUF") else "neither --dir nor --gguf"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", choices=SOURCES, required=True)
    parser.add_argument("--model", required=True, help="the model's shape: a name of hf_models.HF_MODELS")
    parser.add_argument("--dir", default=None, help="a save_pretrained directory (safetensors directory)")
    parser.add_argument(
        "--gguf", default=None, help="a .gguf file or a GGUF model name such as smollm2-135m (GGUF sources)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the in-memory model (the directory holds the same)"
    )
    args = parser.parse_args()
    if (args.source == "safetensors directory") != (args.dir is not None) or args.source.startswith("GGUF") != (
        args.gguf is not None
    ):
        parser.error(f"--source {args.source!r} takes {_source_flag(args.source)}")
    print(json.dumps(load_once(args.source, args.model, args.threads, args.seed, args.dir, args.gguf)))

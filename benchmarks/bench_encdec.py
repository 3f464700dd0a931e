"""Speed of interp_transformer's encoder-decoder against Hugging Face, at the T5-small shape, in one run.

    python benchmarks/bench_encdec.py            # T5-small shape (60M parameters), about 5 minutes on 2 threads
    python benchmarks/bench_encdec.py --tiny     # a tiny T5, seconds (what tests/test_benchmarks_encdec.py runs)
    python benchmarks/bench.py --config t5-small # the same tables as rows of the main benchmark report

Random weights at T5-small's shape (6 + 6 blocks, d_model 512, 8 heads, d_ff 2048,
vocabulary 32128, v1.0: relu, tied and rescaled read-out), float32, ``--threads`` threads,
under ``torch.inference_mode()``. Interleaved A/B as in ``benchmarks/bench.py``: every
round runs each contender once, in an order shuffled per round, so a busy machine slows all alike;
medians over rounds, ratios within the run.

Rows: the forward pass (encoder and decoder, logits) on a ``--batch`` x ``--source``
source and a ``--target``-token target, ours against HF's eager and sdpa attention; greedy
generation of up to ``--new`` tokens, ours with and without the key/value cache
against HF ``generate`` (sdpa), and whether the ids are equal.
"""

import argparse
import copy
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_report import Table, markdown_report  # noqa: E402
from bench_timing import interleaved_medians, timed  # noqa: E402

T5_SMALL = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8)
TINY = dict(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4)


def build(shape: dict, seed: int):
    """``(ours, hf_eager, hf_sdpa)``: one random T5 as our model and as Hugging Face's with either attention."""
    import transformers

    from interp_transformer.loading import from_pretrained

    torch.manual_seed(seed)
    config = transformers.T5Config(**shape, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    hf_sdpa = transformers.T5ForConditionalGeneration(config).eval()
    hf_eager = copy.deepcopy(hf_sdpa)
    hf_eager.set_attn_implementation("eager")
    return from_pretrained(hf_sdpa), hf_eager, hf_sdpa


def bench_forward(ours, hf_eager, hf_sdpa, source, target, rounds, warmup) -> Table:
    def ours_run():
        ours(source, target)

    def hf_run(model):
        return lambda: model(input_ids=source, decoder_input_ids=target, use_cache=False)

    contenders = {
        "interp_transformer": timed(ours_run),
        "HF eager": timed(hf_run(hf_eager)),
        "HF sdpa": timed(hf_run(hf_sdpa)),
    }
    medians, _ = interleaved_medians(contenders, rounds, warmup, "T5 forward")
    table = Table(
        f"Forward pass, source {tuple(source.shape)}, target {tuple(target.shape)}",
        ["contender", "median ms", "x HF sdpa"],
    )
    for name, seconds in medians.items():
        table.add(name, f"{seconds * 1e3:.1f}", f"{seconds / medians['HF sdpa']:.2f}")
    return table


def bench_generate(ours, hf_sdpa, source, new_tokens, rounds, warmup) -> Table:
    outputs = {}

    def ours_run(use_kv_cache: bool):
        def run():
            outputs[f"ours {use_kv_cache}"] = ours.generate(
                source, max_new_tokens=new_tokens, use_kv_cache=use_kv_cache
            )

        return timed(run)

    def hf_run():
        outputs["hf"] = hf_sdpa.generate(source, max_new_tokens=new_tokens, do_sample=False)

    contenders = {
        "with key/value cache": ours_run(True),
        "without key/value cache": ours_run(False),
        "HF generate (sdpa)": timed(hf_run),
    }
    medians, _ = interleaved_medians(contenders, rounds, warmup, "T5 generate")
    same = all(torch.equal(outputs[name], outputs["hf"]) for name in ("ours True", "ours False"))
    table = Table(
        f"Greedy generation, up to {new_tokens} new tokens (ids equal to HF's: {'yes' if same else 'NO'})",
        ["contender", "median s", "x HF"],
    )
    for name, seconds in medians.items():
        table.add(name, f"{seconds:.3f}", f"{seconds / medians['HF generate (sdpa)']:.2f}")
    return table


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny T5 instead of the T5-small shape")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--source", type=int, default=64)
    parser.add_argument("--target", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    return parser.parse_args(argv)


def t5_tables(
    tiny: bool, batch: int, source_len: int, target_len: int, new_tokens: int, rounds: int, warmup: int, seed: int
) -> tuple[list[Table], dict[str, str]]:
    """The forward and generation tables of one random T5 (tiny or T5-small shape), and lines for a report header."""
    from interp_transformer import shape_checking

    shape = TINY if tiny else T5_SMALL
    with shape_checking(False):  # what a timed run uses; the tests keep checks on
        ours, hf_eager, hf_sdpa = build(shape, seed)
        generator = torch.Generator().manual_seed(seed)
        source = torch.randint(2, shape["vocab_size"], (batch, source_len), generator=generator)
        target = torch.cat(
            [
                torch.zeros(batch, 1, dtype=torch.long),
                torch.randint(2, shape["vocab_size"], (batch, target_len - 1), generator=generator),
            ],
            dim=1,
        )
        tables = [
            bench_forward(ours, hf_eager, hf_sdpa, source, target, rounds, warmup),
            bench_generate(ours, hf_sdpa, source[:1], new_tokens, rounds, warmup),
        ]
    context = {"shape": "tiny T5" if tiny else "T5-small (60.5M parameters)", "dtype": "float32, shape checks off"}
    return tables, context


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tables, context = t5_tables(
        args.tiny, args.batch, args.source, args.target, args.new, args.rounds, args.warmup, args.seed
    )
    context.update({"threads": str(args.threads), "rounds": str(args.rounds), "torch": torch.__version__})
    report = markdown_report(tables, context)
    print(report)
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``interp-transformer steer``: a steering vector from contrastive texts, swept over layers x strengths.

    interp-transformer steer --model SOURCE --positive TEXT... --negative TEXT... [--layers L...]
                             [--strengths S...] [--prompt TEXT...] [--neutral TEXT...] [--prefix TEXT]
                             [--targets WORD...] [--similarity] [--max-new-tokens N] [--threads N] [--out FILE]

At each layer the vector is the difference of the mean residual stream (``--site``, default
``resid_post``) at the last token (``--read mean``: averaged over the tokens) of the positive texts
and of the negative ones. Each prompt is
continued greedily with the vector added at every position, at each strength, and the page shows
the concept score (the ``--targets`` tokens' log-probability; with ``--similarity``, MiniLM's
similarity of the text to the positive texts minus the negative ones), the fluency (the unsteered
model's perplexity of the text) and the side effects (KL on ``--neutral`` prompts), beside the
prompt-only baseline (``--prefix`` before each prompt, default: the positive texts as examples).
"""

import argparse
from pathlib import Path

import torch

from .. import _checks
from . import options
from .common import EXIT_OK, UserError, load_model, positive_int

DEFAULT_OUT = "interp_transformer_steering.html"
DEFAULT_PROMPTS = ("I think the movie was", "Today at work, my boss", "The weather this weekend", "My neighbour is")
DEFAULT_NEUTRAL = (
    "The capital of France is",
    "Water boils at a temperature of",
    "The first president of the United States was",
)
SITES = ("resid_pre", "resid_mid", "resid_post")


def _layers(model, layers) -> list[int]:
    if layers is None:
        n = model.cfg.n_layers
        return sorted({n // 4, n // 2, (3 * n) // 4})
    return _checks.layer_list(model, layers)


def _targets(model, words) -> list[int]:
    if not words:
        return []
    if model.tokenizer is None:
        ids = [int(w) for w in words if w.strip().isdigit()]
        if len(ids) != len(words):
            raise UserError(f"{model.cfg.name} has no tokenizer: --targets must be token ids, got {words}")
        return ids
    from interp_transformer.text.tokens import single_token_id

    return [single_token_id(model.tokenizer, word) for word in words]


def _texts(model, texts: list[str], what: str) -> list:
    """Texts, or token ids separated by spaces for a model without a tokenizer."""
    if model.tokenizer is not None:
        return list(texts)
    from .common import prompt_tokens

    return [prompt_tokens(model, text)[0] for text in texts]


def cmd_steer(args: argparse.Namespace) -> int:
    from ..steering import difference_of_means, minilm_concept_scorer, steering_sweep
    from ..steering.page import sweep_report

    for what in ("positive", "negative", "prompt", "neutral"):
        for text in getattr(args, what) or ():
            if not text.strip():
                raise UserError(f"a --{what} text is empty: every text needs at least one token")
    if args.prefix is not None and not args.prefix.strip():
        raise UserError("--prefix is empty: give a prefix that asks for the concept, or omit it")
    model, metadata = load_model(args.model, torch.float32, None)
    layers = _layers(model, args.layers)
    site = args.site
    positive, negative = _texts(model, args.positive, "positive"), _texts(model, args.negative, "negative")
    prompts = _texts(model, args.prompt or list(DEFAULT_PROMPTS), "prompt")
    neutral = _texts(model, args.neutral or list(DEFAULT_NEUTRAL), "neutral")
    if args.prefix is not None:
        prefix = args.prefix if model.tokenizer is not None else _texts(model, [args.prefix], "prefix")[0]
    elif model.tokenizer is not None:
        prefix = " ".join(args.positive) + "\n"
    else:
        raise UserError(f"{model.cfg.name} has no tokenizer: give --prefix as token ids")
    targets = _targets(model, args.targets)
    scorer = minilm_concept_scorer(args.positive, args.negative) if args.similarity else None
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        vectors = [
            difference_of_means(model, positive, negative, model.act_name(site, layer), read=args.read)
            for layer in layers
        ]
    finally:
        torch.set_num_threads(threads)
    for layer, vector in zip(layers, vectors):
        print(f"layer {layer}: {vector.hook}, |vector| = {vector.norm:.3g}")
    sweep = steering_sweep(
        model, vectors, args.strengths, prompts, neutral, prefix, targets or None,
        max_new_tokens=args.max_new_tokens, similarity=scorer, threads=args.threads,
    )  # fmt: skip
    settings = {
        "model": metadata.get("source", args.model),
        "vector": f"difference of means ({'last token' if args.read == 'last' else 'mean over tokens'}), {site}",
        "positive": args.positive,
        "negative": args.negative,
        "prompts": prompts if model.tokenizer is not None else len(prompts),
        "neutral": neutral if model.tokenizer is not None else len(neutral),
    }
    report = sweep_report(sweep, f"{args.model}: steering sweep", settings)
    for line in report.summary:
        print(line)
    print(f"wrote {report.save(args.out)}")
    return EXIT_OK


def add_steer_parser(commands) -> None:
    summary = "steer with a vector from contrastive texts; sweep layers x strengths beside a prompt baseline"
    steer = options.add_command(commands, "steer", cmd_steer, summary, __doc__, verbatim=True, model=True)
    steer.add_argument("--positive", required=True, nargs="+", metavar="TEXT", help="texts with the concept")
    steer.add_argument("--negative", required=True, nargs="+", metavar="TEXT", help="texts with its opposite")
    steer.add_argument(
        "--layers", type=int, nargs="+", metavar="L", help="layers to steer at (default: n/4, n/2, 3n/4)"
    )
    steer.add_argument(
        "--strengths", type=float, nargs="+", default=[2.0, 4.0, 8.0], metavar="S",
        help="multiples of the vector to add, finite (default: 2 4 8)",
    )  # fmt: skip
    steer.add_argument("--site", choices=SITES, default="resid_post", help="the residual hook (default: resid_post)")
    steer.add_argument(
        "--read", choices=("last", "mean"), default="last",
        help="read each contrast text at its last token or averaged over its tokens (default: last)",
    )  # fmt: skip
    steer.add_argument("--prompt", nargs="+", metavar="TEXT", help="prompts to continue (default: four everyday ones)")
    steer.add_argument("--neutral", nargs="+", metavar="TEXT", help="prompts for the side-effect KL (default: facts)")
    steer.add_argument("--prefix", metavar="TEXT", help="the baseline's prefix (default: the positive texts)")
    steer.add_argument("--targets", nargs="+", metavar="WORD", help="single-token words of the concept (log-prob)")
    steer.add_argument("--similarity", action="store_true", help="score the text with all-MiniLM-L6-v2 too")
    steer.add_argument("--max-new-tokens", type=positive_int, default=16, metavar="N", help="(default: 16)")
    options.add_threads_option(steer, "torch threads (default: torch's)")
    steer.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), metavar="FILE", help="the HTML page")


__all__ = ["add_steer_parser", "cmd_steer"]

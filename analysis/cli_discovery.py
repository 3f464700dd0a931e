"""``interp-transformer patch``: which sites carry the difference between a clean and a corrupted prompt.

    interp-transformer patch --model SOURCE --clean TEXT --corrupted TEXT --answer TOKEN --wrong TOKEN
                             [--component heads] [--each-position] [--method patch|atp|eap|eap-ig] [--out FILE]

The metric is ``logit(answer) - logit(wrong)`` at the last position. ``--method patch`` patches
each site clean into the corrupted run (many sites per forward, ``analysis.discovery.patch_sites``);
``--method atp`` estimates every site at once from one forward and one backward pass
(attribution patching); ``--method eap`` / ``eap-ig`` scores every edge between the input, the
heads and MLPs and their readers instead. It prints the clean and corrupted metrics and what
moves the metric most, and writes the figure as a self-contained HTML file.
"""

import argparse
from pathlib import Path

import torch

from .cli_common import EXIT_OK, UserError, load_model, prompt_tokens
from .discovery import (
    COMPONENTS,
    attribution_patching,
    edge_attribution_patching,
    logit_diff_per_row,
    patch_sites,
    patching_figure,
    sites,
)

DEFAULT_OUT = "interp_transformer_patching.html"


def _token_id(model, text: str, what: str) -> int:
    if model.tokenizer is None:
        if not text.strip().isdigit() or not 0 <= int(text) < model.cfg.d_vocab:
            raise UserError(
                f"{model.cfg.name} has no tokenizer: --{what} must be a token id in [0, {model.cfg.d_vocab})"
            )
        return int(text)
    from interp_transformer.text.tokens import single_token_id

    return single_token_id(model.tokenizer, text)


def cmd_patch(args: argparse.Namespace) -> int:
    model, _ = load_model(args.model, torch.float32, None)
    clean, corrupted = prompt_tokens(model, args.clean), prompt_tokens(model, args.corrupted)
    if clean.shape != corrupted.shape:
        raise UserError(
            f"the clean prompt is {clean.shape[1]} tokens and the corrupted one {corrupted.shape[1]}: positions must "
            "line up, so both must have the same token length"
        )
    answer, wrong = _token_id(model, args.answer, "answer"), _token_id(model, args.wrong, "wrong")
    metric = logit_diff_per_row(answer, wrong)
    prompt = torch.arange(1)
    with torch.no_grad():
        clean_value = float(metric(model(clean), prompt)[0])
        corrupted_value = float(metric(model(corrupted), prompt)[0])
    print(f"logit({args.answer!r}) - logit({args.wrong!r}): clean {clean_value:+.3f}, corrupted {corrupted_value:+.3f}")
    if args.method in ("eap", "eap-ig"):
        return _edges(model, clean, corrupted, metric, args)
    chosen = sites(model, args.component, positions="each" if args.each_position else None, n_pos=clean.shape[1])
    if args.method == "patch":
        effect = patch_sites(model, clean, corrupted, metric, chosen) - corrupted_value
    else:
        effect = attribution_patching(model, clean, corrupted, metric, chosen)
    order = effect[:, 0].abs().argsort(descending=True)[: args.top]
    print(f"sites that move it most ({args.method}: change from the corrupted run):")
    for index in order.tolist():
        print(f"  {chosen[index].label:>24}  {float(effect[index, 0]):+.3f}")
    what = "patched clean" if args.method == "patch" else "attribution patching (first order)"
    fig = patching_figure(effect, chosen, title=f"{args.model}: change of the logit difference, {what}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(args.out), include_plotlyjs=True, full_html=True)  # plotly.js inline: opens offline
    print(f"wrote {args.out}")
    return EXIT_OK


def _edges(model, clean, corrupted, metric, args: argparse.Namespace) -> int:
    method = "EAP" if args.method == "eap" else "EAP-IG"
    edges = edge_attribution_patching(model, clean, corrupted, metric, method=method, steps=args.steps)
    print(f"edges that move it most ({method}, first order):")
    for upstream, reader, score in edges.top(args.top):
        print(f"  {upstream:>8} -> {reader:<10}  {score:+.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    edges.figure(max(args.top, 10)).write_html(str(args.out), include_plotlyjs=True, full_html=True)
    print(f"wrote {args.out}")
    return EXIT_OK


def add_patch_parser(commands) -> None:
    patch = commands.add_parser(
        "patch",
        help="find the sites that carry the difference between a clean and a corrupted prompt",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    patch.add_argument("--model", required=True, metavar="SOURCE", help="a shipped model, model directory or hub name")
    patch.add_argument(
        "--clean", required=True, metavar="TEXT", help="the clean prompt (token ids without a tokenizer)"
    )
    patch.add_argument("--corrupted", required=True, metavar="TEXT", help="the corrupted prompt, of the same length")
    patch.add_argument("--answer", required=True, metavar="TOKEN", help="the token the clean prompt predicts")
    patch.add_argument("--wrong", required=True, metavar="TOKEN", help="the token the corrupted prompt predicts")
    patch.add_argument("--component", choices=COMPONENTS, default="heads", help="what to patch (default: heads)")
    patch.add_argument("--each-position", action="store_true", help="one site per position (default: all at once)")
    patch.add_argument(
        "--method",
        choices=("patch", "atp", "eap", "eap-ig"),
        default="patch",
        help="patch sites, estimate them (AtP), or score every edge (EAP, EAP-IG) (default: patch)",
    )
    patch.add_argument("--steps", type=int, default=5, metavar="N", help="EAP-IG's interpolations (default: 5)")
    patch.add_argument("--top", type=int, default=10, metavar="N", help="how many sites to print (default: 10)")
    patch.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), metavar="FILE", help="the HTML figure")
    patch.set_defaults(run=cmd_patch)


__all__ = ["add_patch_parser", "cmd_patch"]

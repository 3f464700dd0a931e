"""The command line's attribution-graph commands: ``train-transcoders`` (a set of transcoders for a model) and
``graph`` (one prompt's attribution graph: its top features, scores, Neuronpedia JSON and HTML view, and
feature ablations or steering followed by generation)."""

import argparse
import itertools
import sys
from pathlib import Path

import torch

from . import options
from .common import EXIT_OK, UserError, load_model, positive_int, prompt_tokens


def _folded(source: str):
    """The model, with ``fold_ln`` applied (what transcoders reading an MLP's input are trained and read on)."""
    from interp_transformer.models.processing import fold_ln

    model, _ = load_model(source)
    return fold_ln(model)


def cmd_train_transcoders(args: argparse.Namespace) -> int:
    """Harvest every layer's MLP input and output over a corpus (default: the Python language reference that the
    standard library ships), train one TopK transcoder per layer or a cross-layer transcoder, and report, on held-out
    contexts, variance explained, L0, dead features and the CE loss with every MLP replaced. fold_ln is applied to the
    model first."""
    from ..attribution_graphs.training import TranscoderTrainingConfig, reference_corpus, train_transcoders

    config = options.config_from(args, TranscoderTrainingConfig)
    source = options.read_corpus(args) if args.corpus else reference_corpus()
    model = _folded(args.model)
    kind = "a cross-layer transcoder" if config.cross_layer else "one transcoder per layer"
    print(f"training {kind} on {args.model}: {config}", file=sys.stderr)
    trained = train_transcoders(model, source, config, progress=not args.no_progress)
    lines = [
        f"held out ({trained.n_eval} positions): {trained.metrics.summary()}",
        f"trained on {trained.n_train} positions of {trained.corpus} in {trained.seconds:.0f} s",
    ]
    return options.report_saved(trained, args.out, lines, "load it with analysis.attribution_graphs.load_transcoders")


def add_train_transcoders_parser(commands) -> None:
    """Mount ``interp-transformer train-transcoders``."""
    from ..attribution_graphs.training import TranscoderTrainingConfig

    default = TranscoderTrainingConfig()
    summary = "train TopK transcoders (or a cross-layer transcoder) on every MLP of a model"
    train = options.add_command(
        commands, "train-transcoders", cmd_train_transcoders, summary, model="e.g. smollm2-135m"
    )
    train.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to save the transcoders")
    options.add_corpus_option(
        train,
        ".txt files (one document each) or .jsonl files (one document per line), all of one kind (default: the Python "
        "language reference)",
    )
    options.add_text_field_option(train)
    train.add_argument("--cross-layer", action="store_true", default=None, help="train a cross-layer transcoder")
    train.add_argument("--reads", choices=("input", "stream"), help=f"default: {default.reads}")
    for name, help_text in (
        ("d_transcoder", "features per layer"),
        ("k", "features active per position and layer"),
        ("max_tokens", "positions harvested, held-out ones included"),
        ("context_length", "tokens per context"),
        ("epochs", "passes over the training positions"),
        ("batch_size", "positions per step"),
        ("eval_every", "hold out every N-th context"),
    ):
        option = "--" + name.replace("_", "-")
        train.add_argument(option, type=positive_int, help=f"{help_text} (default: {getattr(default, name)})")
    train.add_argument("--lr", type=float, help=f"Adam's learning rate (default: {default.lr})")
    train.add_argument("--seed", type=int, help=f"default: {default.seed}")
    options.add_progress_option(train)


def cmd_graph(args: argparse.Namespace) -> int:
    """Attribute the model's next-token prediction on PROMPT to transcoder features, errors and tokens: print the
    candidates, the strongest inputs and the replacement and completeness scores; write the graph as an offline HTML
    view (--out) and as Neuronpedia's JSON (--json); with --ablate/--steer, generate with and without the feature
    edits."""
    from ..attribution_graphs import attribute, graph_scores, graph_view, load_transcoders, prune_graph, to_neuronpedia
    from ..attribution_graphs.interventions import check_feature_edits, generate_with_edits, parse_feature_edit

    if args.dashboard_contexts < 0:
        raise UserError(f"--dashboard-contexts must be 0 or more, got {args.dashboard_contexts}")
    edits = [parse_feature_edit(text) for text in args.ablate or []]
    edits += [parse_feature_edit(text, steer=True) for text in args.steer or []]
    if args.transcoders is None:
        raise UserError(
            "--transcoders DIR is needed: train a set with `interp-transformer train-transcoders --model "
            f"{args.model} --out DIR`"
        )
    model = _folded(args.model)
    transcoders = load_transcoders(args.transcoders)
    tokens = prompt_tokens(model, args.prompt)[0]
    # checked against the transcoders and the prompt before the graph is computed: an edit past the prompt or of a
    # feature the transcoders lack would otherwise change nothing
    edits = check_feature_edits(model, transcoders, edits, tokens.shape[-1])
    graph = attribute(
        model, transcoders, tokens, batch_size=args.batch_size, memory_budget=args.memory_budget, progress=True
    )
    print(f"{graph.n_features} active features, {graph.n_nodes} nodes; next-token candidates:")
    for token, probability in zip(graph.logit_str_tokens or graph.logit_tokens.tolist(), graph.logit_probabilities):
        print(f"  {token!r}: p = {float(probability):.3f}")
    top = graph.logits.start
    strongest = graph.adjacency_matrix[top].abs().argsort(descending=True)[: args.top]
    print(f"strongest direct inputs of {graph.label(top)}:")
    for node in strongest.tolist():
        print(f"  {graph.label(node):<24} {float(graph.adjacency_matrix[top, node]):+.3f}")
    scores = graph_scores(graph)
    pruned = prune_graph(graph, args.node_threshold, args.edge_threshold)
    print(
        f"replacement score {scores.replacement:.3f}, completeness {scores.completeness:.3f}; pruned to "
        f"{int(pruned.node_mask.sum())} nodes and {int(pruned.edge_mask.sum())} edges"
    )
    if args.json is not None:
        to_neuronpedia(graph, slug=args.json.stem, node_threshold=args.node_threshold).save(args.json)
        print(f"wrote {args.json} (Neuronpedia's graph JSON)")
    if args.out is not None:
        info = _dashboards(model, transcoders, graph, pruned, args.dashboard_contexts)
        graph_view(graph, pruned=pruned, feature_info=info, model_name=args.model, prompt=args.prompt).save(args.out)
        print(f"wrote {args.out}")
    if edits:
        # both continue the very ids the graph and the edits' positions were read on (text would be tokenized
        # again, with generate's own BOS rule, and could shift every position by one)
        before = model.generate(tokens, max_new_tokens=args.max_new_tokens, temperature=0.0)
        after = generate_with_edits(model, transcoders, tokens, edits, max_new_tokens=args.max_new_tokens)
        if model.tokenizer is not None:
            before, after = (args.prompt + model.to_string(ids[tokens.shape[-1] :]) for ids in (before, after))
        else:
            before, after = before.tolist(), after.tolist()
        print(f"without edits: {before!r}")
        print(f"with {len(edits)} edit(s): {after!r}")
    return EXIT_OK


def _dashboards(model, transcoders, graph, pruned, n_contexts: int):
    """The kept features' top activations over the first ``n_contexts`` contexts of the reference corpus, and their
    logit effects (None with ``n_contexts`` 0)."""
    from interp_transformer.sae.data import token_batches

    from ..attribution_graphs import feature_info_from, reference_corpus

    if n_contexts == 0:
        return None
    batches = token_batches(model, reference_corpus(), batch_size=16, context_length=min(model.cfg.n_ctx, 128))
    first = list(itertools.islice((row for batch in batches for row in batch), n_contexts))
    return feature_info_from(model, transcoders, graph, torch.stack(first), pruned=pruned)


def add_graph_parser(commands) -> None:
    """Mount ``interp-transformer graph``."""
    graph = options.add_command(
        commands,
        "graph",
        cmd_graph,
        "the attribution graph of one prompt over a set of transcoders",
        model="e.g. smollm2-135m",
    )
    graph.add_argument("--prompt", required=True, help="the prompt whose next token is explained")
    graph.add_argument("--transcoders", type=Path, metavar="DIR", help="a folder written by train-transcoders")
    graph.add_argument("--out", type=Path, metavar="FILE", help="the HTML view to write")
    graph.add_argument("--json", type=Path, metavar="FILE", help="Neuronpedia's graph JSON to write")
    graph.add_argument("--batch-size", type=positive_int, default=32, help="targets per backward pass (default: 32)")
    graph.add_argument("--memory-budget", type=positive_int, metavar="BYTES", help="refuse a larger planned peak")
    graph.add_argument("--node-threshold", type=float, default=0.8, help="pruning (default: 0.8)")
    graph.add_argument("--edge-threshold", type=float, default=0.98, help="pruning (default: 0.98)")
    graph.add_argument("--top", type=positive_int, default=10, help="inputs of the top logit to print (default: 10)")
    graph.add_argument(
        "--ablate",
        nargs="+",
        metavar="L<l>:F<f>[@<pos>]",
        help="features to ablate before generating again (a position < 0 counts from the prompt's end)",
    )
    graph.add_argument("--steer", nargs="+", metavar="L<l>:F<f>[@<pos>]=<value>", help="features to set (finite)")
    graph.add_argument("--max-new-tokens", type=positive_int, default=10, help="default: 10")
    graph.add_argument(
        "--dashboard-contexts",
        type=int,
        default=64,
        metavar="N",
        help="contexts of the reference corpus whose top activations the view shows per feature (0: none; default 64)",
    )


def add_graph_parsers(commands) -> None:
    add_train_transcoders_parser(commands)
    add_graph_parser(commands)


__all__ = ["add_graph_parsers", "cmd_graph", "cmd_train_transcoders"]

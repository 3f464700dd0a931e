"""Attribution graphs on a real model with trained transcoders: one prompt read closely, ten scored.

    interp-transformer train-transcoders --model smollm2-135m --out smollm2-transcoders   # about 33 minutes, 2 cores
    python benchmarks/real_model_circuits.py --transcoders smollm2-transcoders [--out results.json]
    interp-transformer train-transcoders --model gemma3-270m --out gemma3-transcoders
    python benchmarks/real_model_circuits.py --model gemma3-270m --transcoders gemma3-transcoders

1. "The capital of France is" (or ``--prompt``): the graph (every active feature a node), pruned; the kept
   features of most influence on the logits, each with its top activations over the reference corpus and its
   logit effects (the view's dashboards, ``feature_info_from``), and where the top logit's input comes from.
2. Two ablations in the running model (``edit_features``: errors kept, everything downstream recomputed): the
   ``--ablate`` kept features with the largest direct effect on the top logit, and every feature at the
   subject's position (' France', or ``--subject``). For each, the graph's prediction of every logit node's
   change (its direct effects, exact in the replacement model, where features do not recompute, and checked
   there), beside the model's change and its answer before and after.
3. Ten prompts (factual recall, two-hop recall, sequences, indirect objects, code): each graph's replacement
   and completeness scores, and whether the model gets the answer, with the transcoders' quality
   (``training.json``).
"""

import argparse
import json
import time
from pathlib import Path

import torch

from analysis.attribution_graphs import (
    FeatureEdit,
    ReplacementModel,
    attribute,
    edit_features,
    feature_info_from,
    graph_scores,
    load_transcoders,
    node_influence,
    prune_graph,
    reference_corpus,
    training_record,
)
from interp_transformer import from_pretrained
from interp_transformer.models.processing import fold_ln
from interp_transformer.sae.data import token_batches

PROMPT = "The capital of France is"
PROMPTS = [
    ("The capital of France is", " Paris"),
    ("The capital of Germany is", " Berlin"),
    ("The Eiffel Tower is in the city of", " Paris"),
    ("The capital of the country where the Colosseum stands is", " Rome"),
    ("The opposite of hot is", " cold"),
    ("Monday, Tuesday, Wednesday,", " Thursday"),
    ("one, two, three, four,", " five"),
    ("When Mary and John went to the store, John gave a drink to", " Mary"),
    ("The sun rises in the", " east"),
    ("def add(a, b):\n    return a +", " b"),
]


def logit_value(model, transcoders, tokens, token_id: int, edits=()) -> tuple[float, list[tuple[str, float]]]:
    """``logit - mean logit`` of ``token_id`` at the last position, and the three likeliest next tokens."""
    with torch.no_grad(), edit_features(model, transcoders, edits):
        logits = model(tokens)[0, -1]
    probs = logits.softmax(-1)
    top = probs.topk(3)
    named = [(model.to_string(i[None]), round(float(p), 3)) for p, i in zip(top.values, top.indices)]
    return float(logits[token_id] - logits.mean()), named


def ablation(model, transcoders, graph, nodes: list[int]) -> dict:
    """Features ``nodes`` set to 0 at their positions: the graph's prediction of every logit node's change (the
    direct effects: exact in the replacement model, whose features do not recompute), checked against the
    replacement model, beside the running model's change (everything downstream recomputed, errors kept)."""
    edits = []
    for node in nodes:
        layer, pos, feature = graph.active_features[node].tolist()
        edits.append(FeatureEdit(layer, feature, scale=0.0, positions=(pos,)))
    predicted = -graph.adjacency_matrix[graph.logits, :][:, nodes].sum(1)  # each logit node's change
    replacement = ReplacementModel(model, transcoders, graph.tokens)
    full, removed = replacement.run(), replacement.run_without(graph, [nodes])

    def demeaned(run):
        return run.uncapped[0, graph.logit_tokens] - run.uncapped[0].mean()

    replacement_change = demeaned(removed) - demeaned(full)
    top_token = int(graph.logit_tokens[0])
    before, top_before = logit_value(model, transcoders, graph.tokens[None], top_token)
    after, top_after = logit_value(model, transcoders, graph.tokens[None], top_token, edits)
    new_values = graph.logit_values + predicted
    return {
        "features": [graph.label(node) for node in nodes],
        "predicted_change_of_top_logit": round(float(predicted[0]), 3),
        "replacement_model_change": round(float(replacement_change[0]), 3),
        "gap_prediction_vs_replacement_all_logits": float((predicted - replacement_change).abs().max()),
        "model_change": round(after - before, 3),
        "predicted_top_after": graph.logit_str_tokens[int(new_values.argmax())],
        "before": top_before,
        "after": top_after,
    }


def study(model, transcoders, graph, n_ablate: int, n_contexts: int, subject: str | None = None) -> dict:
    """Sections 1 and 2 of the module docstring; ``subject`` is the token whose features the second ablation removes
    (its last occurrence; default: the token before the last, ' France' in the default prompt)."""
    pruned = prune_graph(graph)
    influence = node_influence(graph)
    features = torch.arange(graph.n_features)
    kept = features[pruned.node_mask[: graph.n_features]]
    by_influence = kept[influence[kept].argsort(descending=True)]
    direct = graph.adjacency_matrix[graph.logits.start, : graph.n_features]
    by_direct = kept[direct[kept].argsort(descending=True)]  # the kept features that raise the top logit most
    batches = token_batches(model, reference_corpus(), batch_size=16, context_length=128)
    contexts = torch.cat(list(batches))[:n_contexts]
    info = feature_info_from(model, transcoders, graph, contexts, pruned=pruned, k=3, n_logits=5)
    top_features = []
    for node in by_influence[:12].tolist():
        layer, pos, feature = graph.active_features[node].tolist()
        page = info[(layer, feature)]
        top_features.append(
            {
                "node": graph.label(node),
                "token": graph.str_tokens[pos],
                "activation": round(float(graph.activation_values[node]), 3),
                "influence": round(float(influence[node]), 4),
                "direct_edge_to_top_logit": round(float(direct[node]), 3),
                "top_activations": page["top_activations"],
                "top_logits": page["top_logits"],
            }
        )
    if subject is None:
        subject = len(graph.str_tokens) - 2
    elif subject in graph.str_tokens:
        subject = len(graph.str_tokens) - 1 - graph.str_tokens[::-1].index(subject)
    else:
        raise ValueError(f"--subject {subject!r} is not a token of the prompt: {graph.str_tokens}")
    at_subject = features[graph.active_features[:, 1] == subject].tolist()
    errors = graph.adjacency_matrix[graph.logits.start, graph.errors]
    return {
        "prompt": graph.prompt,
        "graph": {"nodes": graph.n_nodes, "features": graph.n_features, "targets": graph.n_features + graph.n_logits},
        "pruned": {"nodes": int(pruned.node_mask.sum()), "edges": int(pruned.edge_mask.sum())},
        "top_logit": graph.logit_str_tokens[0],
        "top_logit_inputs": {
            "features": round(float(direct.sum()), 3),
            "errors": round(float(errors.sum()), 3),
            "tokens": round(float(graph.adjacency_matrix[graph.logits.start, graph.token_nodes].sum()), 3),
            "bias": round(float(graph.bias[graph.logits.start]), 3),
            "value": round(float(graph.logit_values[0]), 3),
        },
        "top_features": top_features,
        "ablate_top_direct": ablation(model, transcoders, graph, by_direct[:n_ablate].tolist()),
        "ablate_subject_position": {
            "token": graph.str_tokens[subject],
            **ablation(model, transcoders, graph, at_subject),
        },
    }


def scores(model, transcoders, batch_size: int) -> list[dict]:
    """Section 3 of the module docstring."""
    rows = []
    for prompt, answer in PROMPTS:
        tokens = model.to_tokens(prompt)[0]
        start = time.perf_counter()
        graph = attribute(model, transcoders, tokens, batch_size=batch_size)
        result = graph_scores(graph)
        rows.append(
            {
                "prompt": prompt,
                "answer": answer,
                "top": graph.logit_str_tokens[0],
                "p_top": round(float(graph.logit_probabilities[0]), 3),
                "features": graph.n_features,
                "replacement": round(result.replacement, 3),
                "completeness": round(result.completeness, 3),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, gemma3-270m or any source")
    parser.add_argument("--transcoders", type=Path, required=True, help="trained on --model")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--prompt", default=PROMPT, help="the prompt read closely (sections 1 and 2)")
    parser.add_argument("--subject", help="its token whose features are ablated (default: the one before the last)")
    parser.add_argument("--ablate", type=int, default=8, help="features of the top path to ablate")
    parser.add_argument("--contexts", type=int, default=256, help="reference-corpus contexts for the dashboards")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-scores", action="store_true", help="only the close reading (sections 1 and 2)")
    args = parser.parse_args()
    model = fold_ln(from_pretrained(args.model))
    transcoders = load_transcoders(args.transcoders)
    record = training_record(args.transcoders)
    start = time.perf_counter()
    graph = attribute(model, transcoders, model.to_tokens(args.prompt)[0], batch_size=args.batch_size)
    print(f"graph of {args.prompt!r} in {time.perf_counter() - start:.1f} s", flush=True)
    close_reading = study(model, transcoders, graph, args.ablate, args.contexts, args.subject)
    result = {"transcoders": record, "study": close_reading}
    print(json.dumps(result["study"], indent=1, ensure_ascii=False), flush=True)
    if not args.no_scores:
        result["scores"] = scores(model, transcoders, args.batch_size)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

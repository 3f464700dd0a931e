"""The report's written interpretation: sentences generated from the numbers of the other sections.

What it says depends on which sections the model's capabilities gave: the loss on
repeated tokens and the prediction at the last position need next-token logits; the
sentence embedding's split needs the output attribution; whatever was left out is named.

Thresholds (a head is named only when its score reaches them):

- ``HEAD_SCORE_THRESHOLD = 0.4``: a detector score is the mean fraction of a head's
  attention that lands on the detector's target, on repeated random tokens. A head
  that spread its attention uniformly over ~20 keys would score ~0.05, so 0.4 means
  the head puts most of its attention on one of ~20 candidate keys, every time.
- ``COPYING_THRESHOLD = 0.5``: copying score of the full OV circuit, ``sum Re(l) / sum |l|``
  over its eigenvalues ``l``; 0.5 means positive eigenvalues clearly dominate (the head
  raises the logits of the tokens it attends to). A random head scores near 0.
- ``IN_CONTEXT_RATIO = 0.5``: the model is said to use in-context copies when its loss on
  the repeated half of random sequences is below half its loss on the first half.

An encoder-decoder's interpretation reads its own sections (translation, alignment, source
patching). ``ALIGNED_THRESHOLD = 0.5``: a cross-attention head is said to follow the alignment
when at least half its attention lands on the aligned source word on average (a head spreading
its attention over a 10-word source scores about 0.1).
"""

from dataclasses import dataclass

from ..context import ReportContext, ReportSection, SectionData, head_name, ranked_heads
from .detectors import DETECTOR_TITLES

HEAD_SCORE_THRESHOLD = 0.4
COPYING_THRESHOLD = 0.5
IN_CONTEXT_RATIO = 0.5
MAX_NAMED_HEADS = 5  # per detector, so a large model's summary stays short


def classify_heads(scores: dict, threshold: float = HEAD_SCORE_THRESHOLD) -> dict[str, list[tuple[int, int, float]]]:
    """For each detector that ran (``scores[name]`` not None), the heads scoring at least ``threshold``, highest first.

    Entries are ``(layer, head, score)``.
    """
    return {
        name: [entry for entry in ranked_heads(values) if entry[2] >= threshold]
        for name, values in scores.items()
        if values is not None
    }


def detector_lines(scores: dict, heads: dict) -> list[str]:
    """One sentence per named head (at most ``MAX_NAMED_HEADS`` per detector), or the best score when none qualifies."""
    lines: list[str] = []
    for name, found in heads.items():
        kind = DETECTOR_TITLES[name]
        for layer, head, score in found[:MAX_NAMED_HEADS]:
            lines.append(
                f"{head_name(layer, head)} is a{'n' if kind[0] in 'aeiou' else ''} {kind} head: score {score:.2f}"
            )
        if len(found) > MAX_NAMED_HEADS:
            lines.append(f"... and {len(found) - MAX_NAMED_HEADS} more {kind} heads above {HEAD_SCORE_THRESHOLD}")
        if not found:
            layer, head, score = ranked_heads(scores[name])[0]
            best = f"{head_name(layer, head)} at {score:.2f}"
            lines.append(f"No {kind} head (threshold {HEAD_SCORE_THRESHOLD}); the highest score is {best}")
    return lines


@dataclass
class InterpretationData(SectionData):
    lines: list[str]
    heads: dict  # detector -> [(layer, head, score)] above the threshold
    thresholds: dict


def interpretation_section(ctx: ReportContext) -> ReportSection:
    if ctx.model.writers_that("reads_source"):
        return _two_stack_interpretation(ctx)
    detectors = ctx.sections["detectors"].data
    heads = classify_heads(detectors.random)
    lines = detector_lines(detectors.random, heads)
    lines += _circuit_lines(ctx, heads)
    thresholds = dict(head_score=HEAD_SCORE_THRESHOLD)
    notes = [
        f"detector score >= {HEAD_SCORE_THRESHOLD} (fraction of attention on the target, on repeated random tokens)"
    ]
    if "induction" in heads:
        thresholds["copying"] = COPYING_THRESHOLD
        notes.append(f"copying score >= {COPYING_THRESHOLD}")
    if detectors.repeated_half_loss is not None:
        first, repeated = detectors.first_half_loss, detectors.repeated_half_loss
        verdict = (
            ": the model predicts tokens from their earlier copies (in-context learning)"
            if repeated < IN_CONTEXT_RATIO * first
            else ": no sign of copying from earlier in the sequence"
        )
        lines.append(
            f"On repeated random tokens, loss is {repeated:.2f} nats on the repeated half vs {first:.2f} on "
            "the first half" + verdict
        )
        thresholds["in_context_ratio"] = IN_CONTEXT_RATIO
        notes.append(f"repeated-half loss < {IN_CONTEXT_RATIO} x first-half loss")
    attribution = ctx.sections.get("attribution")
    if attribution is not None and attribution.data.get("predicted") is not None:
        lines.append(_prediction_line(ctx))
    elif attribution is not None:
        lines.append(_attribution_line(ctx))
    if "omitted" in ctx.sections:
        omitted = "; ".join(part["what"] for part in ctx.sections["omitted"].data.parts)
        kind = "an encoder" if not ctx.model.capabilities.causal else "this model"
        lines.append(f"Not shown for {kind} (see 'Not in this report'): {omitted}")
    section = ReportSection(
        "interpretation",
        "What the numbers say",
        paragraphs=list(lines),
        data=InterpretationData(lines=lines, heads=heads, thresholds=thresholds),
    )
    section.paragraphs.append("Thresholds: " + ", ".join(notes) + ".")
    return section


def _circuit_lines(ctx: ReportContext, heads: dict) -> list[str]:
    """Copying of the induction heads and their K-composition with earlier previous-token heads."""
    lines = []
    copying = ctx.sections["circuits"].data.copying
    composition = ctx.sections["composition"].data.scores
    for layer, head, _ in heads.get("induction", [])[:MAX_NAMED_HEADS]:
        name = head_name(layer, head)
        score = float(copying[layer, head])
        does = "copies the token it attends to" if score >= COPYING_THRESHOLD else "does not clearly copy"
        lines.append(f"{name}'s OV circuit {does}: copying score {score:.2f}")
        if composition is None or layer == 0:
            continue
        k_scores = composition["k"][:layer, :, layer, head]  # every earlier writer into this head's keys
        earlier = [(p_layer, p_head) for p_layer, p_head, _ in heads.get("previous_token", []) if p_layer < layer]
        if not earlier:
            continue
        # the named previous-token head that writes most into this head's keys (one line per induction head)
        p_layer, p_head = max(earlier, key=lambda ph: float(k_scores[ph]))
        value = float(k_scores[p_layer, p_head])
        rank = int((k_scores > value).sum()) + 1
        lines.append(
            f"{head_name(p_layer, p_head)} -> {name}: K-composition {value:.2f}, rank {rank} of the "
            f"{k_scores.numel()} earlier heads writing into {name}'s keys (mean {float(k_scores.mean()):.2f})"
            + (f"; the strongest of {len(earlier)} named previous-token heads" if len(earlier) > 1 else "")
        )
    return lines


def _prediction_line(ctx: ReportContext) -> str:
    data = ctx.sections["attribution"].data
    attr = data.attribution
    contributions = [
        (head_name(layer, head), float(attr.heads[layer, head, 0]))
        for layer in range(attr.heads.shape[0])
        for head in range(attr.heads.shape[1])
    ]
    contributions += [("embed", float(attr.embed[0])), ("pos_embed", float(attr.pos_embed[0]))]
    if attr.mlp is not None:
        contributions += [(f"MLP{layer}", float(attr.mlp[layer, 0])) for layer in range(attr.mlp.shape[0])]
    top = sorted(contributions, key=lambda item: -abs(item[1]))[:3]
    parts = ", ".join(f"{name} {value:+.2f}" for name, value in top)
    predicted = ctx.token_label(data.predicted)
    before_cap = " (before the soft-cap)" if attr.logit_softcap is not None else ""
    return (
        f"At the last position the model predicts {predicted!r} with p = {data.predicted_prob:.2f}; "
        f"largest direct contributions to its logit{before_cap}: {parts}"
    )


def _attribution_line(ctx: ReportContext) -> str:
    data = ctx.sections["attribution"].data
    attr = data.attribution
    n_layers, n_heads = attr.heads.shape[:2]
    parts = [
        (head_name(layer, head), float(attr.heads[layer, head, 0]))
        for layer in range(n_layers)
        for head in range(n_heads)
    ]
    parts += [(f"MLP{layer}", float(attr.mlp[layer, 0])) for layer in range(n_layers)]
    parts += [(f"L{layer} LayerNorm biases", float(attr.layer_norm_biases[layer, 0])) for layer in range(n_layers)]
    embeddings = attr.embed + attr.token_type_embed + attr.pos_embed + attr.embed_ln_bias
    parts.append(("embeddings", float(embeddings[0])))
    top = sorted(parts, key=lambda item: -abs(item[1]))[:3]
    listed = ", ".join(f"{name} {value:+.2f}" for name, value in top)
    return f"The sentence embedding has norm {data.value:.2f}; largest direct contributions: {listed}"


ALIGNED_THRESHOLD = 0.5


@dataclass
class EncoderDecoderInterpretationData(SectionData):
    lines: list[str]
    aligned_heads: list[tuple[int, int, float]]


def _two_stack_interpretation(ctx: ReportContext) -> ReportSection:
    """An encoder-decoder's interpretation: the translation, the aligned cross-attention heads, source patching."""
    translation = ctx.sections["translation"].data
    predicted = " ".join(ctx.token_label(t) for t in ctx.logits[0].argmax(dim=-1).tolist())
    lines = [f"The decoder reads {' '.join(translation.target_tokens)!r} and predicts {predicted!r}"]
    alignment = ctx.sections["alignment"].data
    aligned = [(layer, head, score) for layer, head, score in alignment.best_per_layer if score >= ALIGNED_THRESHOLD]
    for layer, head, score in alignment.best_per_layer:
        verdict = "follows" if score >= ALIGNED_THRESHOLD else "does not clearly follow"
        lines.append(
            f"Layer {layer}'s best cross-attention head L{layer}C{head} {verdict} the {alignment.kind}: score "
            f"{score:.2f}"
        )
    if "attribution" in ctx.sections:
        layer, head, value = ctx.sections["attribution"].data.top_cross_head
        lines.append(
            f"Directly, L{layer}C{head} writes the most to the predicted logits of all cross-attention heads "
            f"(mean |contribution| {value:.2f})"
        )
    patching = ctx.sections["patching"].data
    if translation.alignment is not None:
        aligned_positions = [t for t, s in enumerate(translation.alignment) if s >= 0]
        agree = sum(patching.most_affected_source[t] == translation.alignment[t] for t in aligned_positions)
        lines.append(
            f"Corrupting source words: at {agree} of {len(aligned_positions)} aligned target positions the word "
            "whose corruption moves the prediction most is the aligned one"
        )
    omitted = "; ".join(part["what"] for part in ctx.sections["omitted"].data.parts)
    lines.append(f"Not shown for an encoder-decoder (see 'Not in this report'): {omitted}")
    section = ReportSection(
        "interpretation",
        "What the numbers say",
        paragraphs=list(lines),
        data=EncoderDecoderInterpretationData(lines, aligned),
    )
    section.paragraphs.append(f"Threshold: a head follows the alignment when its score is >= {ALIGNED_THRESHOLD}.")
    return section

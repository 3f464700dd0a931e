"""The report's sections for a BERT-style encoder (``EncoderTransformer``), and what it leaves out.

An encoder shares most of the report with a decoder (model card, tokens, attention
patterns, QK/OV circuits, composition, neurons). What rests on next-token prediction or
on a pre-norm residual stream is replaced, and the page says so in its own section:

========================================  ===================================================
decoder section                           encoder counterpart
========================================  ===================================================
induction detector, loss on repeats       next-token detector (only bidirectional attention
                                          reaches it); duplicate-token copies on both sides
logit lens, direct logit attribution      output attribution: the sentence embedding's norm
                                          split exactly over every component
                                          (``analysis.encoder_attribution``)
neuron direct logit effect ``W_out W_U``  left out (no direct path to any logit)
OV circuit ``W_E W_V W_O W_U``            ``W_E W_V W_O W_E^T`` when there is no MLM head
========================================  ===================================================

The detectors run on repeated random tokens framed like the prompt (its first and last
tokens, ``[CLS]`` and ``[SEP]`` for text), so they do not depend on the prompt.
"""

import html

import torch

from . import attention, encoder_attribution, plots
from .report_circuits import ov_read_out
from .report_interpretation import HEAD_SCORE_THRESHOLD, classify_heads, detector_lines
from .report_sections import (
    RANDOM_BATCH,
    RANDOM_SEQ_LEN,
    ReportContext,
    ReportSection,
    add_detector_figures,
    detector_scores,
    head_figure,
    head_name,
    model_section,
    sized,
)

ENCODER_DETECTORS = ("previous_token", "next_token", "duplicate_token")


def encoder_model_section(ctx: ReportContext) -> ReportSection:
    section = model_section(ctx)
    cfg = ctx.model.cfg
    heads = [name for name, present in (("an MLM head", cfg.has_mlm_head), ("a pooler", cfg.has_pooler)) if present]
    section.paragraphs.append(
        "A BERT-style encoder: bidirectional attention (every real token sees every other), and post-LayerNorm blocks "
        "(ln1 after attention, ln2 after the MLP), so the residual stream is renormalized twice per block. "
        + (f"The checkpoint has {' and '.join(heads)}." if heads else "The checkpoint has neither an MLM head nor a pooler.")
    )
    return section


def encoder_detectors_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    framing = [token for token in (ctx.bos, ctx.eos) if token is not None]
    seq_len = min(RANDOM_SEQ_LEN, (model.cfg.n_ctx - len(framing)) // 2)
    section = ReportSection("detectors", "Head detectors")
    frame = " between " + " and ".join(repr(ctx.token_label(token)) for token in framing) if framing else ""
    section.paragraphs.append(
        "A head's score is the mean attention it puts where the detector's target says (1 = all of it): previous-token "
        "heads attend to the token just before the query, next-token heads to the token just after it (only "
        "bidirectional attention reaches it), duplicate-token heads to other copies of the query's token, earlier or "
        f"later. The scores that classify heads come from {RANDOM_BATCH} sequences of {seq_len} random tokens repeated "
        f"twice{frame}, so they do not depend on the prompt; the prompt's own scores follow."
    )
    random_tokens = attention.repeated_random_tokens(model, seq_len, RANDOM_BATCH, seed=0, bos=ctx.bos, eos=ctx.eos)
    with torch.no_grad():
        _, cache = model.run_with_cache(random_tokens, names_filter=attention.pattern_hook_names(model))
    random_scores = detector_scores(cache, random_tokens, ENCODER_DETECTORS)
    prompt_scores = detector_scores(ctx.cache, ctx.tokens, ENCODER_DETECTORS)
    add_detector_figures(section, ENCODER_DETECTORS, random_scores, prompt_scores, model.cfg, no_target="too short or no repeated token")
    section.data = dict(random=random_scores, prompt=prompt_scores, random_tokens=random_tokens, seq_len=seq_len,
                        lead="previous_token")
    return section


def encoder_attribution_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("attribution", "Output attribution: what writes the sentence embedding")
    direction = encoder_attribution.sentence_embedding_direction(ctx.cache)  # [1, d_model], unit length
    pooled = encoder_attribution.encoder_direct_attribution(ctx.cache, direction, pos="mean")
    per_position = encoder_attribution.encoder_direct_attribution(ctx.cache, direction)  # [..., 1, pos]
    value, total = float(pooled.value[0]), float(pooled.total()[0])
    section.paragraphs.append(
        "The sentence embedding e is the mean of the final hidden states over the prompt's tokens (mean pooling, as "
        "sentence-transformers use it); its norm |e| = e . e/|e| is split over every component that writes to the "
        "residual stream: token, segment and position embeddings, each head, each MLP layer and each LayerNorm bias, "
        "carried to the output along the residual connections with every LayerNorm's scale frozen to its value on this "
        f"prompt. The split is exact: the parts sum to {total:.4g}, the norm is {value:.4g}. Each part is a direct "
        "effect only: what a component changes in later heads, MLPs or LayerNorm scales is not in it."
    )
    heads_fig = plots.plot_head_scores(pooled.heads[..., 0], title="direct contribution of heads<br><sup>to |e|</sup>",
                                       signed=True, colorbar_title="contribution")
    section.figures.append(head_figure(heads_fig, model.cfg.n_layers, model.cfg.n_heads))
    lines = {"attention": pooled.attn[:, 0], "mlp": pooled.mlp[:, 0], "LayerNorm biases": pooled.layer_norm_biases[:, 0]}
    layer_fig = plots.plot_layer_attribution(lines, title="direct contribution of layers<br><sup>to |e|</sup>",
                                             y_title="contribution to |e|")
    layer_fig.update_xaxes(dtick=1)
    section.figures.append(sized(layer_fig, 360, 520))
    position_fig = plots.plot_token_activations(per_position.value[0], ctx.str_tokens, colorbar_title="h . e/|e|",
                                                title="each position's final hidden state along e/|e| (their mean is |e|)")
    section.figures.append(sized(position_fig, 200, min(1100, 200 + 50 * ctx.n_pos)))
    section.data = dict(attribution=pooled, per_position=per_position, value=value, total=total, direction=direction[0])
    return section


def omitted_parts(ctx: ReportContext) -> list[dict]:
    """What the decoder report shows and this one does not: ``{"what", "why", "instead"}`` per part."""
    cfg = ctx.model.cfg
    parts = [
        dict(what="next-token prediction, logit lens and direct logit attribution",
             why="an encoder predicts no next token, and no final LayerNorm and W_U read its residual stream: post-LayerNorm "
                 "blocks renormalize the stream twice per block"
                 + (" and the MLM head is non-linear (dense, GELU, LayerNorm before W_U)" if cfg.has_mlm_head else
                    " and this checkpoint has no MLM head"),
             instead="output attribution: the sentence embedding's norm split exactly over every component"),
        dict(what="induction heads and the loss on repeated random tokens",
             why="both measure in-context prediction of the next token under causal attention; an encoder sees the whole "
                 "sequence at once and has no next-token loss",
             instead="next-token heads (which only bidirectional attention can form) and duplicate-token heads counting "
                     "copies on both sides"),
        dict(what="direct logit effect of the most active neuron (W_out W_U)",
             why="a neuron's write passes through every later LayerNorm before any output, so W_out W_U is no direct effect",
             instead="MLP layers' exact direct contributions in the output attribution"),
    ]
    if ov_read_out(ctx.model) == "embed":
        parts.append(dict(what="OV circuits read out with W_U", why="this checkpoint has no MLM head, hence no W_U",
                          instead="OV circuits read out against the token embeddings W_E^T (BERT's tied read-out)"))
    return parts


def omitted_section(ctx: ReportContext) -> ReportSection:
    parts = omitted_parts(ctx)
    items = "".join(
        f"<li><b>{html.escape(part['what'])}</b>: {html.escape(part['why'])}. Instead: {html.escape(part['instead'])}.</li>"
        for part in parts
    )
    section = ReportSection("omitted", "Not in this report, and why", html=f"<ul>{items}</ul>", data=dict(parts=parts))
    section.paragraphs.append("This is an encoder: parts of the decoder report do not apply to it.")
    return section


def _attribution_line(ctx: ReportContext) -> str:
    data = ctx.sections["attribution"].data
    attr = data["attribution"]
    n_layers, n_heads = attr.heads.shape[:2]
    parts = [(head_name(layer, head), float(attr.heads[layer, head, 0])) for layer in range(n_layers) for head in range(n_heads)]
    parts += [(f"MLP{layer}", float(attr.mlp[layer, 0])) for layer in range(n_layers)]
    parts += [(f"L{layer} LayerNorm biases", float(attr.layer_norm_biases[layer, 0])) for layer in range(n_layers)]
    embeddings = attr.embed + attr.token_type_embed + attr.pos_embed + attr.embed_ln_bias
    parts.append(("embeddings", float(embeddings[0])))
    top = sorted(parts, key=lambda item: -abs(item[1]))[:3]
    listed = ", ".join(f"{name} {value:+.2f}" for name, value in top)
    return f"The sentence embedding has norm {data['value']:.2f}; largest direct contributions: {listed}"


def encoder_interpretation_section(ctx: ReportContext) -> ReportSection:
    scores = ctx.sections["detectors"].data["random"]
    heads = classify_heads(scores)
    lines = detector_lines(scores, heads)
    lines.append(_attribution_line(ctx))
    omitted = "; ".join(part["what"] for part in ctx.sections["omitted"].data["parts"])
    lines.append(f"Not shown for an encoder (see 'Not in this report'): {omitted}")
    section = ReportSection("interpretation", "What the numbers say", paragraphs=list(lines))
    section.paragraphs.append(
        f"Thresholds: detector score >= {HEAD_SCORE_THRESHOLD} (fraction of attention on the target, on repeated random tokens).")
    section.data = dict(lines=lines, heads=heads, thresholds=dict(head_score=HEAD_SCORE_THRESHOLD))
    return section

"""The sections of the HTML report (see ``analysis.report``): numbers first, then figures.

Each ``*_section(ctx)`` reads the model and the prompt's cache from a
``ReportContext``, computes its numbers with the analysis tools, stores them in
``section.data`` (what tests and the written interpretation read) and draws its
figures with ``analysis.plots``. Circuit sections live in ``analysis.report_circuits``,
the encoder's own sections in ``analysis.report_encoder``.
"""

import dataclasses
import html
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import plotly.graph_objects as go
import torch
from torch import Tensor

from interp_transformer import ActivationCache
from interp_transformer.losses import lm_loss

from . import _checks, attention, attribution, neurons, plots, plots_base

MAX_PATTERN_CELLS = 2**22  # attention view: at most this many numbers over all heads (a few MB of HTML)
MAX_CELL_TEXT_POSITIONS = 40  # logit-lens cells show their top token only up to this many positions
RANDOM_SEQ_LEN = 20  # length of each half of the repeated random sequences the detectors run on
RANDOM_BATCH = 4
DETECTORS = ("previous_token", "duplicate_token", "induction")
DETECTOR_TITLES = {"previous_token": "previous-token", "duplicate_token": "duplicate-token", "induction": "induction",
                   "next_token": "next-token"}


@dataclass
class ReportSection:
    """One section of the report: prose, optional pre-rendered HTML, figures and the numbers behind them.

    ``paragraphs`` are plain text (escaped when rendered); ``html`` is trusted markup
    built by this module (tables, token lists) from escaped values.
    """

    key: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    figures: list[go.Figure] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    html: str = ""


@dataclass
class ReportContext:
    """What every section reads: the model, the prompt ``tokens [1, pos]``, its labels and full cache.

    ``logits`` is the model's output on the prompt: next-token logits for a decoder, the
    hidden states (or MLM logits) for an encoder. ``eos`` is the token the encoder's random
    detector sequences end with (``None`` for a decoder).
    """

    model: _checks.AnyModel
    tokens: Tensor
    str_tokens: list[str]
    cache: ActivationCache
    logits: Tensor
    token_label: Callable[[int], str]
    bos: Optional[int]
    metadata: dict = field(default_factory=dict)
    sections: dict = field(default_factory=dict)  # key -> ReportSection, filled in order
    eos: Optional[int] = None

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def ranked_heads(scores: Tensor) -> list[tuple[int, int, float]]:
    """``(layer, head, score)`` for every head, highest score first."""
    n_heads = scores.shape[1]
    order = scores.flatten().argsort(descending=True).tolist()
    return [(i // n_heads, i % n_heads, float(scores.flatten()[i])) for i in order]


def sized(fig: go.Figure, height: int, width: Optional[int] = None) -> go.Figure:
    fig.update_layout(height=height, width=width, margin=dict(l=60, r=20, t=70, b=50), title_font_size=14)
    return fig


def head_figure(fig: go.Figure, n_layers: int, n_heads: int, unit_range: bool = False) -> go.Figure:
    """Size a ``layer x head_index`` heatmap, tick every layer and head; ``unit_range`` fixes colours to [0, 1]."""
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(dtick=1)
    if unit_range:
        fig.update_traces(zmin=0.0, zmax=1.0)
    fig.update_layout(plot_bgcolor="white")
    return sized(fig, min(700, 170 + 30 * n_layers), min(1100, 260 + 40 * n_heads))


def square_figure(fig: go.Figure, n_rows: int) -> go.Figure:
    side = min(640, 160 + 18 * n_rows)
    fig.update_layout(plot_bgcolor="white")  # blank (NaN) cells stay white
    return sized(fig, side + 60, side + 150)


# ---- model card and tokens --------------------------------------------------------------

def model_section(ctx: ReportContext) -> ReportSection:
    model, cfg = ctx.model, ctx.model.cfg
    rows = [(name, value) for name, value in dataclasses.asdict(cfg).items()]
    rows.append(("parameters", f"{sum(p.numel() for p in model.parameters()):,}"))
    rows.append(("dtype", str(next(model.parameters()).dtype).removeprefix("torch.")))
    processing = list(getattr(model, "processing", []))
    rows.append(("weight processing", ", ".join(processing) if processing else "none (weights as loaded)"))
    tokenizer = model.tokenizer
    rows.append(("tokenizer", type(tokenizer).__name__ if tokenizer is not None else "none: tokens are labelled by id"))
    for name, value in ctx.metadata.items():
        if name != "curve":
            rows.append((name, value))
    data = dict(config=dataclasses.asdict(cfg), processing=processing)
    section = ReportSection("model", "Model card", html=_table(rows), data=data)
    mlp = f"Blocks with attention and an MLP of {cfg.d_mlp} neurons."
    section.paragraphs.append("Attention-only model: its blocks have no MLP." if cfg.attn_only else mlp)
    curve = ctx.metadata.get("curve")
    if isinstance(curve, dict) and {"steps", "first_half_loss", "repeated_half_loss"} <= set(curve):
        fig = go.Figure([
            go.Scatter(x=curve["steps"], y=curve["first_half_loss"], mode="lines", name="first half (unpredictable)"),
            go.Scatter(x=curve["steps"], y=curve["repeated_half_loss"], mode="lines", name="repeated half"),
        ])
        fig.update_layout(title=dict(text="training curve: loss per half of repeated random sequences"))
        fig.update_xaxes(title_text="training step")
        fig.update_yaxes(title_text="next-token loss (nats)")
        section.figures.append(sized(fig, 360, 640))
    return section


def _table(rows) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(name))}</th><td>{html.escape(str(value))}</td></tr>" for name, value in rows)
    return f'<table class="kv">{cells}</table>'


def tokens_section(ctx: ReportContext) -> ReportSection:
    ids = ctx.tokens[0].tolist()
    spans = "".join(
        f'<span class="tok" title="pos {pos}, id {token_id}"><sub>{pos}</sub>{html.escape(label)}</span>'
        for pos, (token_id, label) in enumerate(zip(ids, ctx.str_tokens))
    )
    section = ReportSection("tokens", "The prompt's tokens", html=f'<div class="tokens">{spans}</div>')
    section.paragraphs.append(f"{len(ids)} tokens (position, then text; hover for the id). Ids: {ids}")
    section.data = dict(tokens=ids, str_tokens=list(ctx.str_tokens))
    return section


# ---- attention ----------------------------------------------------------------------------

def shown_positions(ctx: ReportContext) -> int:
    """How many leading positions the per-head views show: all, unless every head's ``pos x pos`` is too much."""
    n_heads = ctx.model.cfg.n_layers * ctx.model.cfg.n_heads
    return min(ctx.n_pos, math.isqrt(MAX_PATTERN_CELLS // n_heads))


def attention_selector(patterns: Tensor, str_tokens: list[str], initial: tuple[int, int]) -> go.Figure:
    """One heatmap per head ``patterns [layer, head_index, query_pos, key_pos]``; a dropdown shows one at a time."""
    n_layers, n_heads = patterns.shape[:2]
    names = [head_name(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    first = names.index(head_name(*initial))
    template = plots.plot_attention_pattern(patterns[initial], str_tokens, title=f"attention pattern of {names[first]}")
    traces = []
    for index, name in enumerate(names):
        trace = go.Heatmap(template.data[0])
        values = plots_base.to_numpy(patterns[index // n_heads, index % n_heads]).round(4)  # 4 decimals keep the page small
        trace.update(z=values.tolist(), visible=index == first, name=name)
        traces.append(trace)
    fig = go.Figure(traces, layout=template.layout)
    buttons = [
        dict(label=name, method="update",
             args=[{"visible": [other == index for other in range(len(names))]}, {"title.text": f"attention pattern of {name}"}])
        for index, name in enumerate(names)
    ]
    menu = dict(buttons=buttons, active=first, direction="down", x=1.0, xanchor="right", y=1.12, yanchor="bottom")
    fig.update_layout(updatemenus=[menu])
    side = min(760, 220 + 18 * len(str_tokens))
    return sized(fig, side + 60, side + 140)


def attention_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    patterns = torch.stack([attention.attention_pattern(ctx.cache, layer)[0] for layer in range(model.cfg.n_layers)])
    n_shown = shown_positions(ctx)
    detectors = ctx.sections["detectors"].data
    lead = detectors.get("lead", "induction")  # the detector whose best head the view opens on
    top_layer, top_head, _ = ranked_heads(detectors["random"][lead])[0]
    entropy = attention.attention_entropy(ctx.cache)
    section = ReportSection("attention", "Attention patterns of every head")
    section.paragraphs.append(
        "Pick a head from the menu (top right). Rows are query positions, columns key positions; each row sums to 1. "
        f"The view opens on {head_name(top_layer, top_head)}, the head with the highest {DETECTOR_TITLES[lead]} score."
    )
    if n_shown < ctx.n_pos:
        section.paragraphs.append(f"The prompt has {ctx.n_pos} tokens; the view shows the first {n_shown} to keep the page small.")
    section.figures.append(attention_selector(patterns[..., :n_shown, :n_shown], ctx.str_tokens[:n_shown], (top_layer, top_head)))
    entropy_fig = plots.plot_head_scores(entropy, title="attention entropy<br><sup>on the prompt</sup>", colorbar_title="nats")
    section.figures.append(head_figure(entropy_fig, model.cfg.n_layers, model.cfg.n_heads))
    section.data = dict(patterns=patterns, entropy=entropy)
    return section


# ---- head detectors -----------------------------------------------------------------------

def detector_scores(cache: ActivationCache, tokens: Tensor, names) -> dict[str, Optional[Tensor]]:
    """Scores of each detector in ``names`` whose target marks at least one position of ``tokens``, else ``None``."""
    bidirectional = _checks.is_encoder(cache.model)
    has_target = {
        "previous_token": lambda: tokens.shape[1] >= 2,
        "next_token": lambda: tokens.shape[1] >= 2,
        "duplicate_token": lambda: bool(attention.duplicate_token_target(tokens, bidirectional).any()),
        "induction": lambda: bool(attention.induction_target(tokens).any()),
    }
    score = {
        "previous_token": lambda: attention.previous_token_scores(cache),
        "next_token": lambda: attention.next_token_scores(cache),
        "duplicate_token": lambda: attention.duplicate_token_scores(cache, tokens),
        "induction": lambda: attention.induction_scores(cache, tokens),
    }
    return {name: score[name]() if has_target[name]() else None for name in names}


def add_detector_figures(section: ReportSection, names, random_scores: dict, prompt_scores: dict, cfg, no_target: str) -> None:
    """One ``[layer, head_index]`` figure per detector on repeated random tokens, then one per detector on
    the prompt (or a sentence saying why the prompt gives that detector nothing to score)."""
    for name in names:
        fig = plots.plot_head_scores(random_scores[name], title=f"{DETECTOR_TITLES[name]} score<br><sup>repeated random tokens</sup>")
        section.figures.append(head_figure(fig, cfg.n_layers, cfg.n_heads, unit_range=True))
    for name in names:
        if prompt_scores[name] is None:
            section.paragraphs.append(
                f"The prompt gives the {DETECTOR_TITLES[name]} detector no target ({no_target}): not scored on the prompt.")
        else:
            fig = plots.plot_head_scores(prompt_scores[name], title=f"{DETECTOR_TITLES[name]} score<br><sup>on the prompt</sup>")
            section.figures.append(head_figure(fig, cfg.n_layers, cfg.n_heads, unit_range=True))


def detectors_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    seq_len = min(RANDOM_SEQ_LEN, (model.cfg.n_ctx - (ctx.bos is not None)) // 2)
    section = ReportSection("detectors", "Head detectors")
    section.paragraphs.append(
        "A head's score is the mean attention it puts where the detector's target says (1 = all of it): previous-token "
        "heads attend to the token just before the query, duplicate-token heads to earlier copies of the query's token, "
        "induction heads to the token after an earlier copy. The scores that classify heads come from "
        f"{RANDOM_BATCH} sequences of {seq_len} random tokens repeated twice"
        + (f" after token {ctx.token_label(ctx.bos)!r}" if ctx.bos is not None else "")
        + ", so they do not depend on the prompt; the prompt's own scores follow."
    )
    random_tokens = attention.repeated_random_tokens(model, seq_len, RANDOM_BATCH, seed=0, bos=ctx.bos)
    with torch.no_grad():
        logits, cache = model.run_with_cache(random_tokens, names_filter=attention.pattern_hook_names(model))
    random_scores = detector_scores(cache, random_tokens, DETECTORS)
    # columns of per_token predict the next position; the first half's first token is unpredictable
    per_token = lm_loss(logits, random_tokens, per_token=True)
    offset = int(ctx.bos is not None)
    first_half = float(per_token[:, offset:offset + seq_len - 1].mean())
    repeated_half = float(per_token[:, offset + seq_len - 1:].mean())
    prompt_scores = detector_scores(ctx.cache, ctx.tokens, DETECTORS)
    add_detector_figures(section, DETECTORS, random_scores, prompt_scores, model.cfg, no_target="no repeated token")
    section.data = dict(random=random_scores, prompt=prompt_scores, random_tokens=random_tokens, seq_len=seq_len,
                        first_half_loss=first_half, repeated_half_loss=repeated_half)
    return section


# ---- neurons and attribution --------------------------------------------------------------

def neurons_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("neurons", "MLP neurons")
    if model.cfg.attn_only:
        section.paragraphs.append("This model is attention-only (d_mlp=None): it has no MLP neurons to show.")
        section.data = dict(skipped=True)
        return section
    summary = neurons.neuron_summary(ctx.cache, "max")
    layer, neuron = divmod(int(summary.flatten().argmax()), model.cfg.d_mlp)
    activations = neurons.neuron_activations(ctx.cache, layer, neuron)[0]
    summary_fig = plots.plot_neuron_summary(summary, title="max activation of every neuron on the prompt")
    summary_fig.update_yaxes(dtick=1)
    section.figures += [
        sized(summary_fig, min(700, 170 + 30 * model.cfg.n_layers), 1100),
        sized(plots.plot_token_activations(activations, ctx.str_tokens, title=f"L{layer} neuron {neuron} over the prompt"), 200,
              min(1100, 200 + 50 * ctx.n_pos)),
    ]
    section.data = dict(skipped=False, summary=summary, top_neuron=(layer, neuron), activations=activations, logit_effect=None)
    largest = f"Largest activation on the prompt: neuron {neuron} of layer {layer} ({float(summary[layer, neuron]):.3g})."
    if _checks.is_encoder(model):
        section.paragraphs.append(
            f"{largest} Its direct logit effect is not shown: in a post-LayerNorm encoder a neuron's write passes through "
            "every later LayerNorm (and, for MLM logits, a non-linear head) before any logit, so W_out[n] W_U is no "
            "direct effect. The output attribution section gives exact direct contributions of whole MLP layers.")
        return section
    k = min(8, model.cfg.d_vocab)
    effect = neurons.neuron_logit_effect(model, layer, neuron, k=k)
    values = torch.cat([effect.top_values, effect.bottom_values])
    labels = [ctx.token_label(int(t)) for t in torch.cat([effect.top_tokens, effect.bottom_tokens])]
    section.paragraphs.append(f"{largest} Its direct logit effect W_out[n] W_U ignores the final LayerNorm and later layers.")
    section.figures.append(
        sized(plots.plot_token_values(values, labels, title=f"L{layer} neuron {neuron}: most promoted and suppressed tokens"),
              120 + 22 * len(values), 600))
    section.data["logit_effect"] = effect
    return section


def attribution_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("attribution", "Logit lens and direct logit attribution")
    probs = ctx.logits[0, -1].float().softmax(-1)
    predicted = int(probs.argmax())
    lens, layer_labels = attribution.logit_lens(ctx.cache, return_labels=True)  # [layer+1, 1, pos, d_vocab]
    lens_probs = lens[:, 0].float().softmax(-1)
    data = dict(predicted=predicted, predicted_prob=float(probs[predicted]), logit=float(ctx.logits[0, -1, predicted]))
    if ctx.n_pos >= 2:
        next_tokens = ctx.tokens[0, 1:]
        # probability each layer's read-out gives the token that actually comes next
        next_prob = lens_probs[:, :-1].gather(-1, next_tokens.view(1, -1, 1).expand(lens_probs.shape[0], -1, 1))[..., 0]
        cell_text = None
        if ctx.n_pos <= MAX_CELL_TEXT_POSITIONS:
            top = lens_probs[:, :-1].argmax(-1)
            cell_text = [[ctx.token_label(int(t)) for t in row] for row in top]
        pos_labels = [f"{a}→{b}" for a, b in zip(ctx.str_tokens[:-1], ctx.str_tokens[1:])]
        fig = plots.plot_logit_lens(next_prob, layer_labels, pos_labels, cell_text=cell_text, colorbar_title="p(next token)",
                                    title="logit lens: p(actual next token) per layer")
        fig.update_traces(zmin=0.0, zmax=1.0)
        section.figures.append(sized(fig, min(700, 200 + 36 * len(layer_labels)), min(1100, 300 + 60 * ctx.n_pos)))
        section.paragraphs.append(
            "Logit lens: the residual stream entering each block (and the final one) read out through the final LayerNorm "
            "and W_U. Colour: probability given to the token that actually comes next; text: the top token of each read-out.")
        data["lens_next_token_prob"] = next_prob
    else:
        section.paragraphs.append("The prompt has one token: there is no next token for the logit lens to score.")
    attr = attribution.direct_logit_attribution(ctx.cache, predicted, pos=-1)
    data["attribution"] = attr
    data["attribution_total"] = float(attr.total()[0])
    label = ctx.token_label(predicted)
    section.paragraphs.append(
        f"At the last position the model predicts {label!r} (p = {data['predicted_prob']:.2f}, logit {data['logit']:.3g}). "
        f"Direct logit attribution splits that logit over the components that write to the residual stream, with the "
        f"final LayerNorm's scale frozen; the parts sum to {data['attribution_total']:.3g}."
    )
    target = f"<sup>to {html.escape(repr(label))}</sup>"
    heads_fig = plots.plot_head_scores(attr.heads[..., 0], title=f"direct logit attribution of heads<br>{target}", signed=True,
                                       colorbar_title="logit")
    section.figures.append(head_figure(heads_fig, model.cfg.n_layers, model.cfg.n_heads))
    lines = {"attention": attr.attn[:, 0]}
    if attr.mlp is not None:
        lines["mlp"] = attr.mlp[:, 0]
    layer_fig = plots.plot_layer_attribution(lines, title=f"direct logit attribution of layers<br>{target}")
    layer_fig.update_xaxes(dtick=1)
    section.figures.append(sized(layer_fig, 360, 520))
    section.data = data
    return section

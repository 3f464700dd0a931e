"""QK and OV circuits of the top heads, and each head's copying score.

Nothing here builds a ``d_vocab x d_vocab`` matrix: circuits are evaluated on the
prompt's own distinct tokens (at most ``MAX_CIRCUIT_TOKENS``) and on its positions.
Under bidirectional attention the positional QK circuit has no causal mask; the OV
circuit is read out with ``W_U`` or, for a model without one, with ``W_E^T``.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ... import _checks, plots
from ...plots import base as plots_base
from ...readouts import circuits
from ..context import ReportContext, ReportSection, SectionData, head_figure, head_name, ranked_heads, square_figure
from .detectors import DETECTOR_TITLES


@dataclass
class CircuitsData(SectionData):
    # per top head: layer, head, reason, qk, ov, positional_qk (None without learned positions), ov_diagonal_top
    heads: list[dict]
    token_ids: list[int]
    copying: Tensor  # [layer, head_index]
    read_out: str


MAX_CIRCUIT_TOKENS = 24  # distinct prompt tokens shown in the QK/OV circuit views


def top_heads(ctx: ReportContext, limit: int = 3) -> list[tuple[int, int, str]]:
    """The best head of each detector the report ran (distinct), as ``(layer, head, reason)``.

    Detectors in the order induction, previous-token, next-token, duplicate-token; those the
    report did not run (induction and next-token are for decoders and encoders only) are skipped.
    """
    random_scores = ctx.sections["detectors"].data["random"]
    chosen: list[tuple[int, int, str]] = []
    for name in ("induction", "previous_token", "next_token", "duplicate_token"):
        if random_scores.get(name) is None:
            continue
        layer, head, score = ranked_heads(random_scores[name])[0]
        if all((layer, head) != (l, h) for l, h, _ in chosen):
            chosen.append((layer, head, f"top {DETECTOR_TITLES[name]} head, score {score:.2f}"))
    return chosen[:limit]


def _circuit_tokens(ctx: ReportContext) -> list[int]:
    """The prompt's distinct tokens in order of first appearance, at most ``MAX_CIRCUIT_TOKENS``."""
    return list(dict.fromkeys(ctx.tokens[0].tolist()))[:MAX_CIRCUIT_TOKENS]


@torch.no_grad()
def positional_qk(model: _checks.AnyModel, layer: int, head: int, n_pos: int) -> Tensor:
    """``W_pos W_Q W_K^T W_pos^T`` on the first ``n_pos`` positions: ``[query_pos, key_pos]``.

    Under causal attention the future keys, which a query never reaches, are NaN; with
    bidirectional attention they are kept.
    """
    W_pos = model.W_pos[:n_pos]
    scores = (W_pos @ model.W_Q[layer, head]) @ (W_pos @ model.W_K[layer, head]).T
    if not model.capabilities.causal:
        return scores.float()
    future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=scores.device).triu(1)
    return scores.float().masked_fill(future, float("nan"))


def ov_read_out(model: _checks.AnyModel) -> str:
    """``"unembed"`` (``W_U``) when the model has one, else ``"embed"`` (``W_E^T``: e.g. an encoder without MLM
    head)."""
    try:
        model.W_U  # noqa: B018 (the read raises AttributeError where the model has no unembedding)
    except AttributeError:
        return "embed"
    return "unembed"


def circuits_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    token_ids = _circuit_tokens(ctx)
    labels = [ctx.token_label(token_id) for token_id in token_ids]
    read_out = ov_read_out(model)
    section = ReportSection("circuits", "QK and OV circuits of the top heads")
    if read_out == "embed":
        ov_text = (
            "full OV circuit W_E W_V W_O W_E^T: how much attending to a source token writes each token's embedding "
            "(this checkpoint has no MLM head, hence no W_U; BERT ties its MLM decoder to W_E, so W_E^T is the tied "
            "read-out; a diagonal means the head copies)"
        )
    else:
        ov_text = (
            "full OV circuit W_E W_V W_O W_U: the direct effect on each output logit of attending to a source token "
            "(a diagonal means the head copies)"
        )
    section.paragraphs.append(
        "Full QK circuit W_E W_Q W_K^T W_E^T: how much a query token attends to a key token from the tokens alone; "
        f"positional QK circuit W_pos W_Q W_K^T W_pos^T: the same from positions alone; {ov_text}. "
        f"Shown on the prompt's {len(token_ids)} distinct tokens; LayerNorm and biases are left out"
        + (
            " (and so is any non-linear head before W_U)"
            if model.capabilities.read_out is None and read_out == "unembed"
            else ""
        )
        + ". "
        "The copying score of a head is sum(Re eigenvalues) / sum(|eigenvalues|) of its full OV circuit, in [-1, 1]."
    )
    n_tokens, n_shown = len(token_ids), ctx.shown_positions()
    has_learned_positions = model.pos_embed is not None
    if not has_learned_positions:
        section.paragraphs.append(
            "This model has no learned positional embedding (its positions act inside attention, as a rotation of "
            "queries and keys), so there is no positional QK circuit to show, and the token QK circuit leaves out how "
            "the rotation changes scores with the distance between query and key."
        )
    pos_labels = ctx.str_tokens[:n_shown]
    heads = []
    for layer, head, reason in top_heads(ctx):
        name = head_name(layer, head)
        qk = circuits.circuit_on_tokens(circuits.full_qk_circuit(model, layer, head), token_ids, token_ids)
        ov = circuits.circuit_on_tokens(circuits.full_ov_circuit(model, layer, head, read_out), token_ids, token_ids)
        pos_qk = positional_qk(model, layer, head, n_shown) if has_learned_positions else None
        qk_title = f"{name} full QK circuit<br><sup>{reason}</sup>"
        section.figures.append(
            square_figure(plots.plot_circuit(qk, labels, labels, kind="qk", title=qk_title), n_tokens)
        )
        if pos_qk is not None:
            section.figures.append(
                square_figure(
                    plots_base.heatmap(
                        pos_qk,
                        x_title="key_pos",
                        y_title="query_pos",
                        x_labels=pos_labels,
                        y_labels=pos_labels,
                        signed=True,
                        title=f"{name} positional QK circuit",
                        colorbar_title="attention score",
                        what="positional QK circuit",
                    ),
                    n_shown,
                )
            )
        section.figures.append(
            square_figure(plots.plot_circuit(ov, labels, labels, kind="ov", title=f"{name} full OV circuit"), n_tokens)
        )
        # on the token subset: how often a source token's own logit is its row's largest
        diagonal_top = float((ov.argmax(dim=-1) == torch.arange(n_tokens, device=ov.device)).float().mean())
        heads.append(
            dict(
                layer=layer, head=head, reason=reason, qk=qk, ov=ov, positional_qk=pos_qk, ov_diagonal_top=diagonal_top
            )
        )
    copying = circuits.copying_scores(model, read_out=read_out)
    title = "copying score<br><sup>full OV circuit eigenvalues</sup>"
    fig = plots.plot_head_scores(copying, title=title, signed=True, colorbar_title="copying")
    fig.update_traces(zmin=-1.0, zmax=1.0)
    section.figures.append(head_figure(fig, model.cfg.n_layers, model.cfg.n_heads))
    section.data = CircuitsData(heads=heads, token_ids=token_ids, copying=copying, read_out=read_out)
    return section

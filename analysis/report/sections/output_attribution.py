"""What writes the sentence embedding: its norm split exactly over every component (bidirectional post-norm models).

The sentence embedding ``e`` is the mean of the final hidden states over the prompt's
tokens; ``analysis.readouts.post_norm`` splits ``|e| = e . e/|e|`` over embeddings, heads,
MLP layers and norm biases with every norm's scale frozen.
"""

from dataclasses import dataclass

from torch import Tensor

from ... import plots
from ...readouts import post_norm
from ...readouts.post_norm import EncoderAttribution
from ..context import ReportContext, ReportSection, SectionData, head_figure, sized


@dataclass
class OutputAttributionData(SectionData):
    attribution: EncoderAttribution  # mean-pooled, [batch] terms
    per_position: EncoderAttribution  # [batch, pos] terms
    value: float  # |e|
    total: float  # the sum of every term: equals value
    direction: Tensor  # e/|e|, [d_model]


def output_attribution_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("attribution", "Output attribution: what writes the sentence embedding")
    direction = post_norm.sentence_embedding_direction(ctx.cache)  # [1, d_model], unit length
    pooled = post_norm.encoder_direct_attribution(ctx.cache, direction, pos="mean")
    per_position = post_norm.encoder_direct_attribution(ctx.cache, direction)  # [..., 1, pos]
    value, total = float(pooled.value[0]), float(pooled.total()[0])
    section.paragraphs.append(
        "The sentence embedding e is the mean of the final hidden states over the prompt's tokens (mean pooling, as "
        "sentence-transformers use it); its norm |e| = e . e/|e| is split over every component that writes to the "
        "residual stream: token, segment and position embeddings, each head, each MLP layer and each LayerNorm bias, "
        "carried to the output along the residual connections with every LayerNorm's scale frozen to its value on this "
        f"prompt. The split is exact: the parts sum to {total:.4g}, the norm is {value:.4g}. Each part is a direct "
        "effect only: what a component changes in later heads, MLPs or LayerNorm scales is not in it."
    )
    heads_fig = plots.plot_head_scores(
        pooled.heads[..., 0],
        title="direct contribution of heads<br><sup>to |e|</sup>",
        signed=True,
        colorbar_title="contribution",
    )
    section.figures.append(head_figure(heads_fig, model.cfg.n_layers, model.cfg.n_heads))
    lines = {
        "attention": pooled.attn[:, 0],
        "mlp": pooled.mlp[:, 0],
        "LayerNorm biases": pooled.layer_norm_biases[:, 0],
    }
    layer_fig = plots.plot_layer_attribution(
        lines, title="direct contribution of layers<br><sup>to |e|</sup>", y_title="contribution to |e|"
    )
    layer_fig.update_xaxes(dtick=1)
    section.figures.append(sized(layer_fig, 360, 520))
    position_fig = plots.plot_token_activations(
        per_position.value[0],
        ctx.str_tokens,
        colorbar_title="h . e/|e|",
        title="each position's final hidden state along e/|e| (their mean is |e|)",
    )
    section.figures.append(sized(position_fig, 200, min(1100, 200 + 50 * ctx.n_pos)))
    section.data = OutputAttributionData(
        attribution=pooled, per_position=per_position, value=value, total=total, direction=direction[0]
    )
    return section

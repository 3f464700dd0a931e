"""Direct logit attribution of each predicted target token, through every decoder and cross-attention head.

Needs a pre-norm decoder with a final norm (``capabilities.linear_logits``): its residual
stream is a sum of component writes and its logits are linear in it once the final norm's
scale is frozen (``analysis.readouts.encoder_decoder``).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ...plots import base as plots_base
from ...readouts.encoder_decoder import DecoderLogitAttribution, predicted_logit_attribution
from ..context import ReportContext, ReportSection, SectionData, sized


@dataclass
class DecoderAttributionData(SectionData):
    attribution: DecoderLogitAttribution  # batch axis = target positions
    predicted: list[int]  # the top token at each target position
    components: list[str]
    values: Tensor  # [component, pos]
    top_cross_head: tuple[int, int, float]  # (layer, head, mean |contribution| over positions)


def _table(attr: DecoderLogitAttribution) -> tuple[list[str], Tensor]:
    n_layers, n_heads = attr.heads.shape[:2]
    labels, rows = ["embed", "pos_embed"], [attr.embed, attr.pos_embed]
    for layer in range(n_layers):
        labels += [f"L{layer}H{head}" for head in range(n_heads)] + [f"L{layer} b_O"]
        rows += list(attr.heads[layer]) + [attr.attn_bias[layer]]
        labels += [f"L{layer}C{head}" for head in range(n_heads)] + [f"L{layer} cross b_O"]
        rows += list(attr.cross_heads[layer]) + [attr.cross_attn_bias[layer]]
        labels.append(f"MLP{layer}")
        rows.append(attr.mlp[layer])
    labels += ["final norm bias", "b_U"]
    rows += [attr.ln_final_bias, attr.unembed_bias]
    return labels, torch.stack(rows)


def decoder_attribution_section(ctx: ReportContext) -> ReportSection:
    attr, predicted = predicted_logit_attribution(ctx.cache, ctx.logits)
    labels, values = _table(attr)
    cross = attr.cross_heads.abs().mean(dim=-1)  # [layer, head_index]
    index = int(cross.flatten().argmax())
    layer, head = divmod(index, cross.shape[1])
    predicted = predicted.tolist()
    data = DecoderAttributionData(attr, predicted, labels, values, (layer, head, float(cross[layer, head])))
    section = ReportSection("attribution", "Direct logit attribution through the decoder's heads", data=data)
    total = attr.total()
    check = float((total - ctx.logits[0, torch.arange(len(predicted)), torch.tensor(predicted)]).abs().max())
    section.paragraphs.append(
        "Each column is one target position; each row a component's direct contribution to the logit of the token "
        "predicted "
        "there (final norm's scale frozen), with self-attention heads LxHy, cross-attention heads LxCy (what each "
        "reads from "
        f"the source). The rows of a column sum to its logit (largest difference {check:.1e}). Cross-attention head "
        f"L{layer}C{head} contributes most (mean |contribution| {data.top_cross_head[2]:.2f})."
    )
    columns = [f"{ctx.target_str_tokens[t]} -> {ctx.token_label(token)}" for t, token in enumerate(predicted)]
    fig = plots_base.heatmap(
        values,
        x_title="pos (target: read -> predicted)",
        y_title="component",
        x_labels=columns,
        y_labels=labels,
        signed=True,
        title="direct contribution to the predicted token's logit",
        colorbar_title="logit",
        what="decoder attribution",
    )
    section.figures.append(sized(fig, min(1100, 180 + 16 * len(labels)), min(1100, 320 + 50 * len(columns))))
    return section

"""The most active MLP neuron on the prompt, every neuron's peak, and the top neuron's direct logit effect."""

from dataclasses import dataclass

import torch
from torch import Tensor

from ... import plots
from ...readouts import neurons
from ...readouts.neurons import NeuronLogitEffect
from ...views import activation_view
from ..context import ReportContext, ReportSection, SectionData, sized

MAX_VIEW_NEURONS = 8  # the most active neurons shown on the text


@dataclass
class NeuronsData(SectionData):
    skipped: bool  # True for an attention-only model
    summary: Tensor | None = None  # [layer, d_mlp] max activation on the prompt
    top_neuron: tuple[int, int] | None = None  # (layer, neuron)
    activations: Tensor | None = None  # [pos] of the top neuron
    logit_effect: NeuronLogitEffect | None = None  # only where logits are linear in the residual stream


def neurons_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("neurons", "MLP neurons", data=NeuronsData(skipped=True))
    if model.act_name("post", 0) not in model.hook_dict:
        section.paragraphs.append("This model is attention-only (d_mlp=None): it has no MLP neurons to show.")
        return section
    summary = neurons.neuron_summary(ctx.cache, "max")
    layer, neuron = divmod(int(summary.flatten().argmax()), model.cfg.d_mlp)
    top = summary.flatten().topk(min(MAX_VIEW_NEURONS, summary.numel())).indices.tolist()
    top = [divmod(index, model.cfg.d_mlp) for index in top]
    values = torch.stack([neurons.neuron_activations(ctx.cache, l, n)[0] for l, n in top], dim=-1)  # [pos, neuron]
    section.html = activation_view(ctx.str_tokens, values, [f"L{l}N{n}" for l, n in top]).to_html(include_script=False)
    activations = neurons.neuron_activations(ctx.cache, layer, neuron)[0]
    summary_fig = plots.plot_neuron_summary(summary, title="max activation of every neuron on the prompt")
    summary_fig.update_yaxes(dtick=1)
    section.figures += [
        sized(summary_fig, min(700, 170 + 30 * model.cfg.n_layers), 1100),
        sized(
            plots.plot_token_activations(
                activations, ctx.str_tokens, title=f"L{layer} neuron {neuron} over the prompt"
            ),
            200,
            min(1100, 200 + 50 * ctx.n_pos),
        ),
    ]
    section.paragraphs.append(
        f"On the text: the {len(top)} most active neurons on the prompt; pick one from the menu, "
        "hover over a token for its value."
    )
    section.data = NeuronsData(skipped=False, summary=summary, top_neuron=(layer, neuron), activations=activations)
    largest = (
        f"Largest activation on the prompt: neuron {neuron} of layer {layer} ({float(summary[layer, neuron]):.3g})."
    )
    if not model.capabilities.linear_logits:
        section.paragraphs.append(
            f"{largest} Its direct logit effect is not shown: in this model a neuron's write passes through later "
            "post-norm LayerNorms or a non-linear head before any logit, so W_out[n] W_U is no direct effect."
        )
        return section
    k = min(8, model.cfg.d_vocab)
    effect = neurons.neuron_logit_effect(model, layer, neuron, k=k)
    values = torch.cat([effect.top_values, effect.bottom_values])
    labels = [ctx.token_label(int(t)) for t in torch.cat([effect.top_tokens, effect.bottom_tokens])]
    section.paragraphs.append(
        f"{largest} Its direct logit effect W_out[n] W_U ignores the final LayerNorm and later layers."
    )
    section.figures.append(
        sized(
            plots.plot_token_values(
                values, labels, title=f"L{layer} neuron {neuron}: most promoted and suppressed tokens"
            ),
            120 + 22 * len(values),
            600,
        )
    )
    section.data.logit_effect = effect
    return section

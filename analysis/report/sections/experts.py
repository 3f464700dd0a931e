"""Mixtures of experts (``model.has_experts``): which experts the prompt's tokens use, and the experts' neurons.

Two sections: ``experts_section`` (expert usage per layer and per token, and each expert's
direct logit attribution through its routing weight) and ``expert_neurons_section``, which
takes the place of the MLP-neuron section, since a mixture's neurons belong to one expert each.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ... import plots
from ...readouts import experts
from ...readouts.experts import ExpertAttribution
from ...readouts.neurons import NeuronLogitEffect
from ..context import ReportContext, ReportSection, SectionData, sized


@dataclass
class ExpertsData(SectionData):
    layers: list[int]  # the blocks with a mixture of experts
    fraction: Tensor  # [layer, expert]: share of the prompt's tokens routed to each expert
    token_weights: Tensor  # [pos, expert]: routing weights of the last mixture's experts per token
    attribution: ExpertAttribution | None = None  # to the predicted token at the last position


@dataclass
class ExpertNeuronsData(SectionData):
    summary: Tensor  # [layer, expert, d_mlp]: max activation over the tokens routed to each expert (NaN: unused)
    top_neuron: tuple[int, int, int]  # (layer, expert, neuron)
    activations: Tensor  # [pos] of the top neuron
    logit_effect: NeuronLogitEffect | None = None


def _layer_labels(layers: list[int]) -> list[str]:
    return [f"L{layer}" for layer in layers]


def experts_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    usage = experts.expert_usage(ctx.cache)
    fraction, last = usage.fraction(), usage.layers[-1]
    token_weights = usage.weights[-1, 0]
    section = ReportSection("experts", "Mixture of experts")
    n_experts, per_token = fraction.shape[1], model.blocks[last].mlp.experts_per_token
    busiest = int(fraction.sum(0).argmax())
    section.paragraphs.append(
        f"Each token's router picks {per_token} of {n_experts} experts in every mixture (blocks {usage.layers}). "
        f"Colour: the share of the prompt's tokens routed to each expert; expert {busiest} is used most over all "
        "layers."
    )
    labels = _layer_labels(usage.layers)
    section.figures.append(
        sized(
            plots.plot_expert_usage(fraction, labels, title="expert usage per layer"),
            min(700, 170 + 30 * len(labels)),
            min(1100, 260 + 30 * n_experts),
        )
    )
    section.figures.append(
        sized(
            plots.plot_token_routing(token_weights, ctx.str_tokens, title=f"routing weights per token in L{last}"),
            min(900, 170 + 22 * ctx.n_pos),
            min(1100, 300 + 30 * n_experts),
        )
    )
    data = ExpertsData(usage.layers, fraction, token_weights)
    if model.capabilities.linear_logits:
        predicted = int(ctx.logits[0, -1].argmax())
        attr = experts.expert_logit_attribution(ctx.cache, predicted, pos=-1)
        cap = " before the soft-cap" if attr.logit_softcap is not None else ""
        section.figures.append(
            sized(
                plots.plot_expert_attribution(
                    attr.experts[..., 0],
                    labels,
                    title=f"direct logit attribution of experts to {ctx.token_label(predicted)!r}",
                ),
                min(700, 170 + 30 * len(labels)),
                min(1100, 260 + 30 * n_experts),
            )
        )
        section.paragraphs.append(
            "Direct logit attribution through the routing weights: each expert's output at the last position, times "
            "its "
            "routing weight (0 where it was not chosen), read out through the final norm with its scale frozen; per "
            f"layer the experts (and the shared expert) sum to the MLP's contribution to the logit{cap}."
        )
        data.attribution = attr
    section.data = data
    return section


def expert_neurons_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    layers = experts.moe_layers(model)
    summary = torch.stack([experts.expert_neuron_summary(ctx.cache, layer, "max") for layer in layers])
    flat = summary.nan_to_num(nan=float("-inf")).flatten()
    index = int(flat.argmax())
    position, neuron = divmod(index, summary.shape[2])
    slot, expert = divmod(position, summary.shape[1])
    layer = layers[slot]
    activations = experts.expert_neuron_activations(ctx.cache, layer, expert, neuron)[0]
    section = ReportSection("neurons", "Expert neurons")
    section.paragraphs.append(
        "This model's MLPs are mixtures of experts: each neuron belongs to one expert, and only the tokens routed to "
        "that "
        f"expert count. Largest activation on the prompt among routed tokens: neuron {neuron} of expert {expert} in "
        f"layer {layer} ({float(summary[slot, expert, neuron]):.3g})."
    )
    section.figures.append(
        sized(
            plots.plot_neuron_summary(
                summary[slot],
                title=f"L{layer}: max activation of every expert neuron over the tokens routed to its expert",
            ),
            min(700, 170 + 30 * summary.shape[1]),
            1100,
        )
    )
    section.figures.append(
        sized(
            plots.plot_token_activations(
                activations, ctx.str_tokens, title=f"L{layer} expert {expert} neuron {neuron} over the prompt"
            ),
            200,
            min(1100, 200 + 50 * ctx.n_pos),
        )
    )
    section.data = ExpertNeuronsData(summary, (layer, expert, neuron), activations)
    if model.capabilities.linear_logits:
        effect = experts.expert_neuron_logit_effect(model, layer, expert, neuron, k=min(8, model.cfg.d_vocab))
        values = torch.cat([effect.top_values, effect.bottom_values])
        labels = [ctx.token_label(int(t)) for t in torch.cat([effect.top_tokens, effect.bottom_tokens])]
        section.figures.append(
            sized(
                plots.plot_token_values(
                    values,
                    labels,
                    title=f"L{layer} expert {expert} neuron {neuron}: most promoted and suppressed tokens",
                ),
                120 + 22 * len(values),
                600,
            )
        )
        section.paragraphs.append(
            "Its direct logit effect W_out[E][n] W_U ignores the final norm, later layers and the routing weight."
        )
        section.data.logit_effect = effect
    return section


__all__ = ["ExpertNeuronsData", "ExpertsData", "expert_neurons_section", "experts_section"]

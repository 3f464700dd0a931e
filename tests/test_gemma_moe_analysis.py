"""The analysis tools on Gemma and mixture-of-experts models: exact attribution through post norms, soft-caps and
routing weights, expert usage, per-expert neurons, their figures and the report.

References: the model's own hooks (the uncapped logits, each block's outputs read through the
final norm with its cached scale), ablations with every norm scale frozen from the cache, and
``topk`` over the whole activation tensor.
"""

import pytest
import torch

from analysis import plots
from analysis.readouts import attribution, experts, neurons
from analysis.report import DISPLAY_ORDER, EXPERTS_DISPLAY_ORDER, build_report
from interp_transformer.loading import from_pretrained

from .gemma_helpers import tiny_gemma
from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import float64_copy, random_tokens
from .moe_helpers import tiny_moe

TOKENS = random_tokens(2, 9, seed=5)
ANSWERS, WRONG = TOKENS[:, -1], torch.tensor([3, 7])


def perturbed_biases(model, seed: int = 1):
    """Our biases are zeros after loading (the checkpoints have none): move them, so a dropped bias term shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.rsplit(".", 1)[-1].lstrip("_").startswith("b_"):
                param.add_(0.3 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model


@pytest.fixture(scope="module")
def gemma2():
    return perturbed_biases(from_pretrained(float64_copy(tiny_gemma("gemma2-capped-window")), dtype=torch.float64))


@pytest.fixture(scope="module")
def qwen_moe():
    return perturbed_biases(from_pretrained(float64_copy(tiny_moe("qwen2moe-shared-dense")), dtype=torch.float64))


def logit_difference(logits, tokens=ANSWERS, wrong=WRONG):
    rows = torch.arange(logits.shape[0])
    return logits[rows, -1, tokens] - logits[rows, -1, wrong]


def read_out(model, cache, vectors):
    """``vectors [..., batch, pos, d_model]`` through the final norm (cached scale) onto the answer-minus-wrong
    direction."""
    direction = model.W_U[:, ANSWERS] - model.W_U[:, WRONG]  # [d_model, batch]
    normalized = cache.apply_ln_to_stack(vectors)[..., -1, :]  # [..., batch, d_model]
    return (normalized * direction.T).sum(-1)


# --- direct logit attribution ---------------------------------------------------------------------
def test_dla_through_post_norms_and_a_soft_cap_is_exact_before_the_cap(gemma2):
    model = gemma2
    logits, cache = model.run_with_cache(TOKENS)
    attr = attribution.direct_logit_attribution(cache, ANSWERS, WRONG)
    assert attr.logit_softcap == model.cfg.final_softcap and "before the cap" in attr.note
    torch.testing.assert_close(attr.total(), logit_difference(cache["logits_uncapped"]), atol=1e-10, rtol=0)
    # the cap bites: the capped logit is another number
    assert (attr.total() - logit_difference(logits)).abs().min() > 0.1
    for layer in range(model.cfg.n_layers):  # heads through ln1_post, neurons through ln2_post, read against the hooks
        torch.testing.assert_close(
            attr.attn[layer], read_out(model, cache, cache["attn_out", layer]), atol=1e-10, rtol=0
        )
        torch.testing.assert_close(attr.mlp[layer], read_out(model, cache, cache["mlp_out", layer]), atol=1e-10, rtol=0)
    per_neuron = attribution.neuron_logit_attribution(cache, ANSWERS, WRONG)
    torch.testing.assert_close(per_neuron.sum(1) + attr.mlp_bias, attr.mlp, atol=1e-10, rtol=0)


def test_a_head_without_its_post_norm_pull_back_would_be_wrong(gemma2):
    """The heads' sum through ln1_post is not their sum before it: the test above can fail."""
    _, cache = gemma2.run_with_cache(TOKENS)
    attr = attribution.direct_logit_attribution(cache, ANSWERS, WRONG)
    heads = torch.einsum("bphd,hdm->bpm", cache["z", 0], gemma2.W_O[0]) + gemma2.b_O[0]
    assert (read_out(gemma2, cache, heads) - attr.attn[0]).abs().max() > 1e-3


def test_the_logit_lens_ends_at_the_capped_logits(gemma2):
    logits, cache = gemma2.run_with_cache(TOKENS)
    torch.testing.assert_close(attribution.logit_lens(cache)[-1], logits, atol=1e-10, rtol=0)


def test_dla_through_routing_weights_is_exact(qwen_moe):
    model = qwen_moe
    logits, cache = model.run_with_cache(TOKENS)
    attr = attribution.direct_logit_attribution(cache, ANSWERS, WRONG)
    torch.testing.assert_close(attr.total(), logit_difference(logits), atol=1e-10, rtol=0)
    split = experts.expert_logit_attribution(cache, ANSWERS, WRONG)
    assert split.layers == [0, 2] and split.shared is not None  # block 1 is dense
    torch.testing.assert_close(split.total(), attr.mlp[split.layers], atol=1e-10, rtol=0)
    for slot, layer in enumerate(split.layers):
        mixture = model.blocks[layer].mlp
        routing = experts.expert_usage(cache).weights[slot, :, -1]  # [batch, expert]
        unchosen = routing.T == 0
        assert unchosen.any() and not split.experts[slot][unchosen].any()  # an expert not chosen contributes nothing
        neurons_split = experts.expert_neuron_logit_attribution(cache, ANSWERS, layer, WRONG)
        biases = routing.T * read_out(model, cache, mixture.stacked("b_out")[:, None, None, :].expand(-1, 2, 9, -1))
        torch.testing.assert_close(neurons_split.sum(1) + biases, split.experts[slot], atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="mixture of experts, whose neurons belong to one expert each"):
        attribution.neuron_logit_attribution(cache, ANSWERS, layer=0)
    dense = attribution.neuron_logit_attribution(
        cache, ANSWERS, WRONG, layer=1
    )  # the dense block's neurons are ordinary
    torch.testing.assert_close(dense.sum(0) + attr.mlp_bias[1], attr.mlp[1], atol=1e-10, rtol=0)


def test_an_expert_ablated_with_frozen_norms_moves_the_logit_by_its_attribution(qwen_moe):
    """In the last block, an expert's direct effect is its whole effect once the final norm's scale is frozen."""
    model, layer = qwen_moe, 2
    logits, cache = model.run_with_cache(TOKENS)
    split = experts.expert_logit_attribution(cache, ANSWERS, WRONG)
    expert = int(cache["expert_indices", layer][0, -1, 0])
    mixture = model.blocks[layer].mlp
    frozen = cache["scale"]
    hooks = [
        (experts.expert_hook_name(model, layer, expert), lambda post, hook: torch.zeros_like(post)),
        ("ln_final.hook_scale", lambda scale, hook: frozen),
    ]
    ablated = model.run_with_hooks(TOKENS, fwd_hooks=hooks)
    routing = experts.expert_usage(cache).weights[-1, :, -1, expert]
    bias_part = routing * read_out(model, cache, mixture.experts[expert].b_out.expand(2, 9, -1))
    change = logit_difference(logits) - logit_difference(ablated)
    torch.testing.assert_close(change[0], (split.experts[-1, expert] - bias_part)[0], atol=1e-10, rtol=0)


# --- usage and expert neurons ---------------------------------------------------------------------
def test_expert_usage(qwen_moe):
    _, cache = qwen_moe.run_with_cache(TOKENS)
    usage = experts.expert_usage(cache)
    k = qwen_moe.cfg.experts_per_token
    assert usage.weights.shape == (2, 2, 9, qwen_moe.cfg.n_experts) and usage.layers == [0, 2]
    torch.testing.assert_close(usage.fraction().sum(-1), torch.full((2,), float(k), dtype=torch.float64))
    counts = torch.stack([torch.bincount(cache["expert_indices", layer].flatten(), minlength=6) for layer in (0, 2)])
    torch.testing.assert_close(usage.fraction(), counts.double() / 18.0)
    masked = experts.expert_usage(cache, attention_mask=torch.tensor([[1] * 9, [0] * 4 + [1] * 5]))
    first = torch.stack([torch.bincount(cache["expert_indices", layer][0].flatten(), minlength=6) for layer in (0, 2)])
    second = torch.stack(
        [torch.bincount(cache["expert_indices", layer][1, 4:].flatten(), minlength=6) for layer in (0, 2)]
    )
    torch.testing.assert_close(masked.fraction(), (first + second).double() / 14.0)


def test_expert_neuron_summary_and_top_activations(qwen_moe):
    model, layer, expert = qwen_moe, 2, 1
    _, cache = model.run_with_cache(TOKENS)
    post = experts.expert_neuron_activations(cache, layer, expert)
    routed = (cache["expert_indices", layer] == expert).any(-1)
    assert routed.any()
    summary = experts.expert_neuron_summary(cache, layer)
    torch.testing.assert_close(summary[expert], post[routed].max(0).values)
    torch.testing.assert_close(
        experts.expert_neuron_summary(cache, layer, chosen_only=False)[expert], post.flatten(0, 1).max(0).values
    )
    top = experts.expert_top_activations(model, TOKENS, layer, expert, neurons=[0, 5], k=3, batch_size=1)
    reference = post.masked_fill(~routed[..., None], float("-inf"))[..., [0, 5]].flatten(0, 1).T.topk(3)
    torch.testing.assert_close(top.values, reference.values)
    assert torch.equal(top.text_index * 9 + top.position, reference.indices)
    effect = experts.expert_neuron_logit_effect(model, layer, expert, 4, k=3)
    torch.testing.assert_close(effect.effect, model.blocks[layer].mlp.experts[expert].W_out[4] @ model.W_U)


def test_neuron_tools_name_the_expert_tools_on_a_mixture(qwen_moe):
    _, cache = qwen_moe.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="mixtures of experts.*analysis.readouts.experts"):
        neurons.neuron_summary(cache)
    with pytest.raises(ValueError, match=r"block 1's MLP is not a mixture of experts; mixtures are in blocks \[0, 2\]"):
        experts.expert_neuron_summary(cache, 1)
    with pytest.raises(ValueError, match=r"expert=6 is out of range: the model has 6 experts per mixture"):
        experts.expert_neuron_activations(cache, 0, 6)
    with pytest.raises(KeyError, match="expert_usage needs the activations"):
        experts.expert_usage(qwen_moe.run_with_cache(TOKENS, names_filter=["blocks.0.hook_mlp_out"])[1])
    with pytest.raises(ValueError, match="block 0's MLP is a mixture of experts.*analysis.readouts.experts"):
        cache.stack_neuron_results(layer=1)
    with pytest.raises(ValueError, match="expand_neurons=True.*mixture of experts.*expand_neurons=False"):
        cache.get_full_resid_decomposition(expand_neurons=True)
    layers = cache.get_full_resid_decomposition(expand_neurons=False)  # each MLP layer's output instead
    torch.testing.assert_close(layers.sum(dim=0), cache["resid_post", -1], atol=1e-5, rtol=1e-5)


def test_a_model_without_experts_is_told_so(gemma2):
    with pytest.raises(ValueError, match="this model has no mixture of experts"):
        experts.moe_layers(gemma2)


# --- figures and the report -----------------------------------------------------------------------
def test_expert_figures(qwen_moe):
    _, cache = qwen_moe.run_with_cache(TOKENS[:1])
    usage = experts.expert_usage(cache)
    fig = plots.plot_expert_usage(usage.fraction(), ["L0", "L2"], title="usage")
    assert (
        fig.data[0].z[1][3] == pytest.approx(float(usage.fraction()[1, 3])) and fig.layout.xaxis.title.text == "expert"
    )
    tokens = [str(t) for t in TOKENS[0].tolist()]
    assert len(plots.plot_token_routing(usage.weights[0, 0], tokens).data[0].z) == 9
    assert plots.plot_expert_attribution(torch.randn(2, 6), ["L0", "L2"]).data[0].zmid == 0
    with pytest.raises(ValueError, match="got 1 layer labels for 2 entries"):
        plots.plot_expert_usage(usage.fraction(), ["L0"])


def test_the_report_of_a_mixture_and_of_a_capped_gemma():
    moe = from_pretrained(tiny_moe("mixtral-top2-window"))
    report = build_report(moe, TOKENS[0])
    assert [section.key for section in report.sections] == list(EXPERTS_DISPLAY_ORDER)
    data = report["experts"].data
    torch.testing.assert_close(
        data.attribution.total()[:, 0], report["attribution"].data.attribution.mlp[data.layers, 0]
    )
    assert report["neurons"].title == "Expert neurons" and "mixture of 4 experts" in report["model"].paragraphs[0]
    gemma = build_report(from_pretrained(tiny_gemma("gemma2-capped-window")), TOKENS[0])
    assert [section.key for section in gemma.sections] == list(DISPLAY_ORDER)
    assert "what is split is the logit before the cap" in gemma["attribution"].paragraphs[-1]
    assert "(before the soft-cap)" in gemma.summary[-1]

"""Several prompts' attribution graphs from shared, left-padded backward passes: each equals its prompt's graph alone,
on every architecture and transcoder kind, and padding that leaked would show."""

import gc
import multiprocessing
import sys
import weakref

import pytest
import torch

from analysis.attribution_graphs import (
    MemoryBudgetError,
    ReplacementModel,
    attribute,
    attribute_prompts,
    plan_prompts,
    random_transcoders,
)
from analysis.attribution_graphs.batched import PaddedPrompts, length_groups, rows_per_prompt
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.moe.recipe import MoEConfig

from .attribution_graph_helpers import CONFIGS, PROMPT, folded, intervention_effects, measure_peak, transcoders
from .perturbed import SMALL_SHAPE as SHAPE
from .perturbed import perturbed_decoder

# unequal lengths: the shortest is padded by 8 positions, past the 3-position sliding window, as every prompt shares
# the passes whatever its padding (SHARE)
PROMPTS = [PROMPT, torch.tensor([4, 2]), torch.tensor([3, 3, 8, 1, 0, 6, 2, 5, 7, 1])]
SHARE = float("inf")


def assert_same_graphs(batched, alone, atol):
    for graph, expected in zip(batched, alone, strict=True):
        assert torch.equal(graph.tokens, expected.tokens) and torch.equal(graph.logit_tokens, expected.logit_tokens)
        assert torch.equal(graph.active_features, expected.active_features)
        assert graph.adjacency_matrix.abs().max() > 0.5  # a graph with edges to compare
        for field in ("adjacency_matrix", "bias", "logit_values", "activation_values"):
            torch.testing.assert_close(getattr(graph, field), getattr(expected, field), rtol=0, atol=atol)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("kind", ["jumprelu", "skip", "clt_topk"])
def test_batched_graphs_equal_one_by_one_at_float64_precision(name, kind):
    model = folded(name, torch.float64)
    tc = transcoders(model, kind)
    batched = attribute_prompts(model, tc, PROMPTS, batch_size=16, max_padding=SHARE)
    assert_same_graphs(batched, [attribute(model, tc, p, batch_size=16) for p in PROMPTS], atol=1e-12)


def test_batched_graphs_in_float32_are_one_by_ones_up_to_rounding():
    model = folded("llama_gqa")
    tc = transcoders(model, "topk")
    batched = attribute_prompts(model, tc, PROMPTS, batch_size=7, max_padding=SHARE)
    assert_same_graphs(batched, [attribute(model, tc, p) for p in PROMPTS], atol=2e-6)


@pytest.mark.parametrize("name", ["gemma3_qk_norms_windows", "moe_experts"])
def test_windows_qk_norms_and_experts_batch_too(name):
    cfg = {
        "gemma3_qk_norms_windows": lambda: GemmaConfig(
            **SHAPE, n_key_value_heads=2, post_norms=True, qk_norm=True, query_pre_attn_scalar=7.0, sliding_window=3
        ),
        "moe_experts": lambda: MoEConfig(**dict(SHAPE, d_mlp=8, n_key_value_heads=2), n_experts=4, experts_per_token=2),
    }[name]()
    model = perturbed_decoder(cfg, dtype=torch.float64)
    tc = random_transcoders(model, 20, reads="stream")
    batched = attribute_prompts(model, tc, PROMPTS, batch_size=9, max_padding=SHARE)
    assert_same_graphs(batched, [attribute(model, tc, p) for p in PROMPTS], atol=1e-12)


def test_each_batched_edge_is_an_intervention_on_its_own_prompt():
    model = folded("gpt2")
    tc = transcoders(model, "jumprelu")
    for prompt, graph in zip(PROMPTS, attribute_prompts(model, tc, PROMPTS, batch_size=5, max_padding=SHARE)):
        replacement = ReplacementModel(model, tc, prompt)
        with pytest.raises(ValueError, match=f"node {graph.logits.start} is a logit node"):
            replacement.run_without(graph, [[graph.logits.start]])
        with pytest.raises(ValueError, match="targets must be feature or logit nodes"):
            replacement.intervention_effects(graph, [graph.errors.start], [0])
        effects = intervention_effects(replacement, graph)
        edges = graph.adjacency_matrix[:, : graph.logits.start]
        torch.testing.assert_close(edges[graph.features], effects[graph.features], rtol=0, atol=1e-3)
        torch.testing.assert_close(edges[graph.logits], effects[graph.logits], rtol=0, atol=1e-5)


def test_padding_that_reached_the_prompt_would_change_the_graph(monkeypatch):
    # the check above can fail: the same passes with the padded keys given attention differ from one by one
    model = folded("llama_gqa", torch.float64)
    tc = transcoders(model, "jumprelu")
    alone = attribute(model, tc, PROMPTS[1])
    frozen = PaddedPrompts._frozen

    def leaky(self):
        values = frozen(self)
        for name in self.replacements[0].pattern_names:
            values[name] = values[name] + (values[name] == 0) * 0.1
        return values

    monkeypatch.setattr(PaddedPrompts, "_frozen", leaky)
    leaked = attribute_prompts(model, tc, PROMPTS, batch_size=16, max_padding=SHARE)[1]
    assert (leaked.adjacency_matrix - alone.adjacency_matrix).abs().max() > 1e-3


def test_rows_are_shared_for_the_fewest_passes():
    assert rows_per_prompt([10, 10], 8) == [4, 4]  # 3 passes
    assert rows_per_prompt([30, 3, 3], 12) == [10, 1, 1]  # 3 passes: 30 / 10
    assert rows_per_prompt([5], 32) == [5]  # one pass
    assert rows_per_prompt([7, 1, 1], 3) == [1, 1, 1]  # 7 passes: a row each
    with pytest.raises(ValueError, match="4 prompts cannot share passes of 3 rows"):
        rows_per_prompt([1, 1, 1, 1], 3)


def test_prompts_share_passes_with_prompts_of_about_their_length():
    assert length_groups([6, 2, 10, 4, 4], 2, float("inf")) == [[1, 3], [4, 0], [2]]
    assert length_groups([6, 2, 10, 4, 5], 8, 0.25) == [[1], [3, 4], [0], [2]]  # 5 <= 1.25 * 4; 6 > 1.25 * 4
    assert length_groups([8, 8, 8], 8, 0.0) == [[0, 1, 2]]


def test_a_prompt_alone_in_its_group_gets_attributes_graph_bit_for_bit():
    model = folded("gpt2")
    tc = transcoders(model, "topk")
    for graph, prompt in zip(attribute_prompts(model, tc, PROMPTS), PROMPTS, strict=True):  # 6, 2, 10: none share
        assert torch.equal(graph.adjacency_matrix, attribute(model, tc, prompt).adjacency_matrix)


def test_more_prompts_than_rows_go_in_groups_and_come_back_in_order():
    model = folded("llama_gqa", torch.float64)
    tc = transcoders(model, "clt_topk")
    prompts = PROMPTS + [PROMPT[:4], PROMPT[2:]]  # 6, 2, 10, 4, 4 tokens
    batched = attribute_prompts(model, tc, prompts, batch_size=2, max_padding=SHARE)
    assert len(plan_prompts(model, tc, prompts, batch_size=2, max_padding=SHARE)) == 3
    assert_same_graphs(batched, [attribute(model, tc, p) for p in prompts], atol=1e-12)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak resident memory from /proc")
def test_planned_peak_of_shared_passes_is_within_15_percent_of_the_measured_peak():
    context = multiprocessing.get_context("spawn")  # a fresh heap, as for one prompt's plan
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=measure_peak, args=(send, True))
    child.start()
    assert receive.poll(240), "the measuring process did not answer in 240 s"
    result = receive.recv()
    child.join()
    assert "error" not in result, result
    assert result["measured"] > 150e6
    assert abs(result["planned"] - result["measured"]) <= 0.15 * result["measured"], result


def test_bad_prompts_and_budgets_are_refused():
    model = folded("gpt2")
    tc = transcoders(model, "jumprelu")
    for prompts in ([], PROMPT, "text"):
        with pytest.raises(ValueError, match="prompts must be a non-empty list"):
            attribute_prompts(model, tc, prompts)
    with pytest.raises(ValueError, match="max_padding must be a number >= 0"):
        attribute_prompts(model, tc, PROMPTS, max_padding=-1)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        attribute_prompts(model, tc, PROMPTS, batch_size=0)
    with pytest.raises(MemoryBudgetError, match=r"above the budget of .* \(1000 bytes\)"):
        attribute_prompts(model, tc, PROMPTS, memory_budget=1000, max_padding=SHARE)
    with pytest.raises(ValueError, match="tokens"):
        attribute_prompts(model, tc, [PROMPT, torch.tensor([[1, 2], [3, 4]])])


def test_the_retained_graph_is_freed_when_the_passes_end():
    # the name `with ... as grads` binds outlives the block: it must not keep the graph (memory the plan frees)
    model = folded("llama_gqa")
    tc = transcoders(model, "jumprelu")
    replacements = [ReplacementModel(model, tc, p) for p in PROMPTS]
    for passes in (replacements[0].backward_pass(4), PaddedPrompts(replacements, [2, 1, 3]).backward_pass()):
        with passes as grads:
            held = [weakref.ref(grads.normed), weakref.ref(grads.outs[0]), weakref.ref(grads.inputs[-1])]
            assert all(ref() is not None for ref in held)
        gc.collect()
        assert all(ref() is None for ref in held)

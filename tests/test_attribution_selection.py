"""Attribution graphs kept to the features of most influence (``max_feature_nodes``).

References: the full graph (every active feature a node) computed on the same prompt, interventions in the
replacement model, each node's value, and the influence of the full graph's pruning module.
"""

import pytest
import torch

from analysis.attribution_graphs import ReplacementModel, attribute, node_influence, plan_memory
from analysis.attribution_graphs.attribute import partial_influence

from .attribution_graph_helpers import PROMPT, folded, intervention_effects, transcoders


@pytest.fixture(scope="module", params=["topk", "clt_topk"])
def setup(request):
    model = folded("llama_gqa", torch.float64)
    tc = transcoders(model, request.param)
    full = attribute(model, tc, PROMPT, batch_size=8)
    kept = attribute(model, tc, PROMPT, batch_size=8, max_feature_nodes=13)
    return model, tc, full, kept


def test_only_the_visited_features_are_nodes_and_their_edges_are_the_full_graphs(setup):
    _, _, full, kept = setup
    assert kept.n_features == 13 and full.n_features > 13
    assert torch.equal(kept.active_features, full.active_features[kept.selected_features])
    assert bool((kept.selected_features.diff() > 0).all())  # in (layer, pos, feature) order
    sources = torch.cat([kept.selected_features, torch.arange(full.n_features, full.logits.start)])
    targets = torch.cat([kept.selected_features, torch.arange(full.logits.start, full.n_nodes)])
    expected = full.adjacency_matrix[targets][:, sources]
    kept_targets = torch.cat([torch.arange(13), torch.arange(kept.logits.start, kept.n_nodes)])
    got = kept.adjacency_matrix[kept_targets][:, : kept.logits.start]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_every_node_still_sums_with_the_left_out_features_effect(setup):
    _, _, full, kept = setup
    targets = torch.cat([torch.arange(kept.n_features), torch.arange(kept.logits.start, kept.n_nodes)])
    sums = kept.adjacency_matrix[targets].sum(1) + kept.bias[targets] + kept.unselected_effect[targets]
    torch.testing.assert_close(sums, kept.values[targets], rtol=0, atol=1e-10)
    assert kept.unselected_effect[targets].abs().max() > 1e-3  # the left-out features do matter
    assert not full.unselected_effect.any()


def test_edges_of_a_kept_graph_are_interventions(setup):
    model, tc, _, kept = setup
    replacement = ReplacementModel(model, tc, PROMPT)
    effects = intervention_effects(replacement, _as_full_indexing(kept, replacement.n_features))
    edges = kept.adjacency_matrix
    sources = torch.cat([kept.selected_features, torch.arange(replacement.n_features, effects.shape[1])])
    targets = torch.cat([kept.selected_features, torch.arange(effects.shape[0] - kept.n_logits, effects.shape[0])])
    kept_targets = torch.cat([torch.arange(kept.n_features), torch.arange(kept.logits.start, kept.n_nodes)])
    torch.testing.assert_close(
        edges[kept_targets][:, : kept.logits.start], effects[targets][:, sources], rtol=0, atol=1e-9
    )


def _as_full_indexing(kept, n_features):
    """A stand-in graph whose node indexing is the full graph's (the intervention helper scales by node)."""
    from analysis.attribution_graphs.graph import AttributionGraph

    replacement_features = kept.active_features.new_zeros(n_features, 3)
    replacement_features[kept.selected_features] = kept.active_features
    n_nodes = n_features + kept.n_nodes - kept.n_features
    return AttributionGraph(
        tokens=kept.tokens,
        active_features=replacement_features,
        activation_values=torch.zeros(n_features, dtype=kept.bias.dtype),
        logit_tokens=kept.logit_tokens,
        logit_probabilities=kept.logit_probabilities,
        logit_values=kept.logit_values,
        adjacency_matrix=torch.zeros(n_nodes, n_nodes, dtype=kept.bias.dtype),
        bias=torch.zeros(n_nodes, dtype=kept.bias.dtype),
        n_layers=kept.n_layers,
    )


def test_partial_influence_over_every_row_is_the_graphs_influence(setup):
    _, _, full, _ = setup
    targets = torch.cat([torch.arange(full.n_features), torch.arange(full.logits.start, full.n_nodes)])
    rows = full.adjacency_matrix[targets]
    got = partial_influence(rows, targets, full.logit_weights())
    torch.testing.assert_close(got, node_influence(full), rtol=1e-12, atol=1e-15)


def test_the_first_features_visited_are_the_logits_strongest_inputs(setup):
    _, _, full, kept = setup
    logit_rows = full.adjacency_matrix[full.logits, : full.n_features].abs()
    weights = full.logit_probabilities.double()
    direct = weights @ (logit_rows / full.adjacency_matrix[full.logits].abs().sum(1, keepdim=True))
    first = set(direct.topk(8).indices.tolist())  # the first chunk after the logits: batch_size=8
    assert first <= set(kept.selected_features.tolist())


def test_the_plan_counts_the_visited_rows_and_bad_counts_are_refused(setup):
    model, tc, full, _ = setup
    everything = plan_memory(model, tc, n_pos=6, n_features=full.n_features, batch_size=8)
    some = plan_memory(model, tc, n_pos=6, n_features=full.n_features, batch_size=8, max_feature_nodes=13)
    n_sources = full.logits.start
    rows = (full.n_logits + 13) * n_sources * 8
    kept = 13 + n_sources - full.n_features + full.n_logits
    assert (some.adjacency, some.influence, some.assembly) == (rows, rows, kept * kept * 8)
    assert some.peak == some.prompt + rows + max(some.graph + max(some.backward, rows), kept * kept * 8)
    assert everything.adjacency == full.n_nodes**2 * 8 and everything.assembly == 0
    assert everything.peak == everything.prompt + everything.adjacency + everything.graph + everything.backward
    assert "13 visited" in str(some)
    with pytest.raises(ValueError, match="max_feature_nodes must be an int >= 0 or None, got -1"):
        attribute(model, tc, PROMPT, max_feature_nodes=-1)


def test_special_token_positions_have_no_features_and_the_graph_stays_exact():
    """Features at a special token's position (the BOS, which transcoders are not trained on) are left out: that
    position's MLP write is all error, and every identity still holds."""
    model = folded("llama_gqa", torch.float64)
    tc = transcoders(model, "topk")
    special = int(PROMPT[0])
    graph = attribute(model, tc, PROMPT, batch_size=8, exclude_special_tokens=[special])
    everything = attribute(model, tc, PROMPT, batch_size=8, exclude_special_tokens=False)
    excluded = special == PROMPT
    assert excluded.any() and not excluded[graph.active_features[:, 1]].any()
    assert set(map(tuple, graph.active_features.tolist())) == {
        tuple(f) for f in everything.active_features.tolist() if not excluded[f[1]]
    }
    replacement = ReplacementModel(model, tc, PROMPT, exclude_special_tokens=[special])
    with torch.no_grad():
        torch.testing.assert_close(replacement.run(all_positions=True).logits[0], model(PROMPT)[0], rtol=0, atol=1e-12)
    effects = intervention_effects(replacement, graph)
    sources = slice(0, graph.logits.start)
    torch.testing.assert_close(graph.adjacency_matrix[graph.logits, sources], effects[graph.logits], rtol=0, atol=1e-10)
    targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logits.start, graph.n_nodes)])
    sums = graph.adjacency_matrix[targets].sum(1) + graph.bias[targets]
    torch.testing.assert_close(sums, graph.values[targets], rtol=0, atol=1e-10)

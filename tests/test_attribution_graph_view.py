"""analysis.attribution_graphs.view: the graph view's data against the graph it shows, its intervention predictions
against dense references, feature information against a brute-force pass over the corpus, bad input, and the page
in a browser (skipped without Chromium and playwright, unless REQUIRE_BROWSER=1)."""

import json
import re

import numpy as np
import pytest
import torch

from analysis.attribution_graphs import attribute, prune_graph, random_transcoders
from analysis.attribution_graphs.feature_info import feature_info_from
from analysis.attribution_graphs.view import (
    NODE_STEP,
    graph_view,
    intervention_command,
    logit_path_sums,
    node_id,
)
from tests.browser import BrowserSession, require_browser
from tests.test_views_browser import assert_clean, mounted_ids, open_views

from .attribution_graph_helpers import PROMPT, folded, hand_graph
from .attribution_graph_helpers import transcoders as transcoders_of_kind

CORPUS = torch.randint(0, 31, (8, 10), generator=torch.Generator().manual_seed(3))
K, N_LOGITS = 4, 3


@pytest.fixture(scope="module")
def model():
    model = folded("llama_gqa", torch.float64)
    with torch.no_grad():  # a final norm weight other than 1, so that the logit effects must read through it
        model.final_norm.w.mul_(1 + 0.5 * torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(4)))
    return model


@pytest.fixture(scope="module")
def transcoders(model):
    return random_transcoders(model, 20, threshold=0.05)


@pytest.fixture(scope="module")
def graph(model, transcoders):
    return attribute(model, transcoders, PROMPT)


@pytest.fixture(scope="module")
def pruned(graph):
    return prune_graph(graph, node_threshold=0.9, edge_threshold=0.98)


@pytest.fixture(scope="module")
def info(model, transcoders, graph, pruned):
    return feature_info_from(model, transcoders, graph, CORPUS, pruned=pruned, k=K, n_logits=N_LOGITS)


@pytest.fixture(scope="module")
def view(graph, pruned, info):
    return graph_view(graph, pruned=pruned, feature_info=info, model_name="tiny-llama")


def payload(view) -> dict:
    """The view's data, as the page holds it."""
    html = view.to_html(full_page=True)
    (found,) = re.findall(r'<script type="application/json" class="itv-data">(.*?)</script>', html)
    return json.loads(found)


# --- what is embedded ----------------------------------------------------------------------------------------------


def test_the_page_holds_exactly_the_kept_nodes_and_edges_with_their_weights(view, graph, pruned):
    data = payload(view)
    assert data["kind"] == "attribution_graph"
    kept = pruned.node_mask.nonzero().flatten().tolist()
    assert int(pruned.node_mask[graph.features].sum()) > 3 and [node["index"] for node in data["nodes"]] == kept
    assert [node["id"] for node in data["nodes"]] == [node_id(graph, n) for n in kept]
    assert [node["label"] for node in data["nodes"]] == [graph.label(n) for n in kept]
    index = {node["id"]: node["index"] for node in data["nodes"]}
    edges = {(index[e["source"]], index[e["target"]]): e["weight"] for e in data["edges"]}
    targets, sources = pruned.edge_mask.nonzero(as_tuple=True)
    expected = {(s, t): float(graph.adjacency_matrix[t, s]) for t, s in zip(targets.tolist(), sources.tolist())}
    assert len(data["edges"]) == len(expected) > 50 and edges == expected  # exact: JSON keeps every bit of a float
    by_index = {node["index"]: node for node in data["nodes"]}
    for n in kept[:5] + kept[-3:]:
        value = by_index[n]["value"]
        assert value == (float(graph.values[n]) if graph.kind(n) in ("feature", "logit") else None)


def test_direct_predictions_are_the_adjacency_entries_into_the_logits(view, graph):
    features = [node for node in payload(view)["nodes"] if node["kind"] == "feature"]
    for node in features:
        assert node["direct"] == graph.adjacency_matrix[graph.logits, node["index"]].double().tolist()
    assert any(abs(value) > 1e-3 for node in features for value in node["direct"])


def test_path_sums_equal_a_dense_solve_of_i_minus_a(view, graph):
    adjacency = graph.adjacency_matrix.double()
    eye = torch.eye(graph.n_nodes, dtype=torch.float64)
    reference = torch.linalg.solve(eye - adjacency, eye)[graph.logits]
    torch.testing.assert_close(logit_path_sums(graph), reference, rtol=0, atol=1e-12)
    features = [node for node in payload(view)["nodes"] if node["kind"] == "feature"]
    for node in features:
        np.testing.assert_allclose(node["total"], reference[:, node["index"]].numpy(), rtol=0, atol=1e-12)
    # not the direct effect alone: some feature reaches the logits through other features too
    assert max(np.abs(np.array(node["total"]) - node["direct"]).max() for node in features) > 1e-4


def test_path_sums_by_hand():
    # token -> logit: -1 directly, and 2 * 3 through the feature; feature -> logit: 3
    sums = logit_path_sums(hand_graph(1.0))
    assert sums[0].tolist() == [3.0, 1.0, 5.0, 1.0]


def test_feature_info_agrees_with_a_brute_force_pass(model, transcoders, graph, pruned, info):
    kept = graph.active_features[pruned.node_mask[graph.features]]
    assert set(info) == {(layer, feature) for layer, _, feature in kept.tolist()}
    (layer, feature), entry = max(info.items(), key=lambda item: len(item[1]["top_activations"]))
    sae = transcoders[layer]
    with torch.no_grad():
        _, cache = model.run_with_cache(CORPUS, names_filter=[sae.hook_name])
        pre = cache[sae.hook_name] @ sae.W_enc[:, feature] + sae.b_enc[feature]
        acts = pre * (pre > sae.threshold[feature])  # JumpReLU
    values, flat = acts.flatten().topk(K)
    assert len(entry["top_activations"]) == int((values > 0).sum()) >= 2
    for (context, value), expected, at in zip(entry["top_activations"], values.tolist(), flat.tolist()):
        text, pos = divmod(at, CORPUS.shape[1])
        ids = CORPUS[text].tolist()
        before, after = ids[max(0, pos - 8) : pos], ids[pos + 1 : pos + 5]
        assert context == " ".join([*map(str, before), f"«{ids[pos]}»", *map(str, after)])
        assert value == pytest.approx(expected, rel=1e-6)
    effect = (sae.W_dec[feature] * model.final_norm.w) @ model.W_U
    for name, largest in (("top_logits", True), ("bottom_logits", False)):
        top = effect.topk(N_LOGITS, largest=largest)
        assert [token for token, _ in entry[name]] == [str(i) for i in top.indices.tolist()]
        np.testing.assert_allclose([v for _, v in entry[name]], top.values.detach().numpy(), rtol=1e-12)


def test_a_cross_layer_transcoders_logit_effect_is_its_write_to_its_own_layer(model):
    clt = transcoders_of_kind(model, "clt_jumprelu")
    graph = attribute(model, clt, PROMPT)
    info = feature_info_from(model, clt, graph, CORPUS, k=1, n_logits=N_LOGITS)
    (layer, feature), entry = min(info.items())  # layer 0: it writes to layer 1 too, which is not its own write
    assert layer == 0 and clt.W_dec[layer].shape[1] == 2
    effect = (clt.W_dec[layer][feature, 0] * model.final_norm.w) @ model.W_U
    top = effect.topk(N_LOGITS)
    assert [token for token, _ in entry["top_logits"]] == [str(i) for i in top.indices.tolist()]
    np.testing.assert_allclose([v for _, v in entry["top_logits"]], top.values.detach().numpy(), rtol=1e-12)


def test_feature_info_of_kept_features_is_embedded(view, info):
    data = payload(view)
    expected = {f"L{layer}:F{feature}": entry for (layer, feature), entry in info.items()}
    assert data["featureInfo"] == json.loads(json.dumps(expected))
    for node in data["nodes"]:
        if node["kind"] == "feature":
            assert node["info"] == node["id"].split("@")[0]


def test_rows_run_from_the_embeddings_up_to_the_logits_and_cells_do_not_overlap(view, graph):
    data = payload(view)
    rows = {row["label"]: row["y"] for row in data["rows"]}
    names = ["embed"] + [f"L{layer}" for layer in range(graph.n_layers)] + ["logits"]
    assert list(rows) == names and all(rows[a] > rows[b] for a, b in zip(names, names[1:]))  # y grows downwards
    cells = {}
    for node in data["nodes"]:
        row = {"token": "embed", "logit": "logits"}.get(node["kind"], f"L{node['layer']}")
        assert node["y"] == rows[row]
        cells.setdefault((node["y"], node["pos"]), []).append(node["x"])
    columns = [column["x"] for column in data["columns"]]
    for (_, pos), xs in cells.items():
        xs = sorted(xs)
        assert all(b - a >= NODE_STEP - 0.02 for a, b in zip(xs, xs[1:]))
        assert all(columns[pos - 1] < x if pos else True for x in xs)
        assert all(x < columns[pos + 1] for x in xs) if pos + 1 < len(columns) else True


def test_the_page_is_offline_and_carries_its_script(view):
    html = view.to_html(full_page=True)
    for forbidden in ("http://", "https://", "<script src"):
        assert forbidden not in html
    assert "lib.kinds.attribution_graph" in html, (
        "graph_view.js must be listed in analysis/views/view.py's _SCRIPT_FILES, as the other views' scripts are"
    )


def test_the_command_ablates_or_steers_the_features_to_scale_times_their_activation(graph, view):
    features = [node_id(graph, 0), node_id(graph, 3)]
    assert features[0].startswith("L0:F") and features[0].endswith(f"@{int(graph.active_features[0, 1])}")
    prefix = "interp-transformer graph --model tiny-llama --prompt '1 5 9 2 7 3'"  # no tokenizer: the token ids
    assert payload(view)["command"] == {"prefix": prefix, "ablate": "--ablate", "steer": "--steer"}
    assert intervention_command(graph, features, 0.0, "tiny-llama") == f"{prefix} --ablate {' '.join(features)}"
    steer = intervention_command(graph, features, 0.5, "tiny-llama")
    assert steer.startswith(f"{prefix} --steer ")
    specs = steer.removeprefix(f"{prefix} --steer ").split(" ")
    assert [spec.split("=")[0] for spec in specs] == features
    expected = [0.5 * float(graph.activation_values[node]) for node in (0, 3)]
    np.testing.assert_allclose([float(spec.split("=")[1]) for spec in specs], expected, rtol=1e-5)
    assert intervention_command(graph, features[:1], prompt="the cat").startswith(
        "interp-transformer graph --model MODEL --prompt 'the cat' --ablate "
    )
    with pytest.raises(ValueError, match=r"ids of the graph's active features .* \['L9:F1@0'\] are not"):
        intervention_command(graph, ["L9:F1@0"])


# --- bad input -----------------------------------------------------------------------------------------------------


def test_a_pruning_of_another_graph_is_refused(graph):
    other = prune_graph(hand_graph(1.0))
    with pytest.raises(ValueError, match=rf"node_mask must have shape \[{graph.n_nodes}\] .* got \[4\]"):
        graph_view(graph, pruned=other)
    with pytest.raises(TypeError, match="pruned must be a PruneResult .* got dict"):
        graph_view(graph, pruned={"node_mask": 1})
    dangling = prune_graph(graph)
    dropped = int((~dangling.node_mask).nonzero()[0, 0])
    dangling.edge_mask[graph.logits.start, dropped] = True
    with pytest.raises(ValueError, match=f"keeps 1 edges at nodes it drops, e.g. {re.escape(graph.label(dropped))}"):
        graph_view(graph, pruned=dangling)


def test_feature_info_for_a_feature_not_in_the_graph_is_refused(graph, info):
    entry = next(iter(info.values()))
    n_active = len({(layer, feature) for layer, _, feature in graph.active_features.tolist()})
    with pytest.raises(KeyError, match=rf"\(layer, feature\) = \(0, 999\), .* one of its {n_active} active"):
        graph_view(graph, feature_info={(0, 999): entry})
    key = next(iter(info))
    with pytest.raises(KeyError, match=r"missing \['bottom_logits'\], unexpected \[\]"):
        graph_view(graph, feature_info={key: {"top_activations": [], "top_logits": []}})
    with pytest.raises(TypeError, match=r"\['top_logits'\] must be a list of \(str, finite number\) pairs"):
        graph_view(graph, feature_info={key: {**entry, "top_logits": [(3, 0.5)]}})
    with pytest.raises(TypeError, match=r"keys must be \(layer, feature\) pairs of ints, got 'L0:F1'"):
        graph_view(graph, feature_info={"L0:F1": entry})


def test_other_bad_input(model, transcoders, graph):
    with pytest.raises(TypeError, match="takes an AttributionGraph .* got dict"):
        graph_view({})
    with pytest.raises(ValueError, match="node_threshold must be a fraction in \\[0, 1\\], got 2"):
        graph_view(graph, node_threshold=2)
    others = random_transcoders(model, 20, threshold=0.05, seed=1)
    with pytest.raises(ValueError, match="differ from these transcoders' on its prompt .* expected the model and"):
        feature_info_from(model, others, graph, CORPUS)
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        feature_info_from(model, transcoders, graph, CORPUS, k=0)


# --- in a browser --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with BrowserSession() as session:
        yield session


_SHOWN_JS = """(selector) => Array.from(document.querySelectorAll(selector))
    .filter((node) => node.style.display !== 'none').map((node) => node.getAttribute('data-node')
    || node.getAttribute('data-source') + '>' + node.getAttribute('data-target'))"""


def test_hover_click_pin_and_intervene_in_a_browser(browser, tmp_path, view, graph, pruned):
    data = view.data
    nodes = {node["id"]: node for node in data["nodes"]}
    features = [node["id"] for node in data["nodes"] if node["kind"] == "feature"]
    busiest = max(features, key=lambda f: sum(f in (e["source"], e["target"]) for e in data["edges"]))
    with open_views(browser, tmp_path, [view], "graph", viewport=(1600, 1000)) as opened:
        page = opened.page
        (root,) = mounted_ids(page, 1)
        shape = f"#{root} .itv-gnode[data-node='{{}}'] > :first-child"
        assert page.locator(f"#{root} .itv-gnode").count() == len(nodes)
        assert page.locator(f"#{root} .itv-edge").count() == int(pruned.edge_mask.sum())

        page.hover(shape.format(busiest))
        assert page.text_content(f"#{root} > .itv-status") == nodes[busiest]["title"]

        page.click(shape.format(busiest))
        assert page.get_attribute(f"#{root}", "data-selected") == busiest
        for end, table, key in (("target", "in", "source"), ("source", "out", "target")):
            edges = [e for e in data["edges"] if e[end] == busiest]
            top = sorted(edges, key=lambda e: -abs(e["weight"]))[: data["topEdges"]]
            rows = page.locator(f"#{root} .itv-graph-{table} tr")
            assert [rows.nth(i).get_attribute("data-node") for i in range(rows.count())] == [e[key] for e in top]
            assert [float(rows.nth(i).get_attribute("data-weight")) for i in range(rows.count())] == [
                e["weight"] for e in top
            ]
        info = data["featureInfo"][nodes[busiest]["info"]]
        assert page.locator(f"#{root} .itv-graph-activations tr").count() == len(info["top_activations"])
        assert page.locator(f"#{root} .itv-graph-top-logits tr").count() == N_LOGITS

        other = next(f for f in features if f != busiest)
        page.click(shape.format(busiest), modifiers=["Shift"])
        page.click(shape.format(other), modifiers=["Shift"])
        assert page.input_value(f"#{root} .itv-graph-pinned") == f"{busiest},{other}"
        page.check(f"#{root} .itv-graph-only")
        assert page.evaluate(_SHOWN_JS, f"#{root} .itv-gnode") == [f for f in nodes if f in (busiest, other)]
        among = [
            f"{e['source']}>{e['target']}" for e in data["edges"] if {e["source"], e["target"]} <= {busiest, other}
        ]
        assert page.evaluate(_SHOWN_JS, f"#{root} .itv-edge") == among

        page.click(f"#{root} .itv-graph-use-pinned")
        page.check(f"#{root} input[type=radio][value=scale]")
        page.fill(f"#{root} .itv-graph-scale", "0.5")
        chosen = [busiest, other]
        for j, logit in enumerate(data["logits"]):
            row = f"#{root} .itv-graph-predictions tr[data-logit='{logit['id']}']"
            for cell, field in (("direct", "direct"), ("total", "total")):
                expected = -0.5 * sum(nodes[f][field][j] for f in chosen)
                assert float(page.get_attribute(f"{row} .itv-graph-{cell}", "data-value")) == pytest.approx(
                    expected, rel=1e-12, abs=1e-15
                )
        assert page.input_value(f"#{root} .itv-graph-command") == intervention_command(graph, chosen, 0.5, "tiny-llama")
        page.check(f"#{root} input[type=radio][value=ablate]")
        assert page.input_value(f"#{root} .itv-graph-command") == intervention_command(graph, chosen, 0.0, "tiny-llama")
        assert_clean(opened)

"""analysis.views.circuit_view: the graph's payload on a hand-made EdgeScores, its input checks, and in a browser
that clicking a head shows its pattern (skipped without Chromium and playwright, unless REQUIRE_BROWSER=1)."""

import json
import re

import numpy as np
import pytest
import torch

from analysis.discovery.edges import EdgeScores
from analysis.views import circuit_view, colours
from analysis.views.circuit import MAX_WIDTH, MIN_WIDTH, NODE_HEIGHT, NODE_WIDTH, NodeName, parse_node
from tests.browser import BrowserSession, require_browser
from tests.test_views_browser import assert_clean, expect_painted, mounted_ids, open_views

# Two layers of two query heads sharing one key/value head (grouped-query attention), an MLP each.
UPSTREAM = ["input", "L0H0", "L0H1", "MLP0", "L1H0", "L1H1", "MLP1"]
READERS = ["L0H0.q", "L0H1.q", "L0K0.k", "L0K0.v", "MLP0", "L1H0.q", "L1H1.q", "L1K0.k", "L1K0.v", "MLP1", "logits"]
# (upstream, reader): scores on the two prompts. Every other edge scores 0.
KNOWN = {
    ("input", "L0H0.q"): [3.0, 1.0],  # mean 2
    ("input", "L0K0.k"): [1.0, 1.0],  # mean 1
    ("L0H1", "L1K0.v"): [-1.0, -2.0],  # mean -1.5
    ("L0H0", "L1H0.q"): [0.5, 0.5],  # mean 0.5
    ("L1H0", "logits"): [4.0, 4.0],  # mean 4
    ("MLP0", "logits"): [-0.25, -0.75],  # mean -0.5
    ("input", "logits"): [0.1, -0.1],  # mean 0: never drawn by default
}
TOKENS = ["<bos>", " Mary", " and", " John"]


def stage(name: str) -> float:
    """Where a name sits in the stream: layer l's heads read and write at l, its MLP at l + 0.5."""
    if name == "input":
        return -1.0
    if name == "logits":
        return 1e9
    parsed = parse_node(name)
    return parsed.layer + (0.5 if parsed.kind == "mlp" else 0.0)


def edge_scores(known=KNOWN, upstream=UPSTREAM, readers=READERS) -> EdgeScores:
    """Edges from every writer to every reader after it (a head feeds its own layer's MLP), ``known`` scores."""
    edge = torch.tensor([[stage(u) < stage(r) for r in readers] for u in upstream])
    scores = torch.zeros(len(upstream), len(readers), 2, dtype=torch.float64)
    for (u, r), values in known.items():
        assert edge[upstream.index(u), readers.index(r)], (u, r)
        scores[upstream.index(u), readers.index(r)] = torch.tensor(values, dtype=torch.float64)
    return EdgeScores(upstream, readers, edge, scores, "EAP")


def causal_pattern(n_pos: int, seed: int) -> torch.Tensor:
    scores = torch.randn(n_pos, n_pos, generator=torch.Generator().manual_seed(seed))
    return scores.masked_fill(~torch.ones(n_pos, n_pos).tril().bool(), float("-inf")).softmax(-1)


PATTERNS = {"L0H0": causal_pattern(4, 0), "L1H0": causal_pattern(4, 1), "L1H1": causal_pattern(4, 2)}


def by_id(view) -> dict:
    return {node["id"]: node for node in view.data["nodes"]}


def edge_of(view, upstream: str, reader: str) -> dict:
    (edge,) = [e for e in view.data["edges"] if (e["upstream"], e["reader"]) == (upstream, reader)]
    return edge


# --- names ---------------------------------------------------------------------------------------------------


def test_every_form_of_name_parses_to_its_node():
    assert [parse_node(name) for name in ("input", "L3H5", "L3H5.q", "L2K1.k", "L2K1.v", "MLP4", "logits")] == [
        NodeName("input", "input", None, 0, None),
        NodeName("L3H5", "head", 3, 5, None),
        NodeName("L3H5", "head", 3, 5, "q"),
        NodeName("L2K1", "kv", 2, 1, "k"),
        NodeName("L2K1", "kv", 2, 1, "v"),
        NodeName("MLP4", "mlp", 4, 0, None),
        NodeName("logits", "logits", None, 0, None),
    ]
    assert parse_node("L1.attn") == NodeName("L1.attn", "attn", 1, 0, None)
    assert parse_node("L1.mlp") == NodeName("L1.mlp", "sublayer_mlp", 1, 0, None)
    assert parse_node("L2E7") == NodeName("L2E7", "expert", 2, 7, None)
    assert parse_node("MLP2.E7") == NodeName("MLP2.E7", "expert", 2, 7, None)
    assert parse_node("MLP2.shared") == NodeName("MLP2.shared", "shared_expert", 2, 0, None)
    assert parse_node("L2H1.z").kind == parse_node("MLP").kind == parse_node("xL2H1").kind == "other"


# --- the graph -----------------------------------------------------------------------------------------------


def test_only_nodes_with_a_kept_edge_are_drawn_and_readers_join_their_nodes():
    view = circuit_view(edge_scores())
    nodes = by_id(view)
    assert set(nodes) == {"input", "L0H0", "L0H1", "L0K0", "MLP0", "L1H0", "L1K0", "logits"}  # no L1H1, no MLP1
    assert nodes["L0K0"]["ports"] == ["k", "v"] and nodes["L0H0"]["ports"] == []
    assert edge_of(view, "input", "L0H0.q")["target"] == "L0H0" and edge_of(view, "L0H1", "L1K0.v")["port"] == "v"
    assert repr(view) == "<View circuit: 6 edges among 8 nodes (EAP, 2 prompts)>"


def test_widths_grow_with_the_mean_magnitude_and_colours_follow_its_sign():
    view = circuit_view(edge_scores())
    edges = view.data["edges"]
    means = [edge["mean"] for edge in edges]
    assert means == [0.5, -0.5, 1, -1.5, 2, 4]  # drawn weakest first, so the strongest lie on top
    assert [edge["width"] for edge in edges] == [
        round(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * abs(m) / 4, 2) for m in means
    ]
    assert edges[-1]["width"] == MAX_WIDTH and edges[0]["width"] < edges[2]["width"] < edges[3]["width"]
    positive, negative = (
        "rgb({}, {}, {})".format(*colours.DIVERGING[-1][1]),
        "rgb({}, {}, {})".format(*colours.DIVERGING[0][1]),
    )
    assert [edge["colour"] for edge in edges] == [positive if m > 0 else negative for m in means]
    assert positive != negative


def test_rows_run_from_the_input_up_to_the_logits():
    view = circuit_view(edge_scores())
    y = {name: node["y"] for name, node in by_id(view).items()}
    assert y["input"] > y["L0H0"] == y["L0H1"] == y["L0K0"] > y["MLP0"] > y["L1H0"] == y["L1K0"] > y["logits"]
    nodes = by_id(view)
    assert nodes["L0H0"]["x"] < nodes["L0H1"]["x"] < nodes["L0K0"]["x"]  # heads in order, then key/value heads
    assert [row["label"] for row in view.data["rows"]] == ["input", "L0 attn", "L0 MLP", "L1 attn", "logits"]
    # The edge into L0K0's key input ends under the node's left half, at its bottom.
    end = re.findall(r"-?\d+\.\d", edge_of(view, "input", "L0K0.k")["path"])[-2:]
    assert [float(v) for v in end] == [nodes["L0K0"]["x"] - NODE_WIDTH / 4, nodes["L0K0"]["y"] + NODE_HEIGHT / 2]


def test_hover_titles_name_the_edge_and_its_scores():
    view = circuit_view(edge_scores(), prompt=1)
    edge = edge_of(view, "MLP0", "logits")
    assert edge["title"] == "MLP0 \u2192 logits: mean score -0.5 over 2 prompts; prompt 1: -0.75; range -0.75 to -0.25"
    assert edge["score"] == -0.75
    nodes = by_id(view)
    assert nodes["L0K0"]["title"].startswith("L0K0: key/value head 0 of layer 0, shared by query heads 0..1.")
    assert "1 kept edges in, summing to 1" in nodes["L0K0"]["title"]
    assert "2 kept edges out, summing to 3" in nodes["input"]["title"]  # input -> logits scores 0


def test_by_default_the_top_edges_by_mean_magnitude_are_kept():
    generator = torch.Generator().manual_seed(3)
    layers = 4
    upstream = ["input"] + [name for layer in range(layers) for name in (f"L{layer}H0", f"L{layer}H1", f"MLP{layer}")]
    readers = [name for layer in range(layers) for name in (f"L{layer}H0.q", f"L{layer}H1.q", f"MLP{layer}")]
    readers.append("logits")
    scores = edge_scores({}, upstream, readers)
    scores.scores = torch.randn(scores.scores.shape, generator=generator, dtype=torch.float64) * scores.edge[..., None]
    assert int(scores.edge.sum()) > 50
    view = circuit_view(scores)
    drawn = {(e["upstream"], e["reader"]) for e in view.data["edges"]}
    assert drawn == {(u, r) for u, r, _ in scores.top(50)}
    kept = torch.zeros_like(scores.edge)
    kept[upstream.index("L2H1"), readers.index("logits")] = True
    chosen = circuit_view(scores, kept)
    assert [(e["upstream"], e["reader"]) for e in chosen.data["edges"]] == [("L2H1", "logits")]
    assert set(by_id(chosen)) == {"L2H1", "logits"}


def test_an_edge_of_mean_zero_is_not_a_default_pick():
    view = circuit_view(edge_scores())
    assert ("input", "logits") not in {(e["upstream"], e["reader"]) for e in view.data["edges"]}


def test_names_of_other_forms_still_render():
    upstream, readers = ["input", "L0.attn", "L0E3", "bias"], ["L0.attn", "L0.mlp", "logits"]
    known = {("input", "L0.attn"): [1.0, 1.0], ("L0.attn", "L0.mlp"): [2.0, 2.0], ("L0E3", "logits"): [-1.0, -1.0]}
    edge = torch.ones(len(upstream), len(readers), dtype=torch.bool)
    scores = torch.zeros(len(upstream), len(readers), 2, dtype=torch.float64)
    for (u, r), values in {**known, ("bias", "L0.mlp"): [0.5, 0.5]}.items():
        scores[upstream.index(u), readers.index(r)] = torch.tensor(values, dtype=torch.float64)
    view = circuit_view(EdgeScores(upstream, readers, edge, scores, "EAP-IG"))
    nodes = by_id(view)
    assert {name: node["kind"] for name, node in nodes.items()} == {
        "input": "input",
        "L0.attn": "attn",
        "L0.mlp": "sublayer_mlp",
        "L0E3": "expert",
        "bias": "other",
        "logits": "logits",
    }
    assert (
        nodes["L0.attn"]["y"] > nodes["L0E3"]["y"] == nodes["L0.mlp"]["y"] > nodes["bias"]["y"] > nodes["logits"]["y"]
    )
    assert nodes["bias"]["title"].startswith("bias: a node.")


def test_the_page_is_self_contained():
    view = circuit_view(edge_scores(), tokens=TOKENS, patterns=PATTERNS)
    html = view.to_html(full_page=True)
    assert not re.search(r"https?:|//[a-z]|url\(|@import|@font-face|import\(|fetch\(|XMLHttpRequest", html, re.I)
    assert "lib.kinds.circuit" in html
    (payload,) = [
        json.loads(m) for m in re.findall(r'<script type="application/json" class="itv-data">(.*?)</script>', html)
    ]
    assert payload["kind"] == "circuit" and len(payload["edges"]) == 6


# --- patterns ------------------------------------------------------------------------------------------------


def test_each_drawn_head_with_a_pattern_is_a_click_target():
    view = circuit_view(edge_scores(), tokens=TOKENS, patterns=PATTERNS)
    attention = view.data["attention"]
    assert attention["heads"] == ["L0H0", "L1H0"]  # L1H1 has a pattern but no kept edge
    nodes = by_id(view)
    assert [nodes[head]["pattern"] for head in attention["heads"]] == [0, 1]
    assert nodes["L0H1"]["pattern"] is None and nodes["MLP0"]["pattern"] is None
    assert attention["tokens"] == TOKENS
    assert np.array_equal(np.array(attention["pattern"][1]), np.round(PATTERNS["L1H0"].double().numpy(), 4))
    assert circuit_view(edge_scores()).data["attention"] is None


# --- bad input -----------------------------------------------------------------------------------------------


def test_kept_of_the_wrong_shape_names_both_shapes():
    with pytest.raises(ValueError, match=r"\[upstream=7, reader=11\], got shape \(7, 10\)"):
        circuit_view(edge_scores(), torch.ones(7, 10, dtype=torch.bool))


def test_kept_must_be_a_mask_of_edges():
    scores = edge_scores()
    with pytest.raises(TypeError, match="Bool tensor .* got Tensor of dtype torch.float32"):
        circuit_view(scores, torch.ones(7, 11))
    not_edge = torch.zeros(7, 11, dtype=torch.bool)
    not_edge[UPSTREAM.index("MLP1"), READERS.index("L0H0.q")] = True
    with pytest.raises(ValueError, match=r"1 pairs that are not edges .*\('MLP1', 'L0H0.q'\)"):
        circuit_view(scores, not_edge)
    with pytest.raises(ValueError, match="no edge to draw"):
        circuit_view(scores, torch.zeros(7, 11, dtype=torch.bool))


def test_a_pattern_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"patterns\['L0H0'\] must be one head's \[query_pos, key_pos\].*\(1, 4, 4\)"):
        circuit_view(edge_scores(), tokens=TOKENS, patterns={"L0H0": PATTERNS["L0H0"][None]})
    with pytest.raises(ValueError, match="must be square"):
        circuit_view(edge_scores(), tokens=TOKENS, patterns={"L0H0": PATTERNS["L0H0"][:, :3]})


def test_tokens_and_pattern_of_different_lengths():
    with pytest.raises(ValueError, match=r"got 3 tokens but a pattern over 4 positions"):
        circuit_view(edge_scores(), tokens=TOKENS[:3], patterns=PATTERNS)


def test_patterns_and_tokens_come_together_and_name_known_heads():
    with pytest.raises(ValueError, match="patterns need the prompt's tokens"):
        circuit_view(edge_scores(), patterns=PATTERNS)
    with pytest.raises(ValueError, match="pass patterns too"):
        circuit_view(edge_scores(), tokens=TOKENS)
    with pytest.raises(KeyError, match=r"got 'L0H9'; did you mean \['L0H1', 'L0H0'\]"):
        circuit_view(edge_scores(), tokens=TOKENS, patterns={"L0H9": PATTERNS["L0H0"]})


def test_other_bad_arguments():
    with pytest.raises(TypeError, match="takes an EdgeScores .* got dict"):
        circuit_view({"scores": 1})
    with pytest.raises(ValueError, match="prompt=2 is out of range for 2 prompts"):
        circuit_view(edge_scores(), prompt=2)
    bad = edge_scores()
    bad.scores = bad.scores[..., 0]
    with pytest.raises(ValueError, match=r"batch>=1\].* got shapes \(7, 11\) and \(7, 11\)"):
        circuit_view(bad)


# --- in a browser --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with BrowserSession() as session:
        yield session


def test_clicking_a_head_shows_its_pattern_and_hovering_says_the_scores(browser, tmp_path):
    view = circuit_view(edge_scores(), tokens=TOKENS, patterns=PATTERNS)
    with open_views(browser, tmp_path, [view], "circuit") as opened:
        page = opened.page
        (root,) = mounted_ids(page, 1)
        assert page.locator(f"#{root} [data-node]").count() == 8
        strongest = f"#{root} [data-upstream='L1H0'][data-reader='logits'] .itv-edge-line"
        assert float(page.get_attribute(strongest, "stroke-width")) == MAX_WIDTH
        assert page.get_attribute(strongest, "stroke") == edge_of(view, "L1H0", "logits")["colour"]
        assert page.is_hidden(f"#{root} .itv-circuit-pattern")

        page.hover(f"#{root} [data-node='MLP0']")
        assert page.text_content(f"#{root} > .itv-status") == by_id(view)["MLP0"]["title"]
        assert page.locator(f"#{root} .itv-edge.itv-lit").count() == 1

        page.click(f"#{root} [data-node='L1H0']")
        assert page.is_visible(f"#{root} .itv-circuit-pattern")
        assert page.get_attribute(f"#{root}", "data-selected") == "L1H0"
        assert page.get_attribute(f"#{root} [data-node='L1H0']", "aria-pressed") == "true"
        tokens = f"#{root} .itv-circuit-pattern .itv-tokens .itv-token"
        page.mouse.move(1, 1)
        expect_painted(page, tokens, PATTERNS["L1H0"][-1].double().numpy(), colours.sequential_scale(1.0))

        page.focus(f"#{root} [data-node='L0H0']")
        page.keyboard.press("Enter")
        assert page.get_attribute(f"#{root}", "data-selected") == "L0H0"
        assert page.get_attribute(f"#{root} [data-node='L1H0']", "aria-pressed") == "false"
        expect_painted(page, tokens, PATTERNS["L0H0"][-1].double().numpy(), colours.sequential_scale(1.0))
        assert_clean(opened)

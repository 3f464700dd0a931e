"""Attribution graphs: the replacement model, exact edges, sums, pruning, scores, files, memory and bad input.

Tiny random decoders (every parameter moved off its init) with random transcoders. Each edge is checked against
an intervention in the replacement model (a forward pass with one source removed), each node's inputs against its
value, the replacement model's logits against the model's own.
"""

import json
import multiprocessing
import sys
import threading

import plotly.graph_objects as go
import pytest
import torch

from analysis.attribution_graphs import (
    CLTConfig,
    CrossLayerTranscoder,
    MemoryBudgetError,
    NeuronpediaGraph,
    ReplacementModel,
    attribute,
    graph_figure,
    graph_scores,
    plan_memory,
    prune_graph,
    random_transcoders,
    salient_logits,
    to_neuronpedia,
)
from analysis.attribution_graphs.graph import AttributionGraph
from analysis.attribution_graphs.pruning import compute_influence, normalize_matrix
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.gptj.recipe import GPTJConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.families.olmo2.recipe import Olmo2Config
from interp_transformer.models.processing import fold_ln
from interp_transformer.parts import Attention
from interp_transformer.sae import SAE, run_with_cache_with_saes
from interp_transformer.sae.processing import ProcessingMismatch

from .attribution_graph_helpers import (
    CONFIGS,
    PROMPT,
    folded,
    hand_graph,
    intervention_effects,
    measure_peak,
    transcoders,
)
from .perturbed import SMALL_SHAPE as SHAPE
from .perturbed import perturbed_decoder


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return folded(request.param)


@pytest.mark.parametrize("kind", ["jumprelu", "topk", "skip", "clt_topk"])
def test_replacement_model_gives_the_models_logits(model, kind):
    replacement = ReplacementModel(model, transcoders(model, kind), PROMPT)
    with torch.no_grad():
        expected = model(PROMPT)[0]
    torch.testing.assert_close(replacement.run(all_positions=True).logits[0], expected, rtol=0, atol=1e-4)
    assert replacement.errors.abs().max() > 0.1  # the transcoders are far from the MLPs: the errors carry it


@pytest.mark.parametrize("kind", ["jumprelu", "topk", "skip", "clt_topk", "clt_jumprelu"])
def test_each_edge_is_an_intervention_and_every_graph_sums(model, kind):
    tc = transcoders(model, kind)
    graph = attribute(model, tc, PROMPT, batch_size=16)
    effects = intervention_effects(ReplacementModel(model, tc, PROMPT), graph)
    edges = graph.adjacency_matrix
    assert graph.n_features > 20 and edges[graph.features].abs().max() > 0.1 and edges[graph.logits].abs().max() > 0.1
    torch.testing.assert_close(edges[graph.features, : graph.logits.start], effects[graph.features], rtol=0, atol=1e-3)
    torch.testing.assert_close(edges[graph.logits, : graph.logits.start], effects[graph.logits], rtol=0, atol=1e-5)
    assert not edges[graph.errors].any() and not edges[graph.token_nodes].any() and not edges[:, graph.logits].any()
    targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logits.start, graph.n_nodes)])
    sums = edges[targets].sum(dim=1) + graph.bias[targets]
    torch.testing.assert_close(sums, graph.values[targets], rtol=0, atol=1e-4)
    torch.testing.assert_close(graph.activation_values, ReplacementModel(model, tc, PROMPT).activations)


@pytest.mark.parametrize(
    "name", ["neox_parallel", "gptj_shared_norm", "moe_experts", "olmo2_output_norms", "gemma3_qk_norms_windows"]
)
def test_parallel_mixture_and_output_norm_blocks_too(name):
    cfg = {
        "neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
        "gptj_shared_norm": lambda: GPTJConfig(**SHAPE, rotary_dim=2),
        "moe_experts": lambda: MoEConfig(**dict(SHAPE, d_mlp=8, n_key_value_heads=2), n_experts=4, experts_per_token=2),
        "olmo2_output_norms": lambda: Olmo2Config(**SHAPE, n_key_value_heads=2),
        "gemma3_qk_norms_windows": lambda: GemmaConfig(
            **SHAPE, n_key_value_heads=2, post_norms=True, qk_norm=True, query_pre_attn_scalar=7.0, sliding_window=3
        ),
    }[name]()
    model = perturbed_decoder(cfg, dtype=torch.float32)
    tc = random_transcoders(model, 20, reads="stream")  # the stream where each MLP reads it
    graph = attribute(model, tc, PROMPT)
    replacement = ReplacementModel(model, tc, PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(replacement.run(all_positions=True).logits[0], model(PROMPT)[0], rtol=0, atol=1e-4)
    effects, edges = intervention_effects(replacement, graph), graph.adjacency_matrix[:, : graph.logits.start]
    torch.testing.assert_close(edges[graph.features], effects[graph.features], rtol=0, atol=1e-3)
    torch.testing.assert_close(edges[graph.logits], effects[graph.logits], rtol=0, atol=1e-5)
    assert edges[graph.logits].abs().max() > 0.1


def test_transcoders_read_the_mlp_input_and_write_its_output(model):
    for kind in ("jumprelu", "topk"):
        saes = transcoders(model, kind)
        replacement = ReplacementModel(model, saes, PROMPT)
        _, cache = model.run_with_cache(PROMPT)
        for layer, sae in enumerate(saes):
            assert (sae.hook_name, sae.hook_name_out) == (
                f"blocks.{layer}.ln2.hook_normalized",
                f"blocks.{layer}.hook_mlp_out",
            )
            with torch.no_grad():
                reconstruction = sae(cache[sae.hook_name][0])
            written = cache[sae.hook_name_out][0] - replacement.errors[layer]
            torch.testing.assert_close(written, reconstruction, rtol=0, atol=1e-5)
            l0 = (sae.encode(cache[sae.hook_name][0]) > 0).sum(-1)
            assert (l0 <= 5).all() if kind == "topk" else (l0 > 0).all()
    jumprelu = transcoders(model, "jumprelu")
    _, spliced = run_with_cache_with_saes(model, PROMPT, saes=jumprelu)  # the SAE module's own splice: MLP -> sae(x)
    with torch.no_grad():
        expected = jumprelu[1](spliced["blocks.1.ln2.hook_normalized"])
    torch.testing.assert_close(spliced["blocks.1.hook_mlp_out"], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["jumprelu", "clt_topk"])
def test_chunked_equals_unchunked(kind):
    model = folded("llama_gqa")
    tc = transcoders(model, kind)
    chunked, whole = attribute(model, tc, PROMPT, batch_size=8), attribute(model, tc, PROMPT, batch_size=10_000)
    assert torch.equal(chunked.adjacency_matrix, whole.adjacency_matrix)  # rows never mix: bit for bit
    double = folded("llama_gqa", torch.float64)
    tc = transcoders(double, kind)
    chunked, whole = attribute(double, tc, PROMPT, batch_size=3), attribute(double, tc, PROMPT, batch_size=10_000)
    torch.testing.assert_close(chunked.adjacency_matrix, whole.adjacency_matrix, rtol=0, atol=1e-12)


def test_salient_logits_are_the_fewest_likeliest_tokens_over_the_probability():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])
    tokens, probs = salient_logits(logits, max_n_logits=4, desired_logit_prob=0.7)
    expected = logits.softmax(-1)
    assert tokens.tolist() == [1, 3] and probs.sum() >= 0.7 and expected[1] < 0.7
    torch.testing.assert_close(probs, expected[[1, 3]])
    assert salient_logits(logits, max_n_logits=2, desired_logit_prob=0.99)[0].tolist() == [1, 3]


# --- cross-layer transcoders --------------------------------------------------------------------------


def test_clt_decodes_to_every_later_layer_and_round_trips_through_circuit_tracers_layout(tmp_path):
    clt = CrossLayerTranscoder.random(CLTConfig(3, 10, 8, activation="jumprelu", input_hook="ln2.hook_normalized"))
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
    acts = clt.encode(x)
    pre = torch.stack([x[layer] @ clt.W_enc[layer].T + clt.b_enc[layer] for layer in range(3)])
    torch.testing.assert_close(acts, pre * (pre > clt.threshold[:, None]))
    for out in range(3):
        expected = clt.b_dec[out] + sum(acts[layer] @ clt.W_dec[layer][:, out - layer] for layer in range(out + 1))
        torch.testing.assert_close(clt.decode(acts)[out], expected)
    folder = clt.save(tmp_path / "clt")
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"W_{kind}_{i}.safetensors" for kind in ("dec", "enc") for i in range(3)]
    loaded = CrossLayerTranscoder.load(folder)
    assert loaded.cfg == clt.cfg
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in clt.state_dict().items())
    assert torch.equal(loaded(x), clt(x))
    topk = CrossLayerTranscoder.random(CLTConfig(3, 10, 8, activation="topk", k=2), seed=1)
    assert CrossLayerTranscoder.load(topk.save(tmp_path / "topk")).cfg == topk.cfg
    (folder / "W_dec_2.safetensors").unlink()
    with pytest.raises(ValueError, match=r"missing \['W_dec_2.safetensors'\]"):
        CrossLayerTranscoder.load(folder)


def test_a_clt_writing_only_to_its_own_layer_gives_the_per_layer_transcoders_graph():
    model = folded("llama_gqa", torch.float64)
    saes = random_transcoders(model, 20, architecture="transcoder")
    tensors = {
        "W_enc": torch.stack([sae.W_enc.detach().T for sae in saes]),
        "b_enc": torch.stack([sae.b_enc.detach() for sae in saes]),
        "b_dec": torch.stack([sae.b_dec.detach() for sae in saes]),
        "W_dec.0": torch.stack([saes[0].W_dec.detach(), torch.zeros(20, SHAPE["d_model"], dtype=torch.float64)], 1),
        "W_dec.1": saes[1].W_dec.detach()[:, None],
    }
    clt = CrossLayerTranscoder(CLTConfig(2, 20, SHAPE["d_model"], input_hook="ln2.hook_normalized"), tensors)
    per_layer, cross = attribute(model, saes, PROMPT), attribute(model, clt, PROMPT)
    assert torch.equal(per_layer.active_features, cross.active_features)
    torch.testing.assert_close(cross.adjacency_matrix, per_layer.adjacency_matrix, rtol=0, atol=1e-12)


# --- pruning and scores ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph():
    model = folded("llama_gqa", torch.float64)
    return attribute(model, random_transcoders(model, 20, threshold=0.05), PROMPT)


def test_influence_is_the_sum_over_paths(graph):
    normalized = normalize_matrix(graph.adjacency_matrix)
    weights = graph.logit_weights()
    eye = torch.eye(graph.n_nodes, dtype=torch.float64)
    expected = weights @ (torch.linalg.inv(eye - normalized) - eye)
    torch.testing.assert_close(compute_influence(normalized, weights), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(normalized.sum(1)[graph.features], torch.ones(graph.n_features, dtype=torch.float64))


def test_pruning_keeps_tokens_logits_and_no_dangling_feature(graph):
    pruned = prune_graph(graph, node_threshold=0.9, edge_threshold=0.95)
    nodes, edges = pruned.node_mask, pruned.edge_mask
    assert nodes[graph.token_nodes].all() and nodes[graph.logits].all()
    assert 0 < nodes[graph.features].sum() < graph.n_features
    assert not edges[~nodes].any() and not edges[:, ~nodes].any()
    kept_features = nodes[graph.features]
    assert edges[:, graph.features].any(0)[kept_features].all()  # an outgoing edge
    assert edges[graph.features].any(1)[kept_features].all()  # an incoming edge
    assert (edges & (graph.adjacency_matrix == 0)).sum() == 0
    ordered = pruned.cumulative_scores.sort().values
    assert ordered[-1] == pytest.approx(1.0) and (ordered >= 0).all()
    everything = prune_graph(graph, node_threshold=1.0, edge_threshold=1.0)
    assert everything.node_mask.sum() >= nodes.sum() and everything.edge_mask.sum() > edges.sum()
    with pytest.raises(ValueError, match="node_threshold must be a fraction in \\[0, 1\\], got 1.5"):
        prune_graph(graph, node_threshold=1.5)


def test_replacement_and_completeness_scores_by_hand():
    # shares into the logit: feature 3/5, error 1/5, token 1/5; the feature's input is all token
    # influence: feature 0.6, error 0.2, token 0.2 + 0.6; replacement 0.8 / (0.8 + 0.2)
    # completeness: (0.6 + 0.2 + 0.8 + (1 - 0.2) * 1) / (0.6 + 0.2 + 0.8 + 1)
    scores = graph_scores(hand_graph(1.0))
    assert scores.replacement == pytest.approx(0.8, abs=1e-12)
    assert scores.completeness == pytest.approx(2.4 / 2.6, abs=1e-12)
    perfect = graph_scores(hand_graph(0.0))
    assert (perfect.replacement, perfect.completeness) == (pytest.approx(1.0), pytest.approx(1.0))


# --- Neuronpedia's graph JSON ----------------------------------------------------------------------------


def test_neuronpedia_json_round_trips_exactly(graph, tmp_path):
    exported = to_neuronpedia(graph, slug="tiny", node_threshold=0.8, edge_threshold=0.98)
    text = exported.to_json()
    back = NeuronpediaGraph.from_json(text)
    assert back == exported and back.to_json() == text
    assert NeuronpediaGraph.load(exported.save(tmp_path / "tiny.json")).to_json() == text
    kinds = [node["feature_type"] for node in back.nodes]
    assert kinds.count("embedding") == graph.n_pos and kinds.count("logit") == graph.n_logits
    assert set(back.metadata) == {"slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold"}
    pruned = prune_graph(graph, 0.8, 0.98)
    index = {}
    for node in range(graph.n_nodes):
        layer, pos = graph.layer_and_pos(node)
        kind = graph.kind(node)
        if kind == "feature":
            index[f"{layer}_{int(graph.active_features[node, 2])}_{pos}"] = node
        elif kind == "error":
            index[f"0_{layer}_{pos}"] = node
        elif kind == "token":
            index[f"E_{int(graph.tokens[pos])}_{pos}"] = node
        else:
            index[f"{graph.n_layers + 1}_{int(graph.logit_tokens[node - graph.logits.start])}_{pos}"] = node
    rows = [index[node_id] for node_id in back.node_ids()]
    expected = (graph.adjacency_matrix * pruned.edge_mask)[rows][:, rows]
    assert torch.equal(back.adjacency(), expected)  # every kept edge, its weight exact
    assert len(back.links) == int(pruned.edge_mask[rows][:, rows].sum()) > 0
    for node in back.nodes:
        if node["feature_type"] == "cross layer transcoder":
            assert node["activation"] == float(graph.activation_values[index[node["node_id"]]])


def test_an_error_node_whose_id_would_collide_with_a_feature_gets_its_own():
    adjacency = torch.zeros(5, 5, dtype=torch.float64)  # feature (0, 0, 1), errors L0P0 and L1P0, token, logit
    adjacency[0, 3] = 1.0
    adjacency[4, 0], adjacency[4, 2] = 2.0, 1.0
    one = torch.ones(1, dtype=torch.float64)
    graph = AttributionGraph(
        tokens=torch.tensor([4]), active_features=torch.tensor([[0, 0, 1]]), activation_values=one,
        logit_tokens=torch.tensor([2]), logit_probabilities=one, logit_values=one, adjacency_matrix=adjacency,
        bias=torch.zeros(5, dtype=torch.float64), n_layers=2,
    )  # fmt: skip
    exported = to_neuronpedia(graph, node_threshold=1.0, edge_threshold=1.0)
    ids = exported.node_ids()
    assert "0_1_0" in ids and "err_1_0" in ids and len(set(ids)) == len(ids)  # circuit-tracer writes 0_1_0 twice
    assert {(link["source"], link["target"]) for link in exported.links} == {
        ("E_4_0", "0_1_0"),
        ("0_1_0", "3_2_0"),
        ("err_1_0", "3_2_0"),
    }
    assert NeuronpediaGraph.from_json(exported.to_json()) == exported


def test_neuronpedia_json_with_a_bad_layout_is_refused(graph):
    data = to_neuronpedia(graph).to_dict()
    with pytest.raises(ValueError, match=r"missing \['links'\]"):
        NeuronpediaGraph.from_dict({key: value for key, value in data.items() if key != "links"})
    broken = json.loads(json.dumps(data))
    broken["links"][0]["target"] = "9_9_9"
    with pytest.raises(ValueError, match="names nodes not in the graph: \\['9_9_9'\\]"):
        NeuronpediaGraph.from_dict(broken)
    doubled = json.loads(json.dumps(data))
    doubled["nodes"].append(doubled["nodes"][0])
    with pytest.raises(ValueError, match="appears twice"):
        NeuronpediaGraph.from_dict(doubled)


def test_graph_figure_draws_the_kept_nodes_and_signed_edges(graph):
    pruned = prune_graph(graph)
    fig = graph_figure(graph, pruned)
    assert isinstance(fig, go.Figure)
    markers = [trace for trace in fig.data if trace.mode == "markers"]
    assert sum(len(trace.x) for trace in markers) == int(pruned.node_mask.sum())
    lines = [trace for trace in fig.data if trace.mode == "lines"]
    assert sum(len(trace.x) for trace in lines) == 3 * int(pruned.edge_mask.sum())
    assert {trace.line.color for trace in lines} == {"#2166ac", "#b2182b"}
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("pos", "layer")


# --- memory -----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak resident memory from /proc")
def test_planned_peak_is_within_15_percent_of_the_measured_peak():
    # a fresh interpreter: a forked child would inherit this process's heap, whose freed pages (earlier tests' in a
    # test worker) can serve the graph without the resident set growing
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=measure_peak, args=(send,))
    child.start()
    assert receive.poll(240), "the measuring process did not answer in 240 s"
    result = receive.recv()
    child.join()
    assert "error" not in result, result
    assert result["measured"] > 80e6  # the graph is large beside the interpreter's own noise
    assert abs(result["planned"] - result["measured"]) <= 0.15 * result["measured"], result


def test_the_replacement_models_rows_make_no_attention_scores(monkeypatch):
    # the frozen patterns go to the attentions whole: [head, pos, pos] scores per row were most of a long graph's peak
    model = folded("llama_gqa")
    tc = transcoders(model, "topk")
    replacement = ReplacementModel(model, tc, PROMPT)
    made = []
    original = Attention._attn_scores
    monkeypatch.setattr(Attention, "_attn_scores", lambda self, *args: made.append(1) or original(self, *args))
    graph = attribute(model, tc, PROMPT, batch_size=16)
    replacement.run_without(graph, [[0], [1]])
    assert made == [1] * model.cfg.n_layers  # only the prompt's own forward, once per layer
    assert all(getattr(m, "given_pattern", None) is None for m in model.modules())  # nothing left behind
    effects = intervention_effects(replacement, graph)  # and the graph is still the interventions
    torch.testing.assert_close(graph.adjacency_matrix[graph.logits, : graph.logits.start], effects[graph.logits])


def test_another_thread_runs_the_model_unchanged_while_a_replacement_model_runs():
    # the frozen patterns and the one-row MLPs are the replacing thread's: a second thread's forward is the model's
    model = folded("llama_gqa")
    replacement = ReplacementModel(model, transcoders(model, "topk"), PROMPT)
    other = torch.tensor([[4, 8, 1, 3], [2, 2, 9, 5]])
    with torch.no_grad():
        expected = model(other)
    inside, release, seen = threading.Event(), threading.Event(), {}

    def replace() -> None:
        with replacement.backward_pass(3):
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=replace)
    thread.start()
    assert inside.wait(30)
    with torch.no_grad():
        seen["other"] = model(other)
    release.set()
    thread.join()
    torch.testing.assert_close(seen["other"], expected, rtol=0, atol=0)


def test_a_run_above_the_budget_is_refused_naming_estimate_and_budget():
    model = folded("gpt2")
    tc = transcoders(model, "jumprelu")
    plan = plan_memory(model, tc, n_pos=6, n_features=100, batch_size=16)
    assert plan.adjacency == (100 + 3 * 6 + 10) ** 2 * 4
    assert plan_memory(model, tc, n_pos=6, n_features=100, batch_size=64).peak > plan.peak
    with pytest.raises(
        MemoryBudgetError, match=r"estimated to need .* \(\d+ bytes\), above the budget of .* \(1000 bytes\)"
    ):
        attribute(model, tc, PROMPT, memory_budget=1000)
    assert attribute(model, tc, PROMPT, memory_budget=2**30).n_nodes > 0


# --- bad input ---------------------------------------------------------------------------------------------


def test_transcoders_that_do_not_fit_the_model_are_refused():
    model = folded("llama_gqa")
    saes = random_transcoders(model, 20)

    def with_fields(sae, **changes):
        cfg = sae.cfg.to_dict()
        cfg["metadata"] = {**cfg["metadata"], **changes.pop("metadata", {})}
        return SAE.from_dict({**cfg, **changes}, dict(sae.state_dict()))

    cases = [
        (
            [with_fields(saes[0], metadata={"hook_name": "blocks.0.hook_resid_pre"}), saes[1]],
            ValueError,
            r"reads 'blocks.0.hook_resid_pre'; layer 0's MLP reads 'blocks.0.ln2.hook_normalized'",
        ),
        (
            [saes[0], with_fields(saes[1], metadata={"hook_name_out": "blocks.1.hook_attn_out"})],
            ValueError,
            r"writes 'blocks.1.hook_attn_out'; layer 1's MLP writes 'blocks.1.hook_mlp_out'",
        ),
        ([saes[0]], ValueError, r"missing layers \[1\]"),
        (
            [saes[0], random_transcoders(model, 20, architecture="transcoder")[1].to(torch.float64)],
            TypeError,
            r"holds W_enc in torch.float64; the model runs in torch.float32",
        ),
        (CrossLayerTranscoder.random(CLTConfig(3, 8, 16)), ValueError, r"n_layers=3; the model has 2 layers"),
        (
            CrossLayerTranscoder.random(CLTConfig(2, 8, 12)),
            ValueError,
            r"d_model=12; the model's MLPs read and write "
            r"d_model=16",
        ),
        (
            CrossLayerTranscoder.random(CLTConfig(2, 8, 16, input_hook="hook_resid_pre")),
            ValueError,
            r"reads 'blocks.0.hook_resid_pre'",
        ),
        (
            CrossLayerTranscoder.random(CLTConfig(2, 8, 16, input_hook="ln9.hook_normalized")),
            ValueError,
            r"names 'ln9.hook_normalized', which is no hook point of block 0; closest: \['ln2.hook_normalized'",
        ),
        ("saes", TypeError, "transcoders must be a CrossLayerTranscoder, a list"),
    ]
    narrow = SAE.from_dict({**saes[0].cfg.to_dict(), "d_in": 8}, {**saes[0].state_dict(), "W_enc": torch.zeros(8, 20)})
    cases.append(([narrow, saes[1]], ValueError, r"d_in=8; the model's MLPs read and write d_model=16"))
    standard = SAE.from_dict(
        {**saes[0].cfg.to_dict(), "architecture": "standard", "d_out": 16},
        {name: t for name, t in saes[0].state_dict().items() if name != "threshold"},
    )
    cases.append(([standard, saes[1]], ValueError, r"is a 'standard' SAE; a transcoder is one of"))
    for transcoders_, error, message in cases:
        with pytest.raises(error, match=message):
            attribute(model, transcoders_, PROMPT)
    damaged = random_transcoders(model, 20)
    with torch.no_grad():
        damaged[1].W_dec[3, 2] = float("nan")
    with pytest.raises(ValueError, match=r"the transcoder of layer 1: W_dec holds 1 non-finite value"):
        attribute(model, damaged, PROMPT)


def test_transcoders_reading_normalized_hooks_need_the_models_norms_folded():
    model = perturbed_decoder(CONFIGS["llama_gqa"](), dtype=torch.float32)
    saes = random_transcoders(model, 20)
    with pytest.raises(
        ProcessingMismatch,
        match=r"needs \['fold_ln'\] applied to this model.*fold_ln\(model\)\) \(an attribution graph reads",
    ):
        attribute(model, saes, PROMPT)
    clt = transcoders(model, "clt_topk")
    with pytest.raises(ProcessingMismatch, match=r"needs \['fold_ln'\]"):
        attribute(model, clt, PROMPT)
    stream = random_transcoders(model, 20, reads="stream")  # the stream before the norm: no processing needed
    assert attribute(model, stream, PROMPT).n_features > 0 and model.processing == []
    assert attribute(fold_ln(model), saes, PROMPT).n_features > 0


def test_bad_arguments_are_refused():
    model = folded("gpt2")
    saes = transcoders(model, "jumprelu")
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        attribute(model, saes, PROMPT, batch_size=0)
    with pytest.raises(ValueError, match=r"one prompt: tokens \[pos\] or \[1, pos\], got \[2, 6\]"):
        attribute(model, saes, torch.stack([PROMPT, PROMPT]))
    with pytest.raises(ValueError, match="k belongs to a topk CLT"):
        CLTConfig(2, 8, 16, k=3)
    with pytest.raises(ValueError, match=r"feature_scale must have shape \[1, "):
        ReplacementModel(model, saes, PROMPT).run(torch.ones(1, 3))

"""Attribution-graph tools given bad input: feature edits, Neuronpedia graph files and transcoder folders.

Each test is one defect, written as the failing example it was: a feature edit at a position past the prompt or
with a NaN scale, a graph file holding a NaN weight, a ``config.yaml`` with a Python tag or a syntax error, a
truncated tensor file, a layer file outside its folder. Each must now raise a ``ValueError``/``TypeError`` naming
the field, the file or the index (on the command line: one line on stderr and exit code 2).
"""

import json
import math
import os
import re

import pytest
import torch

from analysis.attribution_graphs import (
    CLTConfig,
    CrossLayerTranscoder,
    FeatureEdit,
    NeuronpediaGraph,
    edit_features,
    generate_with_edits,
    load_transcoders,
    parse_feature_edit,
    random_transcoders,
    save_transcoders,
    to_neuronpedia,
)
from analysis.attribution_graphs.circuit_tracer_files import load_circuit_tracer, save_circuit_tracer
from analysis.cli import EXIT_USAGE, main
from interp_transformer.loading import from_pretrained
from interp_transformer.models.processing import fold_ln

from .attribution_graph_helpers import PROMPT, folded, hand_graph
from .gpt2_helpers import tiny_gpt2


@pytest.fixture(scope="module")
def model():
    return folded("gpt2")


@pytest.fixture(scope="module")
def saes(model):
    return random_transcoders(model, 20, threshold=0.05)


def one_line_error(capsys, *argv) -> str:
    code = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and err and "Traceback" not in "\n".join(err), err
    return err[-1]


def truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# --- feature edits -------------------------------------------------------------------------------------------------


def test_an_edit_at_a_position_past_the_prompt_is_refused(model, saes):
    with (
        pytest.raises(ValueError, match=r"position 999 .* 6 positions .*0\.\.5, or -6\.\.-1"),
        torch.no_grad(),
        edit_features(model, saes, [parse_feature_edit("L0:F1@999")]),
    ):
        model(PROMPT)
    with (
        pytest.raises(ValueError, match=r"position -7 .* 6 positions"),
        torch.no_grad(),
        edit_features(model, saes, [FeatureEdit(0, 1, positions=(2, -7))]),
    ):
        model(PROMPT)


def test_a_negative_position_counts_from_the_end_of_the_prompt(model, saes):
    steer = dict(scale=None, value=40.0)
    with torch.no_grad():
        with edit_features(model, saes, [FeatureEdit(1, 3, positions=(-1,), **steer)]):
            from_end = model(PROMPT)
        with edit_features(model, saes, [FeatureEdit(1, 3, positions=(5,), **steer)]):
            last = model(PROMPT)
        plain = model(PROMPT)
    assert torch.equal(from_end, last) and not torch.equal(from_end, plain)
    assert parse_feature_edit("L1:F3@-1=40", steer=True) == FeatureEdit(1, 3, positions=(-1,), **steer)
    # in generation the position stays the prompt's last, not the last generated token
    pinned = generate_with_edits(model, saes, PROMPT, [FeatureEdit(1, 3, positions=(-1,), **steer)], 4)
    assert torch.equal(
        pinned, generate_with_edits(model, saes, PROMPT, [FeatureEdit(1, 3, positions=(5,), **steer)], 4)
    )
    with pytest.raises(ValueError, match=r"position 6 .* the prompt's 6 positions"):
        generate_with_edits(model, saes, PROMPT, [FeatureEdit(0, 1, positions=(6,))], 4)


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(scale=math.nan), ValueError, r"scale must be a finite number, got nan"),
        (dict(scale=None, value=math.inf), ValueError, r"value must be a finite number, got inf"),
        (dict(scale="2"), TypeError, r"scale must be a number, got str '2'"),
        (dict(scale=True), TypeError, r"scale must be a number, got bool"),
        (dict(positions=()), ValueError, r"positions must name at least one position .* None for every position"),
        (dict(positions=(1.5,)), TypeError, r"positions must be ints, got \(1.5,\)"),
        (dict(positions=3), TypeError, r"positions must be a tuple of ints .* got int"),
    ],
)
def test_an_edit_with_a_bad_value_is_refused_when_made(fields, error, message):
    with pytest.raises(error, match=message):
        FeatureEdit(0, 1, **fields)


def test_an_edit_of_a_layer_or_feature_out_of_range_is_refused(model, saes):
    with pytest.raises(ValueError, match=r"layer must be an int >= 0, got -1"):
        FeatureEdit(-1, 0)
    with pytest.raises(TypeError, match=r"feature must be an int >= 0, got float 1.5"):
        FeatureEdit(0, 1.5)
    with (
        pytest.raises(ValueError, match=r"layer must be in \[0, 2\), got 2"),
        edit_features(model, saes, [FeatureEdit(2, 0)]),
    ):
        pass
    with pytest.raises(ValueError, match=r"finite number, got inf"):
        parse_feature_edit("L0:F1=1e999", steer=True)
    assert FeatureEdit(0, 1, positions=[2, 3]).positions == (2, 3)


# --- Neuronpedia graph files ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph_dict():
    data = to_neuronpedia(hand_graph(1.0), node_threshold=1.0, edge_threshold=1.0).to_dict()
    assert len(data["links"]) >= 2 and len(data["nodes"]) >= 3
    return json.loads(json.dumps(data))


def _changed(data, part, index, **fields):
    data = json.loads(json.dumps(data))
    data[part][index].update(fields)
    return data


def test_a_non_finite_link_weight_is_refused(graph_dict):
    text = json.dumps(_changed(graph_dict, "links", 1, weight=math.nan))
    assert "NaN" in text
    with pytest.raises(ValueError, match=r"link 1 \(.*\): weight must be a finite number, got nan"):
        NeuronpediaGraph.from_json(text)
    with pytest.raises(ValueError, match=r"link 0 .*weight must be a finite number, got -inf"):
        NeuronpediaGraph.from_dict(_changed(graph_dict, "links", 0, weight=-math.inf))


@pytest.mark.parametrize("field", ["influence", "activation", "token_prob"])
def test_a_non_finite_node_value_is_refused(graph_dict, field):
    index = next(i for i, node in enumerate(graph_dict["nodes"]) if node["feature_type"] == "cross layer transcoder")
    node_id = graph_dict["nodes"][index]["node_id"]
    with pytest.raises(ValueError, match=rf"node {index} \('{node_id}'\): {field} must be a finite number, got inf"):
        NeuronpediaGraph.from_dict(_changed(graph_dict, "nodes", index, **{field: math.inf}))


@pytest.mark.parametrize(
    "part, index, fields, error, message",
    [
        ("links", 0, dict(weight="0.5"), TypeError, r"link 0 .*: weight must be a finite number, got str '0.5'"),
        ("links", 1, dict(source=3), TypeError, r"link 1 .*: source must be a node id \(a str\), got int 3"),
        ("nodes", 0, dict(ctx_idx="a"), TypeError, r"node 0 \('.*'\): ctx_idx must be an int, got str 'a'"),
        ("nodes", 1, dict(is_target_logit=1), TypeError, r"node 1 \('.*'\): is_target_logit must be a bool, got int"),
        ("nodes", 0, dict(node_id=7), TypeError, r"node 0 \(7\): node_id must be a str, got int 7"),
    ],
)
def test_a_malformed_field_is_refused_naming_it_and_its_index(graph_dict, part, index, fields, error, message):
    with pytest.raises(error, match=message):
        NeuronpediaGraph.from_dict(_changed(graph_dict, part, index, **fields))


def test_a_malformed_layout_is_refused(graph_dict):
    with pytest.raises(TypeError, match=r"'nodes' must be a list of objects, got dict"):
        NeuronpediaGraph.from_dict({**graph_dict, "nodes": {}})
    with pytest.raises(TypeError, match=r"node 2 must be an object, got list"):
        NeuronpediaGraph.from_dict({**graph_dict, "nodes": [*graph_dict["nodes"][:2], [1]]})
    with pytest.raises(TypeError, match=r"'metadata' must be an object, got str"):
        NeuronpediaGraph.from_dict({**graph_dict, "metadata": "x"})
    with pytest.raises(ValueError, match=r"metadata: node_threshold must be a finite number, got nan"):
        NeuronpediaGraph.from_dict({**graph_dict, "metadata": {**graph_dict["metadata"], "node_threshold": math.nan}})
    assert NeuronpediaGraph.from_dict(graph_dict).to_dict() == graph_dict  # a good file still reads


# --- circuit-tracer folders ----------------------------------------------------------------------------------------


@pytest.fixture
def tracer_folder(tmp_path, model, saes):
    return save_circuit_tracer(model, saes, tmp_path / "tracer")


@pytest.mark.parametrize(
    "text, line, problem",
    [
        ('model_kind: transcoder_set\nscan: !!python/object/apply:os.system ["touch {marker}"]\n', 2, "constructor"),
        ("model_kind: transcoder_set\nactivation: !custom relu\n", 2, "tag '!custom'"),
        ("model_kind: transcoder_set\ntranscoders: [layer_0.safetensors\n", 3, "expected ','"),
        ("model_kind: transcoder_set\nscan: a: b\n", 2, "mapping values"),
    ],
)
def test_a_config_yaml_that_is_not_plain_yaml_is_refused_naming_file_and_line(
    tracer_folder, model, tmp_path, text, line, problem
):
    marker = tmp_path / "executed"
    (tracer_folder / "config.yaml").write_text(text.replace("{marker}", str(marker)))
    with pytest.raises(ValueError, match=rf"config\.yaml, line {line}: .*{problem}"):
        load_circuit_tracer(model, tracer_folder)
    assert not marker.exists()  # never executed


def test_a_truncated_layer_file_is_refused_naming_it(tracer_folder, model):
    truncate(tracer_folder / "layer_1.safetensors")
    with pytest.raises(ValueError, match=r"layer_1\.safetensors is not a readable safetensors file"):
        load_circuit_tracer(model, tracer_folder)


def _point_layer_0_at(folder, entry) -> None:
    config = json.loads((folder / "config.yaml").read_text())
    config["transcoders"][0] = entry
    (folder / "config.yaml").write_text(json.dumps(config))


@pytest.mark.parametrize("kind", ["dot-dot", "absolute", "symlink"])
def test_a_layer_file_outside_the_folder_is_refused_before_it_is_opened(tracer_folder, model, tmp_path, kind):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "layer_0.safetensors").write_bytes((tracer_folder / "layer_0.safetensors").read_bytes())
    (outside / "fifo.safetensors").mkdir()  # not a file: opening it would fail with another message
    entry = {"dot-dot": "../elsewhere/fifo.safetensors", "absolute": str(outside / "layer_0.safetensors")}.get(kind)
    if kind == "symlink":
        os.symlink(outside / "layer_0.safetensors", tracer_folder / "link.safetensors")
        entry = "link.safetensors"
    _point_layer_0_at(tracer_folder, entry)
    with pytest.raises(ValueError, match=rf"names {entry!r}, which lies outside .*tracer"):
        load_circuit_tracer(model, tracer_folder)


def test_a_transcoders_entry_that_is_no_file_name_is_refused(tracer_folder, model):
    _point_layer_0_at(tracer_folder, 5)
    with pytest.raises(TypeError, match=r"transcoders must be a list of file names .* got int 5"):
        load_circuit_tracer(model, tracer_folder)
    _point_layer_0_at(tracer_folder, "missing.safetensors")
    with pytest.raises(FileNotFoundError, match=r"names 'missing\.safetensors', which is no file in"):
        load_circuit_tracer(model, tracer_folder)


# --- cross-layer transcoder folders ---------------------------------------------------------------------------------


@pytest.fixture
def clt_folder(tmp_path):
    return CrossLayerTranscoder.random(CLTConfig(2, 10, 16, activation="jumprelu")).save(tmp_path / "clt")


@pytest.mark.parametrize("name", ["W_enc_0.safetensors", "W_dec_1.safetensors"])
def test_a_truncated_clt_file_is_refused_naming_it(clt_folder, name):
    truncate(clt_folder / name)
    with pytest.raises(ValueError, match=rf"{name} is not a readable safetensors file"):
        CrossLayerTranscoder.load(clt_folder)
    with pytest.raises(ValueError, match=rf"{name} is not a readable safetensors file"):
        load_transcoders(clt_folder)


def test_a_clt_file_linked_from_outside_the_folder_is_refused(clt_folder, tmp_path):
    outside = tmp_path / "W_enc_1.safetensors"
    (clt_folder / "W_enc_1.safetensors").rename(outside)
    os.symlink(outside, clt_folder / "W_enc_1.safetensors")
    with pytest.raises(ValueError, match=r"'W_enc_1\.safetensors', which lies outside"):
        CrossLayerTranscoder.load(clt_folder)


def test_a_layer_folder_linked_from_outside_is_refused(tmp_path, model, saes):
    folder = save_transcoders(saes, tmp_path / "set")
    (folder / "layer_1").rename(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", folder / "layer_1")
    with pytest.raises(ValueError, match=r"'layer_1', which lies outside"):
        load_transcoders(folder)


# --- the command line ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph_command(tmp_path_factory):
    """A tiny GPT-2 folder (no tokenizer: prompts are token ids) and a set of random transcoders for it."""
    root = tmp_path_factory.mktemp("graph_command")
    tiny_gpt2(seed=0).save_pretrained(root / "gpt2")
    model = fold_ln(from_pretrained(root / "gpt2"))
    save_transcoders(random_transcoders(model, 8, threshold=0.0), root / "tc")
    clt = CrossLayerTranscoder.random(CLTConfig(2, 8, model.cfg.d_model, input_hook="ln2.hook_normalized"))
    truncate(clt.save(root / "clt") / "W_enc_0.safetensors")
    return root


@pytest.mark.parametrize(
    "option, edit, message",
    [
        ("--steer", "L0:F1@999=5", r"position 999 .* 4 positions"),
        ("--ablate", "L0:F1@-5", r"position -5 .* 4 positions"),
        ("--steer", "L0:F1=1e999", r"value must be a finite number, got inf"),
        ("--ablate", "L0:F8", r"feature must be in \[0, 8\) for layer 0, got 8"),
        ("--ablate", "L2:F0", r"layer must be in \[0, 2\), got 2"),
    ],
)
def test_the_graph_command_refuses_a_bad_edit_in_one_line(graph_command, capsys, option, edit, message):
    argv = ["graph", "--model", graph_command / "gpt2", "--transcoders", graph_command / "tc", "--prompt", "1 5 9 2"]
    line = one_line_error(capsys, *argv, option, edit, "--dashboard-contexts", 0)
    assert line.startswith("interp-transformer graph: error: ")
    assert re.search(message, line), line


def test_the_graph_command_refuses_a_truncated_transcoder_file_in_one_line(graph_command, capsys):
    argv = ["graph", "--model", graph_command / "gpt2", "--transcoders", graph_command / "clt", "--prompt", "1 5"]
    line = one_line_error(capsys, *argv)
    assert "W_enc_0.safetensors is not a readable safetensors file" in line, line


def test_the_graph_command_steers_a_position_counted_from_the_end(graph_command, capsys):
    """A model without a tokenizer takes the prompt as ids and generates from them; ``@-1`` is the prompt's last."""
    argv = ["graph", "--model", graph_command / "gpt2", "--transcoders", graph_command / "tc", "--prompt", "1 5 9 2"]
    argv += ["--steer", "L0:F1@-1=5", "--dashboard-contexts", "0", "--max-new-tokens", "2"]
    assert main([str(arg) for arg in argv]) == 0
    printed = capsys.readouterr().out
    assert "without edits: [1, 5, 9, 2, " in printed and "with 1 edit(s): [1, 5, 9, 2, " in printed

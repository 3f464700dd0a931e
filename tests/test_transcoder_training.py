"""Training transcoders and cross-layer transcoders, their metrics and files, feature edits and the command lines.

References: the trained features as the trainer computes them (scaled space) against the saved transcoders on raw
activations; the metrics against a dense recomputation; splicing against the SAE splice; an edit's change of an
MLP output against ``a_f W_dec[f]``; a no-op edit against the model itself.
"""

import json

import pytest
import torch

from analysis.attribution_graphs import (
    CrossLayerTranscoder,
    FeatureEdit,
    TranscoderTrainingConfig,
    edit_features,
    generate_with_edits,
    load_transcoders,
    parse_feature_edit,
    splice_transcoders,
    transcoder_layers,
    transcoder_metrics,
)
from analysis.attribution_graphs.training import fit, harvest_mlp_activations, to_transcoders
from analysis.cli import main
from analysis.cli.common import EXIT_OK, EXIT_USAGE
from interp_transformer.sae.processing import ProcessingMismatch

from .attribution_graph_helpers import CONFIGS, folded
from .gpt2_helpers import tiny_gpt2
from .perturbed import perturbed_decoder

TOKENS = torch.randint(1, 31, (150, 12), generator=torch.Generator().manual_seed(0))


def _config(cross_layer: bool, **changes) -> TranscoderTrainingConfig:
    settings = dict(d_transcoder=48, k=4, cross_layer=cross_layer, max_tokens=1200, epochs=20, batch_size=64, lr=1e-2)
    return TranscoderTrainingConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def model():
    return folded("llama_gqa", torch.float64)


@pytest.fixture(scope="module")
def data(model):
    return harvest_mlp_activations(model, TOKENS, _config(False), progress=False)


@pytest.fixture(scope="module", params=[False, True], ids=["per_layer", "cross_layer"])
def trained(request, model, data):
    config = _config(request.param)
    features, c_in, c_out, losses = fit(data, config, progress=False)
    return config, features, c_in, c_out, losses, to_transcoders(features, c_in, c_out, data, config, model)


def test_harvest_keeps_every_layer_and_holds_out_every_nth_context(model, data):
    n_layers = model.cfg.n_layers
    assert data.x.shape[0] == data.y.shape[0] == n_layers
    assert data.x.shape[1] + data.eval_x.shape[1] == 1200
    assert torch.equal(data.eval_tokens[0], model.prepare_tokens(TOKENS[9:10])[0])  # the 10th context is held out
    _, cache = model.run_with_cache(data.eval_tokens[:1])
    first = cache[data.writes[1]][0]  # token tensors: no BOS or separator to leave out
    assert torch.equal(data.eval_y[1, : first.shape[0]], first.float())


def test_training_lowers_the_loss(trained):
    losses = trained[4]
    assert sum(losses[-5:]) / 5 < 0.4 * sum(losses[:5]) / 5


def test_saved_transcoders_compute_what_was_trained(trained, model, data):
    """The scales are folded exactly: the raw-space transcoders give the trained features' outputs, unscaled."""
    config, features, c_in, c_out, _, transcoders = trained
    x = data.eval_x[:, :50]
    with torch.no_grad():
        scaled = features.decode(features.top_k(features.pre(x * c_in[:, None, None]), config.k))
    expected = scaled / c_out[:, None, None]
    layers = transcoder_layers(model, transcoders)
    got = torch.stack([layer.b_dec.expand(50, -1).clone() for layer in layers])
    for layer in layers:
        acts = layer.encode(x[layer.layer].double())
        for j, o in enumerate(layer.out_layers):
            got[o] += acts @ layer.decoders[:, j]
    torch.testing.assert_close(got.float(), expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_metrics_match_a_dense_recomputation(trained, model, data):
    transcoders = trained[5]
    metrics = transcoder_metrics(model, transcoders, data)
    x, y = data.eval_x.double(), data.eval_y.double()
    if isinstance(transcoders, CrossLayerTranscoder):
        out = transcoders(x)
        acts = transcoders.encode(x)
    else:
        out = torch.stack([sae(x[i]) for i, sae in enumerate(transcoders)])
        acts = torch.stack([sae.encode(x[i]) for i, sae in enumerate(transcoders)])
    for o in range(model.cfg.n_layers):
        expected = 1 - ((y[o] - out[o]) ** 2).sum() / ((y[o] - y[o].mean(0)) ** 2).sum()
        assert metrics.variance_explained[o] == pytest.approx(float(expected.detach()), abs=1e-9)
        assert metrics.l0[o] == pytest.approx(float((acts[o] != 0).sum(-1).double().mean()), abs=1e-12)
    assert min(metrics.variance_explained) > 0.5  # trained: far above the 0 of the mean output
    assert metrics.ce_zero_ablated != metrics.ce_clean


def test_splicing_equals_the_sae_splice(trained, model):
    transcoders = trained[5]
    if isinstance(transcoders, CrossLayerTranscoder):
        pytest.skip("the SAE splice takes one SAE per layer")
    tokens = TOKENS[:2, :10]
    with splice_transcoders(model, transcoders):
        ours = model(tokens)
    torch.testing.assert_close(ours, model.run_with_saes(tokens, saes=transcoders), rtol=0, atol=1e-12)


def test_files_round_trip_exactly(trained, tmp_path, model):
    from analysis.attribution_graphs import save_transcoders, training_record

    transcoders = trained[5]
    save_transcoders(transcoders, tmp_path, {"note": 1})
    loaded = load_transcoders(tmp_path)
    assert training_record(tmp_path) == {"note": 1}
    before, after = transcoder_layers(model, transcoders), transcoder_layers(model, loaded)
    for a, b in zip(before, after):
        for name, tensor in a.parameters().items():
            assert torch.equal(tensor, b.parameters()[name]), name


def test_an_edit_moves_the_mlp_output_by_its_decoder_row(trained, model):
    transcoders = trained[5]
    layers = transcoder_layers(model, transcoders)
    tokens = TOKENS[:1, :10]
    _, cache = model.run_with_cache(tokens)
    acts = layers[0].encode(cache[layers[0].reads])
    pos, feature = (int(i) for i in (acts[0] != 0).nonzero()[3])
    edit = FeatureEdit(0, feature, scale=0.0, positions=(pos,))
    with edit_features(model, transcoders, [edit]):
        _, edited = model.run_with_cache(tokens)
    change = edited[layers[0].writes] - cache[layers[0].writes]
    expected = torch.zeros_like(change)
    expected[0, pos] = -acts[0, pos, feature] * layers[0].decoders[feature, 0]
    torch.testing.assert_close(change, expected, rtol=0, atol=1e-12)
    with edit_features(model, transcoders, [FeatureEdit(0, feature, scale=1.0), FeatureEdit(1, 2, scale=1.0)]):
        unchanged = model(tokens)
    assert torch.equal(unchanged, model(tokens))


def test_generation_with_a_no_op_edit_is_the_models_own(model, trained):
    tokens = TOKENS[0, :6]
    plain = model.generate(tokens, max_new_tokens=4, temperature=0.0)
    assert torch.equal(generate_with_edits(model, trained[5], tokens, [FeatureEdit(1, 0, scale=1.0)], 4), plain)
    steered = generate_with_edits(model, trained[5], tokens, [FeatureEdit(1, 0, scale=None, value=50.0)], 4)
    assert steered.shape == plain.shape


def test_bad_input_is_named(model):
    with pytest.raises(ValueError, match="k must be at most d_transcoder=8, got k=9"):
        TranscoderTrainingConfig(d_transcoder=8, k=9)
    with pytest.raises(ValueError, match="reads must be one of"):
        TranscoderTrainingConfig(reads="output")
    with pytest.raises(ProcessingMismatch, match="fold_ln"):
        harvest_mlp_activations(perturbed_decoder(CONFIGS["gpt2"]()), TOKENS, _config(False), progress=False)
    with pytest.raises(ValueError, match="at least eval_every=10"):
        harvest_mlp_activations(model, TOKENS[:5], _config(False), progress=False)
    with pytest.raises(ValueError, match=r"L<layer>:F<feature>"):
        parse_feature_edit("12:345")
    with pytest.raises(ValueError, match="=<value>"):
        parse_feature_edit("L1:F2@3", steer=True)
    assert parse_feature_edit("L1:F2@3,4") == FeatureEdit(1, 2, positions=(3, 4))
    assert parse_feature_edit("L1:F2=-2.5", steer=True) == FeatureEdit(1, 2, scale=None, value=-2.5)
    with (
        pytest.raises(ValueError, match=r"feature must be in \[0, 20\) for layer 1, got 99"),
        edit_features(model, _random(model), [FeatureEdit(1, 99)]),
    ):
        pass


def _random(model):
    from analysis.attribution_graphs import random_transcoders

    return random_transcoders(model, 20, architecture="topk", k=3)


def test_command_lines_train_then_graph(tmp_path, capsys):
    """``train-transcoders`` on a GPT-2 directory, then ``graph`` with the HTML view, the JSON and an ablation."""
    directory = tmp_path / "gpt2"
    tiny_gpt2(seed=0, vocab_size=50257, n_positions=64).save_pretrained(directory)
    out = tmp_path / "tc"
    argv = ["train-transcoders", "--model", directory, "--out", out, "--d-transcoder", "16", "--k", "2"]
    argv += ["--max-tokens", "400", "--epochs", "1", "--batch-size", "64", "--context-length", "32", "--no-progress"]
    assert main([str(a) for a in argv]) == EXIT_OK
    printed = capsys.readouterr().out
    record = json.loads((out / "training.json").read_text())
    assert f"L0 {sum(record['metrics']['l0']) / 2:.1f}" in printed
    assert record["config"]["d_transcoder"] == 16
    html, graph_json = tmp_path / "graph.html", tmp_path / "graph.json"
    argv = ["graph", "--model", directory, "--transcoders", out, "--prompt", "The cat sat on the", "--out", html]
    argv += ["--json", graph_json, "--ablate", "L1:F0", "--max-new-tokens", "3"]
    assert main([str(a) for a in argv]) == EXIT_OK
    printed = capsys.readouterr().out
    assert "replacement score" in printed and "with 1 edit(s)" in printed
    assert html.is_file() and json.loads(graph_json.read_text())["metadata"]["prompt"]
    assert main(["graph", "--model", str(directory), "--prompt", "x"]) == EXIT_USAGE
    assert "--transcoders DIR is needed" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["jumprelu", "topk", "skip", "relu"])
def test_circuit_tracers_per_layer_layout_round_trips_exactly(tmp_path, kind):
    from safetensors.torch import load_file

    from analysis.attribution_graphs import random_transcoders
    from analysis.attribution_graphs.circuit_tracer_files import load_circuit_tracer, save_circuit_tracer

    model = folded("llama_gqa")
    architectures = {"jumprelu": "jumprelu_transcoder", "topk": "topk", "skip": "skip_transcoder", "relu": "transcoder"}
    saes = random_transcoders(model, 20, architecture=architectures[kind], k=3 if kind == "topk" else None)
    save_circuit_tracer(model, saes, tmp_path / "a", scan="tiny")
    stored = load_file(str(tmp_path / "a" / "layer_1.safetensors"))
    assert torch.equal(stored["W_enc"], saes[1].W_enc.T)  # circuit-tracer's [d_transcoder, d_model]
    loaded = load_circuit_tracer(model, tmp_path / "a")
    for before, after in zip(saes, loaded):
        assert after.cfg.architecture == before.cfg.architecture and after.cfg.k == before.cfg.k
        assert (after.hook_name, after.hook_name_out) == (before.hook_name, before.hook_name_out)
        for name, tensor in before.state_dict().items():
            assert torch.equal(tensor, after.state_dict()[name]), name
    save_circuit_tracer(model, loaded, tmp_path / "b", scan="tiny")
    for name in ("config.yaml", "layer_0.safetensors", "layer_1.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_circuit_tracer_layout_refuses_what_it_cannot_hold(tmp_path):
    from safetensors.torch import load_file, save_file

    from analysis.attribution_graphs import random_transcoders
    from analysis.attribution_graphs.circuit_tracer_files import load_circuit_tracer, save_circuit_tracer

    model = folded("llama_gqa")
    saes = random_transcoders(model, 20, threshold=0.1)
    save_circuit_tracer(model, saes, tmp_path)
    tensors = load_file(str(tmp_path / "layer_0.safetensors"))
    save_file(
        {**tensors, "activation_function.threshold": -tensors["activation_function.threshold"]},
        str(tmp_path / "layer_0.safetensors"),
    )
    with pytest.raises(ValueError, match="negative threshold"):
        load_circuit_tracer(model, tmp_path)
    save_file({**tensors, "W_extra": tensors["b_dec"].clone()}, str(tmp_path / "layer_0.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected \['W_extra'\]"):
        load_circuit_tracer(model, tmp_path)
    mixed = [saes[0], random_transcoders(model, 20, architecture="topk", k=2)[1]]
    with pytest.raises(ValueError, match="one input hook, output hook, activation and k"):
        save_circuit_tracer(model, mixed, tmp_path / "mixed")

"""Linear probes: a direction planted in a model built from parts is found where it is written and not before;
bad input gets a named error; the ``probe`` command writes its page."""

import json
import re

import pytest
import torch

from analysis.cli import main
from analysis.cli.common import EXIT_OK, EXIT_USAGE
from analysis.probes import control_targets, fit_probe, fit_probes
from interp_transformer.builder import build_decoder

N_CLASS = 20  # tokens 0..19 are the class; the rest are fillers
LENGTH, N_EXAMPLES, WRITER_LAYER, SCALE = 12, 600, 1, 4.0


def planted_model():
    """Attention-only, no norms. Block 0 writes nothing. Block 1's head 0 attends uniformly to the prefix
    (W_Q = W_K = 0), reads coordinate 0 of the embedding (1 on the class's tokens, 0 elsewhere) and writes
    ``SCALE * d``: at the last token, ``SCALE * d * (class tokens so far) / (position + 1)``. Head 1 writes
    nothing. Block 2 keeps its random weights."""
    model = build_decoder(d_model=32, n_layers=3, n_heads=2, d_mlp=None, d_vocab=400, n_ctx=16, norm="none", seed=0)
    direction = torch.randn(32, generator=torch.Generator().manual_seed(1))
    direction /= direction.norm()
    with torch.no_grad():
        model.W_E[:, 0] = 0.0
        model.W_E[:N_CLASS, 0] = 1.0
        model.W_pos[:, 0] = 0.0
        for attn in (model.blocks[0].attn, model.blocks[WRITER_LAYER].attn):
            attn.W_O.zero_(), attn.b_O.zero_()
        writer = model.blocks[WRITER_LAYER].attn
        writer.W_Q.zero_(), writer.W_K.zero_(), writer.b_Q.zero_(), writer.b_K.zero_()
        writer.W_V.zero_(), writer.b_V.zero_()
        writer.W_V[0, 0, 0] = 1.0
        writer.W_O[0, 0] = SCALE * direction
    return model, direction


def planted_examples(seed=0):
    """Random fillers ending in a filler; half the examples hold 1-3 class tokens. Label: a class token is there."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(N_CLASS, 400, (N_EXAMPLES, LENGTH), generator=generator)
    labels = torch.rand(N_EXAMPLES, generator=generator) < 0.5
    for i in torch.nonzero(labels).flatten():
        n = int(torch.randint(1, 4, (), generator=generator))
        where = torch.randperm(LENGTH - 1, generator=generator)[:n]
        tokens[i, where] = torch.randint(0, N_CLASS, (n,), generator=generator)
    return tokens, labels.long()


@pytest.fixture(scope="module")
def planted():
    model, direction = planted_model()
    tokens, labels = planted_examples()
    # a full name and a short one (at every layer); blocks.0.hook_resid_post is block 1's input
    results = fit_probes(model, tokens, labels, hooks=["blocks.0.hook_resid_pre", "resid_post"], progress=False)
    return model, direction, tokens, labels, results


def test_a_probe_after_the_write_recovers_the_planted_direction(planted):
    _, direction, _, _, results = planted
    for site in (f"blocks.{WRITER_LAYER}.hook_resid_post", f"blocks.{WRITER_LAYER + 1}.hook_resid_post"):
        probe = results[site]
        assert probe.test_accuracy >= 0.99, (site, probe.test_accuracy)
        # the direction is in the basis of the raw residual stream the probe reads
        assert torch.cosine_similarity(probe.direction.float(), direction, dim=0) >= 0.95, site
        assert probe.selectivity >= 0.3, (site, probe.control_accuracy)


def test_a_probe_before_the_write_is_at_chance(planted):
    # the last token is a random filler and nothing is written before block 1: no probe can beat chance there
    _, _, _, _, results = planted
    for site in ("blocks.0.hook_resid_pre", "blocks.0.hook_resid_post"):
        probe = results[site]
        assert probe.test_accuracy <= 0.65, (site, probe.test_accuracy)
        assert probe.selectivity < 0.15, (site, probe.selectivity)


def test_per_head_outputs_find_the_writing_head_only(planted):
    model, direction, tokens, labels, _ = planted
    results = fit_probes(model, tokens, labels, hooks="result", layers=[WRITER_LAYER], progress=False, control=False)
    assert [probe.site.head for probe in results.probes] == [0, 1]
    writer, silent = results.probes
    assert writer.test_accuracy >= 0.99
    assert torch.cosine_similarity(writer.direction.float(), direction, dim=0) >= 0.95
    assert silent.test_accuracy <= 0.65 and silent.control_accuracy is None


def test_token_level_labels_skip_none_and_split_by_example(planted):
    model, _, tokens, _, _ = planted
    seen = (tokens < N_CLASS).long().cummax(dim=1).values  # a class token at or before each position
    labels = [[None] + row[1:] for row in seen.tolist()]
    results = fit_probes(
        model,
        tokens[:200],
        labels[:200],
        hooks=["resid_post"],
        layers=[WRITER_LAYER],
        position="all",
        progress=False,
    )
    assert results.n_rows == 200 * (LENGTH - 1)
    assert not set(results.split["train"].tolist()) & set(results.split["test"].tolist())
    assert results.probes[0].test_accuracy >= 0.95


def test_the_control_task_gives_each_type_one_label():
    types = ["a", "b", "a", "c", "b", "a"] * 20
    control = control_targets(types, torch.tensor([0, 1] * 60), seed=3)
    for kind in set(types):
        assert len({int(c) for c, t in zip(control, types) if t == kind}) == 1
    assert set(control.tolist()) <= {0, 1}


def test_fit_probe_reads_an_axis_and_refuses_nan():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, generator=generator)
    y = (x[:, 4] > 0).long()
    parts = torch.arange(120), torch.arange(120, 160), torch.arange(160, 200)
    probe = fit_probe(x * 50 + 7, y, *parts)  # centring and one global scale: the axis stays the axis
    assert probe.test_accuracy >= 0.9 and probe.direction.abs().argmax() == 4 and probe.direction[4] > 0.9
    x[3, 2] = float("nan")
    with pytest.raises(ValueError, match="1 feature values are not finite"):
        fit_probe(x, y, *parts)


# --- bad input -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return build_decoder(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=50, n_ctx=8, seed=0)


TINY_TOKENS = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 5, 9], [2, 4, 8], [3, 6, 9]] * 2
TINY_LABELS = [0, 1] * 6


def test_labels_of_another_length_are_refused(tiny):
    with pytest.raises(ValueError, match="got 11 labels for 12 examples"):
        fit_probes(tiny, TINY_TOKENS, TINY_LABELS[:-1], progress=False)
    with pytest.raises(ValueError, match=r"labels\[0\] has 2 labels for an example of 3 tokens"):
        fit_probes(tiny, TINY_TOKENS, [[0, 1]] + [[0, 1, 0]] * 11, position="all", progress=False)


def test_an_unknown_hook_is_refused_with_the_closest_names(tiny):
    with pytest.raises(KeyError, match="resid_post"):
        fit_probes(tiny, TINY_TOKENS, TINY_LABELS, hooks=["resid_psot"], progress=False)
    with pytest.raises(KeyError, match="blocks.0.hook_resid_post"):
        fit_probes(tiny, TINY_TOKENS, TINY_LABELS, hooks=["blocks.0.hook_resid_pots"], progress=False)


def test_one_class_only_is_refused(tiny):
    with pytest.raises(ValueError, match="one class only"):
        fit_probes(tiny, TINY_TOKENS, [1] * 12, progress=False)


def test_nan_activations_are_refused(tiny):
    model = build_decoder(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=50, n_ctx=8, seed=0)
    with torch.no_grad():
        model.W_E[9] = float("nan")
    with pytest.raises(ValueError, match="blocks.0.hook_resid_post: .* not finite"):
        fit_probes(model, TINY_TOKENS, TINY_LABELS, progress=False)


def test_a_layer_or_head_out_of_range_is_refused(tiny):
    with pytest.raises(KeyError, match="layer 2 out of range for a model with 2 layers"):
        fit_probes(tiny, TINY_TOKENS, TINY_LABELS, layers=[2], progress=False)
    with pytest.raises(ValueError, match="head 5 is out of range: the model has 2 heads"):
        fit_probes(tiny, TINY_TOKENS, TINY_LABELS, hooks="result", heads=[5], progress=False)


# --- the command ---------------------------------------------------------------------------------------------
def _write(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def _records(n=60):
    """Token ids for induction-2l (d_vocab 64), labelled by whether token 3 occurs."""
    tokens = torch.randint(4, 64, (n, 8), generator=torch.Generator().manual_seed(0))
    tokens[::2, 2] = 3
    return [{"tokens": row, "label": int(3 in row)} for row in tokens.tolist()]


def test_the_command_writes_an_offline_page(tmp_path, capsys):
    data = _write(tmp_path / "data.jsonl", _records())
    out = tmp_path / "page.html"
    code = main(
        ["probe", "--model", "induction-2l", "--data", str(data), "--out", str(out), "--no-progress", "--threads", "1"]
    )
    assert code == EXIT_OK, capsys.readouterr().err
    page = out.read_text()
    assert "blocks.1.hook_resid_post" in capsys.readouterr().out
    assert "selectivity" in page and "plotly" in page and "<script src=" not in page


@pytest.mark.parametrize(
    "records, options, message",
    [
        ([{"tokens": [1, 2], "label": 0}] * 4, [], "one class only"),
        ([{"tokens": [1, 2]}] * 4, [], r"line 1: .*'label'"),
        (_records(), ["--hooks", "resid_psot"], "closest"),
        (_records(), ["--layers", "7"], "layer 7 out of range"),
    ],
)
def test_the_command_reports_bad_input_in_one_line(tmp_path, capsys, records, options, message):
    data = _write(tmp_path / "data.jsonl", records)
    code = main(["probe", "--model", "induction-2l", "--data", str(data), "--no-progress", *options])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1 and "Traceback" not in err[0], err
    assert re.search(message, err[0]), err[0]

"""``interp-transformer circuit`` and ``circuit_report`` on the shipped induction model: the printed circuit is the
library's own, its faithfulness is ``run_circuit``'s, and the page opens offline."""

import pytest
import torch

from analysis.cli import EXIT_OK, EXIT_USAGE, main
from analysis.discovery import (
    circuit_nodes,
    edge_attribution_patching,
    induction_task,
    prune,
    run_circuit,
    top_edges,
)
from analysis.discovery.report import circuit_report
from interp_transformer.pretrained import load_shipped


@pytest.fixture(scope="module")
def model():
    return load_shipped("induction-2l")


@pytest.fixture(scope="module")
def task(model):
    return induction_task(model, 6, 6, seed=0)


def test_the_reports_circuit_is_the_librarys_and_its_faithfulness_is_run_circuits(model, task):
    report = circuit_report(model, task, method="EAP-IG", steps=3, fraction=0.1)
    data = report["circuit"].data
    scores = edge_attribution_patching(
        model, task.clean, task.corrupted, task.metric, method="EAP-IG", steps=3, attention_mask=task.attention_mask
    )
    kept = prune(scores, top_edges(scores, round(0.1 * int(scores.edge.sum()))))
    assert torch.equal(data.kept, kept) and data.nodes == circuit_nodes(scores, kept)
    circuit = run_circuit(model, task.clean, task.corrupted, task.metric, kept).mean()
    clean, corrupted = task.evaluate(model).double().mean(), task.evaluate(model, corrupted=True).double().mean()
    assert data.faithfulness == pytest.approx(float((circuit - corrupted) / (clean - corrupted)), abs=1e-6)
    assert clean > corrupted + 1  # the shipped model does induction: there is a behaviour to recover
    assert any(node.startswith("L1H") for node in data.nodes)  # an induction head sits in the second layer
    page = report.to_html()
    assert 'src="http' not in page and "* plotly.js v" in page and "circuit" in page
    assert [s.key for s in report.sections] == ["circuit", "nodes", "edges", "faithfulness"]


def test_the_command_prints_the_circuit_and_writes_the_page(model, task, tmp_path, capsys):
    out_file = tmp_path / "circuit.html"
    argv = ["circuit", "--model", "induction-2l", "--task", "induction", "--prompts", "6", "--seq-len", "6"]
    code = main(argv + ["--steps", "3", "--fraction", "0.1", "--out", str(out_file)])
    out, _ = capsys.readouterr()
    assert code == EXIT_OK, out
    data = circuit_report(model, task, steps=3, fraction=0.1)["circuit"].data
    assert f"faithfulness {data.faithfulness:.2f}" in out and ", ".join(data.nodes) in out
    assert out_file.stat().st_size > 100_000 and 'src="http' not in out_file.read_text()


def test_bad_tasks_and_fractions_are_refused(model, task, capsys):
    code = main(["circuit", "--model", "induction-2l", "--task", "no-such-task.csv"])
    _, err = capsys.readouterr()
    assert code == EXIT_USAGE and "--task must be ioi, greater-than, induction or a CSV/JSON file" in err
    with pytest.raises(ValueError, match="fraction must be in"):
        circuit_report(model, task, fraction=0)


def test_the_report_shows_a_whole_attention_sublayers_pattern_where_heads_are_no_nodes():
    """Gemma 2/3 normalize attention's output before the stream, so the node is the sublayer (``L0.attn``): the page
    shows its heads' mean pattern on a click, and the report builds."""
    from analysis.discovery.report import _patterns
    from analysis.discovery.tasks import induction_task
    from interp_transformer import DemoTransformer
    from interp_transformer.families.gemma.recipe import GemmaConfig

    cfg = GemmaConfig(
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_key_value_heads=2,
        d_head=8,
        d_mlp=64,
        d_vocab=50,
        n_ctx=32,
        post_norms=True,
    )
    torch.manual_seed(0)
    gemma = DemoTransformer(cfg).eval()
    task = induction_task(gemma, n_prompts=2, seq_len=4, seed=0)
    tokens, patterns = _patterns(gemma, task, ["L1.attn", "MLP0", "input"])
    _, cache = gemma.run_with_cache(task.clean[:1])
    assert list(patterns) == ["L1.attn"] and len(tokens) == task.clean.shape[1]
    torch.testing.assert_close(patterns["L1.attn"], cache["pattern", 1][0].mean(0))
    assert circuit_report(gemma, task, method="EAP", fraction=0.5)["circuit"].data.nodes

"""Many circuits per forward equal one circuit per forward: the batched faithfulness curve and ``run_circuits``
against the reference that runs each circuit alone and sums every dropped edge at every read (float64, 1e-6).

Tiny builder decoders cover grouped-query attention, a mixture of experts, post-norm stream norms, parallel blocks
and a decoder with no norms; prompts padded with a mask; corrupted and mean ablation; one forward, or one circuit per
forward when the memory budget is small.
"""

import pytest
import torch

from analysis.discovery import edge_attribution_patching, faithfulness_curve, logit_diff_per_row, run_circuits
from analysis.discovery.faithfulness import _chunks, _prepare, _run_one
from interp_transformer.builder import build_decoder

from .perturbed import ANSWERS, CLEAN, CORRUPTED, perturb

METRIC = logit_diff_per_row(*ANSWERS)
SHAPE = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=24, d_vocab=31, n_ctx=12)
SPECS = {
    "gqa_rms_rotary": dict(n_key_value_heads=2, norm="rms", positions="rotary", gated_mlp=True),
    "moe_gqa": dict(n_key_value_heads=2, experts=dict(n_experts=3, top_k=2)),
    "post_norm": dict(placement="post", final_norm=False),
    "parallel": dict(parallel_residual=True, positions="rotary"),
    "no_norms": dict(norm="none"),
}
# the second prompt right-padded by two tokens (its answer read at its last real token)
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
PADDED_METRIC = logit_diff_per_row(*ANSWERS, pos=torch.tensor([-1, 3]))


@pytest.fixture(scope="module", params=sorted(SPECS))
def model(request):
    return perturb(build_decoder(**SHAPE, **SPECS[request.param], dtype=torch.float64, seed=0))


@pytest.fixture(scope="module")
def scores(model):
    return edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="EAP-IG", steps=2)


def _random_circuits(scores, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` circuits of random edges, from a few to most of the graph's: many nodes keep some edges, drop others."""
    generator = torch.Generator().manual_seed(seed)
    shares = torch.linspace(0.02, 0.9, n)
    return torch.stack([(torch.rand(scores.edge.shape, generator=generator) < p) & scores.edge for p in shares])


@pytest.mark.parametrize("selection", ["top", "greedy"])
@pytest.mark.parametrize("ablation", ["corrupted", "mean"])
def test_the_batched_curve_is_the_curve_one_size_at_a_time(model, scores, selection, ablation):
    n_edges = int(scores.edge.sum())
    counts = [0, 1, 3, 10, n_edges // 4, n_edges // 2, n_edges - 1, n_edges]
    options = dict(selection=selection, ablation=ablation)
    batched = faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, scores, counts, **options)
    alone = faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, scores, counts, one_at_a_time=True, **options)
    for field in ("metric", "clean", "corrupted", "normalized"):
        torch.testing.assert_close(getattr(batched, field), getattr(alone, field), rtol=0, atol=1e-6)
    assert batched.metric.dtype == torch.float64
    assert len(set(batched.normalized.tolist())) > 3  # the sizes differ: not one value repeated


def test_random_circuits_in_one_forward_or_one_per_forward_are_each_run_alone(model, scores):
    kept = _random_circuits(scores, 6)
    prepared = _prepare(model, CLEAN, CORRUPTED, METRIC, "corrupted", None)
    alone = torch.stack([_run_one(prepared, METRIC, circuit, "test") for circuit in kept])
    together = run_circuits(model, CLEAN, CORRUPTED, METRIC, kept)
    apart = run_circuits(model, CLEAN, CORRUPTED, METRIC, kept, memory_budget=1)
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-6)
    torch.testing.assert_close(apart, alone, rtol=0, atol=1e-6)
    assert together.shape == (6, 2) and (alone[1:] - alone[:-1]).abs().max() > 1e-3


def test_padded_prompts_with_a_mask_batched_equal_one_at_a_time(model, scores):
    padded = CLEAN.masked_fill(MASK == 0, 0), CORRUPTED.masked_fill(MASK == 0, 0)
    other = padded[0].masked_fill(MASK == 0, 7), padded[1].masked_fill(MASK == 0, 9)
    kept = _random_circuits(scores, 4, seed=1)
    for ablation in ("corrupted", "mean"):
        prepared = _prepare(model, *padded, PADDED_METRIC, ablation, MASK)
        alone = torch.stack([_run_one(prepared, PADDED_METRIC, circuit, "test") for circuit in kept])
        together = run_circuits(model, *padded, PADDED_METRIC, kept, ablation=ablation, attention_mask=MASK)
        torch.testing.assert_close(together, alone, rtol=0, atol=1e-6)
        # the padding is masked: what sits there changes nothing
        moved = run_circuits(model, *other, PADDED_METRIC, kept, ablation=ablation, attention_mask=MASK)
        torch.testing.assert_close(moved, together, rtol=0, atol=1e-10)


def test_the_memory_budget_decides_how_many_circuits_share_a_forward(model, scores):
    kept = _random_circuits(scores, 5)
    prepared = _prepare(model, CLEAN, CORRUPTED, METRIC, "corrupted", None)
    assert _chunks(prepared, kept, 1, None) == [[i] for i in range(5)]  # sorted by size, one per forward
    assert _chunks(prepared, kept, 2**40, None) == [list(range(5))]
    assert _chunks(prepared, kept, 2**40, 2) == [[0, 1], [2, 3], [4]]


def test_bad_circuits_are_refused(model, scores):
    with pytest.raises(ValueError, match=r"kept must be a bool tensor \[circuit, upstream, reader\]"):
        run_circuits(model, CLEAN, CORRUPTED, METRIC, scores.edge)
    with pytest.raises(ValueError, match="with at least one circuit"):
        run_circuits(model, CLEAN, CORRUPTED, METRIC, scores.edge[None][:0])
    with pytest.raises(ValueError, match="memory_budget"):
        run_circuits(model, CLEAN, CORRUPTED, METRIC, scores.edge[None], memory_budget=0)
    flat = lambda logits, prompt: logits[:, 0, 0] * 0  # noqa: E731  a metric the output does not move
    with pytest.raises(ValueError, match="no behaviour to recover"):
        faithfulness_curve(model, CLEAN, CORRUPTED, flat, scores, [1, 2])


def test_the_progress_bar_counts_every_circuit_and_ends_full(model, scores, capsys):
    faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, scores, [1, 5], progress=True, memory_budget=1)
    _, err = capsys.readouterr()
    assert "3/4 circuits, 1 in this forward" in err and "100%|██████████| [" in err and "4/4 circuits]" in err
    faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, scores, [1, 5])
    assert capsys.readouterr().err == ""  # no bar unless asked


# the circuit command: a readable default circuit, --sizes, --threads, every edge's score written out


@pytest.fixture(scope="module")
def induction():
    from analysis.discovery import induction_task
    from interp_transformer.pretrained import load_shipped

    model = load_shipped("induction-2l")
    return model, induction_task(model, 6, 6, seed=0)


def test_the_default_circuit_is_tens_of_edges_and_names_the_smallest_faithful_size(induction):
    from analysis.discovery.report import DEFAULT_EDGES, FRACTIONS, TARGET, circuit_report

    model, task = induction
    data = circuit_report(model, task, steps=3)["circuit"].data
    n_edges = data.edges
    assert int(data.kept.sum()) <= DEFAULT_EDGES < n_edges
    mib = {max(1, round(f * n_edges)) for f in FRACTIONS}
    assert set(data.counts) == mib | {0, DEFAULT_EDGES}
    reaching = [n for n, value in zip(data.counts, data.curve) if value >= TARGET]
    assert data.smallest_faithful == min(reaching)
    chosen = circuit_report(model, task, steps=3, sizes="3,10%", edges=20)["circuit"].data
    assert chosen.counts == sorted({0, 3, 20, round(0.1 * n_edges)}) and int(chosen.kept.sum()) <= 20


def test_the_command_writes_every_edges_score_and_links_it(induction, tmp_path, capsys):
    import csv

    from analysis.cli import EXIT_OK, main

    out = tmp_path / "circuit.html"
    argv = ["circuit", "--model", "induction-2l", "--task", "induction", "--prompts", "6", "--seq-len", "6"]
    threads = torch.get_num_threads()
    try:
        assert main(argv + ["--steps", "3", "--sizes", "5,50%", "--threads", "1", "--out", str(out)]) == EXIT_OK
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    printed, err = capsys.readouterr()
    rows = list(csv.DictReader((tmp_path / "circuit_edges.csv").open()))
    edges = sum(1 for row in rows)
    assert f"scored {edges} edges" in printed and "the circuit (the 50 strongest edges" in printed
    assert 'href="circuit_edges.csv"' in out.read_text()
    assert sum(int(row["in_circuit"]) for row in rows) <= 50
    strengths = [abs(float(row["score"])) for row in rows]
    assert strengths == sorted(strengths, reverse=True)
    assert "circuits" in err  # the curve's progress bar


@pytest.mark.parametrize(
    "option, message",
    [
        (["--sizes", "0%"], "percentages of the edges in (0, 100]"),
        (["--sizes", "150%"], "percentages of the edges in (0, 100]"),
        (["--sizes", "5,ten"], "'ten'"),
        (["--sizes", "0"], "edge counts (ints >= 1)"),
        (["--threads", "0"], "--threads"),
        (["--edges", "0"], "edge counts (ints >= 1)"),
    ],
)
def test_bad_sizes_and_threads_are_refused_before_a_model_loads(option, message, capsys, monkeypatch):
    import analysis.cli.discovery as cli_discovery
    from analysis.cli import EXIT_USAGE, main

    monkeypatch.setattr(cli_discovery, "load_model", lambda *a: pytest.fail("the model loaded"))
    threads = torch.get_num_threads()
    code = main(["circuit", "--model", "induction-2l", "--task", "induction"] + option)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1 and message in err[0], err
    assert torch.get_num_threads() == threads


def test_sizes_beyond_the_graph_and_two_sizes_at_once_are_refused(induction, capsys):
    from analysis.cli import EXIT_USAGE, main
    from analysis.discovery.report import circuit_report

    model, task = induction
    with pytest.raises(ValueError, match=r"got 100000 edges, but the graph has \d+"):
        circuit_report(model, task, sizes=[100000])
    with pytest.raises(ValueError, match="give the circuit's size once"):
        circuit_report(model, task, edges=5, fraction=0.1)
    code = main(["circuit", "--model", "induction-2l", "--task", "induction", "--edges", "5", "--fraction", "0.1"])
    assert code == EXIT_USAGE and "give the circuit's size once" in capsys.readouterr().err

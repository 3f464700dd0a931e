"""Circuit discovery refuses bad metrics, counts, token ids, positions and prompts by name, never a silent number.

- A metric that gives NaN or inf (on any prompt, at any patch) is refused where its value enters, naming the tool,
  the value and the rows; selections refuse NaN edge scores, naming the edges.
- A count is an int >= its minimum: a negative, bool or float one is refused naming the range and the value; a count
  above what exists lists every real entry (real edges only, never non-edges).
- ``logit_diff_per_row`` refuses token ids outside ``[0, d_vocab)`` and positions outside ``[-n_pos, n_pos)``; a task
  refuses a model whose tokenizer is not the one it was built with; an empty prompt is refused.
"""

import copy
import json
from pathlib import Path

import pytest
import torch

from analysis import patching
from analysis.cli import EXIT_USAGE, main
from analysis.discovery import (
    EdgeScores,
    attribution_patching,
    edge_attribution_patching,
    faithfulness_curve,
    greater_than_metric,
    greater_than_task,
    greedy_edges,
    induction_task,
    ioi_task,
    load_seq2seq_task,
    logit_diff_per_row,
    patch_sites,
    patch_sites_one_by_one,
    run_circuit,
    sites,
    threshold_edges,
    top_edges,
)
from analysis.discovery.batched import rows_per_chunk
from analysis.discovery.tasks import load_task
from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.pretrained import load_shipped
from interp_transformer.text.gpt2_tokenizer import gpt2_tokenizer_from_files
from interp_transformer.text.tokens import offline_gpt2_tokenizer, offline_gpt2_tokenizer_paths

from .perturbed import ANSWERS, CLEAN, CORRUPTED, perturbed_decoder
from .perturbed import SMALL_SHAPE as SHAPE

METRIC = logit_diff_per_row(*ANSWERS)


@pytest.fixture(scope="module")
def model():
    return perturbed_decoder(TransformerConfig(**SHAPE))


@pytest.fixture(scope="module")
def edges(model):
    return edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)


def _small(tokenizer=None, d_vocab: int = 50257) -> DemoTransformer:
    cfg = TransformerConfig(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=16, d_vocab=d_vocab, n_ctx=64)
    return DemoTransformer(cfg, tokenizer=tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def gpt2():
    """A small random model with GPT-2's vocabulary and real tokenizer."""
    return _small(offline_gpt2_tokenizer())


def spoiled(bad: float):
    """``METRIC`` with ``bad`` added on prompt 1 only (still differentiable)."""

    def metric(logits, prompt):
        return METRIC(logits, prompt) + torch.where(prompt == 1, bad, 0.0).to(logits.dtype)

    return metric


def toy(mean=None) -> EdgeScores:
    """input, A, B write; A reads "A.in", B reads "B.in"; A -> B.in, everything -> logits: 6 edges of 9 cells."""
    upstream, readers = ["input", "A", "B"], ["A.in", "B.in", "logits"]
    edge = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=torch.bool)
    if mean is None:
        mean = torch.tensor([[0.5, 4.0, 0.0], [0.0, -3.0, 0.2], [0.0, 0.0, -1.0]], dtype=torch.float64)
    scores = torch.stack([mean - 0.1, mean + 0.1], dim=-1) * edge[..., None]
    return EdgeScores(upstream, readers, edge, scores, "EAP", {"input": (), "A": ("A.in",), "B": ("B.in",)})


# --- 1: non-finite metrics ---------------------------------------------------------------------------
TOOLS = {  # (model, metric, the model's edge scores) -> the tool's result
    "patch_sites": lambda m, metric, _: patch_sites(m, CLEAN, CORRUPTED, metric, sites(m, "heads"), progress=False),
    "patch_sites_one_by_one": lambda m, metric, _: patch_sites_one_by_one(
        m, CLEAN, CORRUPTED, metric, sites(m, "heads"), progress=False
    ),
    "attribution_patching": lambda m, metric, _: attribution_patching(m, CLEAN, CORRUPTED, metric, sites(m, "heads")),
    "edge_attribution_patching": lambda m, metric, _: edge_attribution_patching(m, CLEAN, CORRUPTED, metric),
    "edge_attribution_patching-IG": lambda m, metric, _: edge_attribution_patching(
        m, CLEAN, CORRUPTED, metric, method="EAP-IG", steps=2
    ),
    "run_circuit": lambda m, metric, edges: run_circuit(m, CLEAN, CORRUPTED, metric, edges.edge.clone()),
    "faithfulness_curve": lambda m, metric, edges: faithfulness_curve(m, CLEAN, CORRUPTED, metric, edges, [1]),
}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_non_finite_metric_is_refused_naming_the_tool_value_and_row(model, edges, tool, bad):
    name = tool.removesuffix("-IG")
    with pytest.raises(ValueError, match=rf"{name}.*non-finite.*{bad}.*prompt 1") as error:
        TOOLS[tool](model, spoiled(bad), edges)
    assert "prompt 0" not in str(error.value)  # only the row that gave it


def test_batched_patching_names_the_site_of_a_non_finite_metric(model):
    chosen = sites(model, "heads")

    def only_when_patched(logits, prompt):  # NaN on the rows whose site is the last one
        values = METRIC(logits, prompt)
        return values + torch.where(torch.arange(len(prompt)) >= len(prompt) - 2, float("nan"), 0.0)

    with pytest.raises(ValueError, match=rf"site '{chosen[-1].label}', prompt 0"):
        patch_sites(model, CLEAN, CORRUPTED, only_when_patched, chosen, sites_per_chunk=len(chosen), progress=False)


def test_scalar_patching_refuses_a_non_finite_metric(model):
    def metric(logits):
        return logits[:, -1, 0].mean() * float("nan")

    with pytest.raises(ValueError, match=r"patch_residual.*non-finite.*nan.*layer 0"):
        patching.patch_residual(model, CLEAN, CORRUPTED, metric, progress=False)
    with pytest.raises(ValueError, match=r"patch_head_outputs.*non-finite.*nan"):
        patching.patch_head_outputs(model, CLEAN, CORRUPTED, metric, progress=False)


def test_a_task_evaluation_refuses_a_non_finite_metric(gpt2):
    task = ioi_task(gpt2, 2)

    def metric(logits, prompt):
        return task.metric(logits, prompt) * float("inf")

    with pytest.raises(ValueError, match="non-finite.*inf"):
        task.evaluate(gpt2, metric)


@pytest.mark.parametrize("bad", [float("nan")])
def test_selections_refuse_nan_edge_scores_naming_the_edge(bad):
    mean = toy().mean.clone()
    mean[1, 1] = bad  # A -> B.in
    scores = toy(mean)
    for select in (
        lambda: top_edges(scores, 2),
        lambda: greedy_edges(scores, 6),
        lambda: threshold_edges(scores, 0.1),
        lambda: scores.top(3),
        lambda: scores.figure(3),
    ):
        with pytest.raises(ValueError, match=r"NaN.*A -> B\.in"):
            select()


def test_a_nan_on_a_non_edge_is_no_edge_score():
    scores = toy()
    scores.scores[2, 0] = float("nan")  # B -> A.in is no edge
    assert len(scores.top(100)) == 6


def test_a_nan_threshold_is_refused():
    with pytest.raises(ValueError, match="tau must be a number.*nan"):
        threshold_edges(toy(), float("nan"))


# --- 2: counts -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [-1, -3, True, 2.0, "3"])
def test_a_negative_or_non_int_count_is_refused_naming_range_and_value(k):
    scores = toy()
    for call in (scores.top, scores.figure):
        with pytest.raises(ValueError, match=rf"k must be an int >= 0.*got {k!r}"):
            call(k)


def test_a_count_above_the_edges_lists_every_real_edge_and_no_other(edges):
    n_edges = int(edges.edge.sum())
    listed = edges.top(n_edges + 50)
    assert len(listed) == n_edges
    up, read = {n: i for i, n in enumerate(edges.upstream)}, {n: j for j, n in enumerate(edges.readers)}
    assert all(bool(edges.edge[up[u], read[r]]) for u, r, _ in listed)
    assert len(toy().top(100)) == 6 and ("input", "logits", 0.0) in toy().top(100)  # a 0-score edge is an edge
    assert len(edges.figure(-1 + 10**6).data[0].y) == n_edges
    assert edges.top(0) == []


def test_circuit_sizes_outside_the_graph_are_refused_by_name():
    scores = toy()
    for select in (top_edges, greedy_edges):
        for n in (-1, 0, 7, True):
            with pytest.raises(ValueError, match=rf"a circuit needs 1 to 6 edges \(the graph's\), got {n!r}"):
                select(scores, n)


def test_cli_patch_refuses_a_negative_top_in_one_line(capsys, tmp_path):
    argv = ["patch", "--model", "induction-2l", "--clean", "0 11 22 33", "--corrupted", "0 11 22 44"]
    code = main([*argv, "--answer", "44", "--wrong", "55", "--top", "-3", "--out", str(tmp_path / "page.html")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1 and "Traceback" not in err[0], err
    assert "--top must be an int >= 1" in err[0] and "got -3" in err[0]


def test_patching_refuses_a_non_positive_memory_budget_and_empty_positions(model):
    chosen = sites(model, "heads")
    for budget in (0, -(2**30), 1.5):
        with pytest.raises(ValueError, match=rf"memory_budget must be an int >= 1.*got {budget!r}"):
            patch_sites(model, CLEAN, CORRUPTED, METRIC, chosen, memory_budget=budget, progress=False)
    with pytest.raises(ValueError, match="n_pos must be an int >= 1.*got 0"):
        rows_per_chunk(model, 0, 2**30)
    for n_pos in (0, -3):
        with pytest.raises(ValueError, match=rf"n_pos must be an int >= 1.*got {n_pos}"):
            sites(model, "heads", positions="each", n_pos=n_pos)


# --- 3: token ids, positions, tokenizers, empty prompts ---------------------------------------------------
def test_logit_diff_refuses_token_ids_outside_the_vocabulary(model):
    logits = model(CLEAN)
    with pytest.raises(ValueError, match=r"correct must lie in \[0, d_vocab\).*got \[-1\]"):
        logit_diff_per_row(-1, 1)
    with pytest.raises(ValueError, match=r"incorrect must lie in \[0, d_vocab\).*got \[-2\]"):
        logit_diff_per_row(torch.tensor([1, 2]), torch.tensor([3, -2]))
    with pytest.raises(ValueError, match=r"incorrect must lie in \[0, 31\).*d_vocab.*got \[31\]"):
        logit_diff_per_row(1, 31)(logits, torch.arange(2))
    with pytest.raises(ValueError, match=r"correct must lie in \[0, 31\).*got \[40\]"):
        logit_diff_per_row(torch.tensor([3, 40]), 2)(logits, torch.arange(2))
    with pytest.raises(TypeError, match="correct must be an int or an integer tensor"):
        logit_diff_per_row(1.5, 2)


def test_logit_diff_refuses_positions_outside_the_prompt_and_counts_negative_ones_from_the_end(model):
    logits = model(CLEAN)  # 6 positions
    rows = torch.arange(2)
    for pos in (99, 6, -7):
        with pytest.raises(ValueError, match=rf"pos must lie in \[-6, 6\).*6 tokens.*got \[{pos}\]"):
            logit_diff_per_row(1, 2, pos=pos)(logits, rows)
    with pytest.raises(ValueError, match=r"pos must lie in \[-6, 6\).*got \[8\]"):
        logit_diff_per_row(1, 2, pos=torch.tensor([2, 8]))(logits, rows)
    torch.testing.assert_close(logit_diff_per_row(1, 2, pos=-6)(logits, rows), logits[:, 0, 1] - logits[:, 0, 2])
    with pytest.raises(ValueError, match=r"pos has 1 entries, one per prompt, .*prompt 1"):
        logit_diff_per_row(1, 2, pos=torch.tensor([3]))(logits, rows)


def test_the_scalar_logit_diff_metric_refuses_the_same(model):
    logits = model(CLEAN)
    with pytest.raises(ValueError, match=r"correct must lie in \[0, d_vocab\).*got \[-1\]"):
        patching.logit_diff_metric(-1, 1)
    with pytest.raises(ValueError, match=r"pos must lie in \[-6, 6\).*got \[99\]"):
        patching.logit_diff_metric(1, 2, pos=99)(logits)


def test_a_task_refuses_a_model_with_another_tokenizer(gpt2):
    task = ioi_task(gpt2, 3)
    task.evaluate(gpt2)  # its own model
    longer = copy.deepcopy(gpt2.tokenizer)
    longer.add_tokens(["<another_token>"])
    for other in (_small(longer, 50258), _small(longer, 50257)):
        with pytest.raises(ValueError, match=r"task 'ioi' was built for a vocabulary of 50257 tokens.*50258"):
            task.evaluate(other)
    with pytest.raises(ValueError, match=r"task 'ioi' holds token id \d+.*d_vocab=31"):
        task.evaluate(_small(None, 31))
    random_tokens = induction_task(_small(None, 31), 2, 3)
    with pytest.raises(ValueError, match=r"task 'induction' was built for a vocabulary of 31 tokens.*50257"):
        random_tokens.evaluate(gpt2)


def test_a_task_refuses_a_tokenizer_that_writes_its_texts_otherwise(gpt2, tmp_path):
    task = ioi_task(gpt2, 2)
    answer, text = int(task.answer[0]), task.answer_text[0]
    encoder_json, vocab_bpe = offline_gpt2_tokenizer_paths()
    vocab = json.loads(Path(encoder_json).read_text(encoding="utf-8"))
    ours, neighbour = gpt2.tokenizer.convert_ids_to_tokens([answer, answer + 1])
    vocab[ours], vocab[neighbour] = answer + 1, answer  # the same size, the answer's token under another id
    (tmp_path / "encoder.json").write_text(json.dumps(vocab), encoding="utf-8")
    other = _small(gpt2_tokenizer_from_files(tmp_path / "encoder.json", vocab_bpe))
    assert len(other.tokenizer) == len(gpt2.tokenizer)
    with pytest.raises(ValueError, match=rf"task 'ioi'.*{text!r} is \[{answer}\] in the task.*\[{answer + 1}\]"):
        task.evaluate(other)


def test_empty_prompts_are_refused(gpt2):
    metric = logit_diff_per_row(1, 2)
    with pytest.raises(ValueError, match="clean prompt 0 is empty"):
        patch_sites(gpt2, "", "", metric, sites(gpt2, "heads"), progress=False)
    with pytest.raises(ValueError, match="corrupted prompt 1 is empty"):
        patch_sites(gpt2, ["a b", "c d"], ["a b", ""], metric, sites(gpt2, "heads"), progress=False)
    with pytest.raises(ValueError, match="clean prompt 0 is empty"):
        attribution_patching(gpt2, "", "", metric, sites(gpt2, "heads"))
    rows = [{"clean": "", "corrupted": "", "answer": " Mary", "wrong": " John"}]
    with pytest.raises(ValueError, match="clean prompt 0 is empty"):
        load_task(gpt2, rows)


# --- 4: the rest of circuit discovery ----------------------------------------------------------------------
def test_the_circuit_report_and_greater_than_metric_refuse_another_tokenizer(gpt2):
    from analysis.discovery.report import circuit_report

    task = greater_than_task(gpt2, 2)
    longer = copy.deepcopy(gpt2.tokenizer)
    longer.add_tokens(["<another_token>"])
    other = _small(longer, 50258)
    with pytest.raises(ValueError, match=r"task 'greater-than' was built for a vocabulary of 50257 tokens"):
        greater_than_metric(other, task)
    with pytest.raises(ValueError, match=r"task 'greater-than' was built for a vocabulary of 50257 tokens"):
        circuit_report(other, task, method="EAP")


def test_an_encoder_decoders_task_refuses_empty_sources_and_a_non_finite_metric():
    model = load_shipped("translate-tiny")
    row = dict(source="six", corrupted_source="nine", target="", answer="6", wrong="9")
    with pytest.raises(ValueError, match="task 'task': corrupted_source 0 is empty"):
        load_seq2seq_task(model, [dict(row, corrupted_source="")])
    task = load_seq2seq_task(model, [row])
    with pytest.raises(ValueError, match="clean source 0 is empty"):
        edge_attribution_patching(model, ("", task.target), task.corrupted, task.metric)

    def metric(logits, prompt):
        return task.metric(logits, prompt) * float("nan")

    with pytest.raises(
        ValueError, match=r"task 'task'\.evaluate: the metric gave a non-finite value \(nan at prompt 0"
    ):
        task.evaluate(model, metric)

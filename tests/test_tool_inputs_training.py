"""The trainers' inputs: the corpus files ``train-transcoders`` and ``train-sae`` read, and the general trainer's
conventions (label smoothing, Adam's eps, the ignored label, gradient accumulation, the task protocol).

References: a corpus' first context against the tokenizer's own encoding of the first file's text; the smoothed
loss against the target distribution written out by hand; accumulated gradients against autograd on one batch
with the stated mean.
"""

import json
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import analysis.attribution_graphs.training as transcoder_training
from analysis.cli import EXIT_USAGE, main
from analysis.cli.common import EXIT_OK
from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.harvest.corpus import Corpus, as_corpus
from interp_transformer.pretrained.translation import encode_numbers
from interp_transformer.text.tokens import offline_gpt2_tokenizer
from interp_transformer.training import (
    IGNORE_INDEX,
    Batch,
    InductionTask,
    TrainSettings,
    token_loss,
    train,
)

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


# ---- the general trainer's conventions -------------------------------------------------------------

CFG = TransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=11, n_ctx=16, name="tiny")


def settings(**changes) -> TrainSettings:
    values = dict(steps=1, batch=8, lr=1e-3, warmup_steps=1, log_every=1, threads=1)
    return TrainSettings(**{**values, **changes})


def _logits_labels(vocab: int = 7):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, vocab, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, vocab, (3, 5), generator=generator)
    labels[0, 4] = labels[2, 0] = IGNORE_INDEX
    return logits, labels


def test_label_smoothing_spreads_epsilon_as_stated():
    logits, labels = _logits_labels()
    V, eps, kept = logits.shape[-1], 0.2, labels != IGNORE_INDEX
    log_probs = logits.log_softmax(-1)
    expected = {}
    for over, off_label, on_label in (("vocab", eps / V, 1 - eps + eps / V), ("others", eps / (V - 1), 1 - eps)):
        total = 0.0
        for b, p in kept.nonzero().tolist():  # the target distribution, written out class by class
            target = [on_label if c == labels[b, p] else off_label for c in range(V)]
            assert sum(target) == pytest.approx(1.0)
            total -= sum(t * float(log_probs[b, p, c]) for c, t in enumerate(target))
        expected[over] = total
        assert token_loss(logits, labels, eps, over).item() == pytest.approx(total, rel=1e-12), over
    reference = torch.nn.functional.cross_entropy(
        logits[kept], labels[kept], label_smoothing=eps, reduction="sum"
    )  # torch's convention is the default
    assert token_loss(logits, labels, eps).item() == pytest.approx(reference.item(), rel=1e-12)
    assert expected["vocab"] != pytest.approx(expected["others"])
    with pytest.raises(ValueError, match=r"label_smoothing_over must be one of \('vocab', 'others'\), got 'all'"):
        token_loss(logits, labels, eps, "all")
    with pytest.raises(ValueError, match=r"label_smoothing_over must be one of"):
        settings(label_smoothing=0.1, label_smoothing_over="other")
    with pytest.raises(ValueError, match=r"'others' spreads label_smoothing=0.9 over d_vocab - 1 = 2 tokens"):
        token_loss(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), 0.9, "others")


def _optimizer_groups(run):
    seen = []
    handle = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: seen.append(optimizer.param_groups))
    try:
        run()
    finally:
        handle.remove()
    return seen


def test_adams_eps_is_a_setting_that_reaches_the_optimizer():
    task = InductionTask(seq_len=5, min_seq_len=3, n_eval=2)
    for given, expected in (({}, 1e-8), ({"adam_eps": 1e-9}, 1e-9)):
        seen = _optimizer_groups(
            lambda given=given: train(DemoTransformer(CFG, seed=0), task, settings(**given), progress=False)
        )
        assert len(seen) == 1 and all(group["eps"] == expected for group in seen[0])
    assert settings(adam_eps=1e-9).to_dict()["adam_eps"] == 1e-9
    for bad in (0, -1e-8, float("nan"), float("inf"), True, "1e-9", None):
        with pytest.raises(ValueError, match=rf"adam_eps must be a finite number > 0, got {bad!r}"):
            settings(adam_eps=bad)


def test_the_ignored_label_is_pytorchs_and_does_not_count():
    assert IGNORE_INDEX == -100 == torch.nn.CrossEntropyLoss().ignore_index
    logits, labels = _logits_labels()
    moved = logits.clone()
    moved[labels == IGNORE_INDEX] += 100 * torch.randn_like(moved[labels == IGNORE_INDEX])
    assert token_loss(moved, labels).item() == token_loss(logits, labels).item()
    assert token_loss(moved, labels, 0.1).item() == token_loss(logits, labels, 0.1).item()
    assert Batch((labels,), labels).n_targets == 13
    leaf = logits.clone().requires_grad_(True)
    token_loss(leaf, labels, 0.1).backward()
    assert (leaf.grad[labels == IGNORE_INDEX] == 0).all() and (leaf.grad[labels != IGNORE_INDEX] != 0).any()
    old = labels.clone()
    old[0, 0] = -1
    with pytest.raises(
        ValueError,
        match=r"labels must be in \[0, 7\) or IGNORE_INDEX = -100 \(a position that predicts nothing\), got -1",
    ):
        token_loss(logits, old)
    with pytest.raises(ValueError, match=r"got 7"):
        token_loss(logits, labels.masked_fill(labels == IGNORE_INDEX, 7))
    induction = InductionTask(seq_len=5, min_seq_len=3, n_eval=2).batch(DemoTransformer(CFG), 4, torch.Generator())
    assert (induction.labels[:, [0, -1]] == IGNORE_INDEX).all()
    numbers = encode_numbers([5, 123456]).labels
    assert (numbers[0, 2:] == IGNORE_INDEX).all() and not (numbers == -1).any()


class FixedBatchTask:
    """A custom task that is no dataclass: one fixed batch whose micro-batches label very different numbers of
    positions (so that the two means differ)."""

    name = "fixed"

    def __init__(self):
        generator = torch.Generator().manual_seed(3)
        self.tokens = torch.randint(0, CFG.d_vocab, (8, 10), generator=generator)
        self.labels = torch.cat([self.tokens[:, 1:], torch.full((8, 1), IGNORE_INDEX)], dim=1)
        self.labels[:2, 2:] = IGNORE_INDEX  # micro-batch 0 of 4 labels 4 positions, the others 18 each

    def check_model(self, model):
        pass

    def batch(self, model, size, generator):
        return Batch((self.tokens[:size],), self.labels[:size])

    def evaluate(self, model, seed):
        return {}

    def settings(self):
        return {"rows": 8}


def _step_gradients(model, task, run_settings):
    """Every parameter's gradient when AdamW takes the first step, and the loss the curve logged."""
    names = {id(p): name for name, p in model.named_parameters()}
    grads = {}

    def record(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            grads.update({names[id(p)]: p.grad.clone() for p in group["params"] if p.grad is not None})

    handle = register_optimizer_step_pre_hook(record)
    try:
        run = train(model, task, run_settings, progress=False)
    finally:
        handle.remove()
    return grads, run.curve["loss"][0]


def _reference(task, mean: str, k: int):
    """Autograd on the whole batch at once, of the loss the rule states."""
    model = DemoTransformer(CFG, seed=0, dtype=torch.float64)
    model.train()
    logits = model(task.tokens)
    if mean == "tokens":
        loss = token_loss(logits, task.labels) / (task.labels != IGNORE_INDEX).sum()
    else:
        rows = task.labels.shape[0] // k
        parts = [slice(i * rows, (i + 1) * rows) for i in range(k)]
        loss = sum(token_loss(logits[s], task.labels[s]) / (task.labels[s] != IGNORE_INDEX).sum() for s in parts) / k
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}, loss.item()


@pytest.mark.parametrize("mean", ["tokens", "micro_batches"])
def test_accumulated_gradients_equal_one_batch_under_the_stated_mean(mean):
    task = FixedBatchTask()
    run_settings = settings(micro_batches=4, accumulation_mean=mean, weight_decay=0.0)
    grads, loss = _step_gradients(DemoTransformer(CFG, seed=0, dtype=torch.float64), task, run_settings)
    expected, expected_loss = _reference(task, mean, 4)
    assert loss == pytest.approx(expected_loss, abs=5e-5)  # the curve rounds to 4 decimals
    for name, value in expected.items():
        torch.testing.assert_close(grads[name], value, rtol=1e-10, atol=1e-12, msg=name)
    other, _ = _reference(task, "micro_batches" if mean == "tokens" else "tokens", 4)
    assert max((other[name] - value).abs().max() for name, value in expected.items()) > 1e-3  # the rules differ
    if mean == "tokens":  # per token, the cut does not matter: one micro-batch gives the same
        whole, _ = _step_gradients(DemoTransformer(CFG, seed=0, dtype=torch.float64), task, settings())
        for name, value in whole.items():
            torch.testing.assert_close(grads[name], value, rtol=1e-10, atol=1e-12, msg=name)


def test_a_micro_batch_without_labels_cannot_be_averaged():
    task = FixedBatchTask()
    task.labels[:2] = IGNORE_INDEX
    with pytest.raises(ValueError, match=r"step 1: micro-batch 0 .* labels no position.*accumulation_mean='tokens'"):
        train(DemoTransformer(CFG, seed=0), task, settings(micro_batches=4, accumulation_mean="micro_batches"))
    with pytest.raises(ValueError, match=r"accumulation_mean must be one of \('tokens', 'micro_batches'\)"):
        settings(accumulation_mean="micro_batch")


def test_a_custom_task_needs_no_dataclass_but_its_protocol(tmp_path):
    run = train(DemoTransformer(CFG, seed=0), FixedBatchTask(), settings(), checkpoint_dir=tmp_path, progress=False)
    assert run.step == 1
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["task"] == {"task": "fixed", "rows": 8}

    class NoSettings(FixedBatchTask):
        settings = None

    with pytest.raises(TypeError, match=r"NoSettings is not a dataclass and has no settings\(\) method"):
        train(DemoTransformer(CFG, seed=0), NoSettings(), settings(), progress=False)

    class Partial:
        name = "partial"

        def batch(self, model, size, generator):
            return None

    with pytest.raises(TypeError, match=r"task Partial lacks check_model, evaluate: a task needs name"):
        train(DemoTransformer(CFG, seed=0), Partial(), settings(), progress=False)


def test_a_checkpoint_from_before_the_new_settings_resumes(tmp_path):
    task = InductionTask(seq_len=5, min_seq_len=3, n_eval=2)
    run_settings = settings(steps=2)
    train(DemoTransformer(CFG, seed=0), task, run_settings, checkpoint_dir=tmp_path, until=1, progress=False)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    for key in ("adam_eps", "label_smoothing_over", "accumulation_mean"):
        del state["settings"][key]
    torch.save(state, tmp_path / "checkpoint.pt")
    assert train(DemoTransformer(CFG, seed=0), task, run_settings, checkpoint_dir=tmp_path, progress=False).step == 2
    with pytest.raises(ValueError, match=r"adam_eps: checkpoint 1e-08, now 1e-09"):
        train(DemoTransformer(CFG, seed=0), task, settings(steps=2, adam_eps=1e-9), checkpoint_dir=tmp_path)

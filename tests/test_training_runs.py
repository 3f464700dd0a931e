"""The trainer end to end: config files, the ``train`` command, torchrun's two processes against one, and the shipped
``induction-2l`` retrained through it, judged by the project's own head detector."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis.cli import main as cli_main
from interp_transformer import DemoTransformer
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer
from interp_transformer.pretrained import PRETRAINED_DIR, load_shipped, load_shipped_metadata
from interp_transformer.training import example_config, plan_from_config
from interp_transformer.training.cli import load_trained, run_config

REPO = Path(__file__).resolve().parents[1]
TINY_GPT2 = {"d_model": 16, "n_layers": 2, "n_heads": 2, "d_head": 8, "d_mlp": 32, "d_vocab": 13, "n_ctx": 24}
TINY_RUN = {
    "model": {"architecture": "gpt2", "config": {**TINY_GPT2, "name": "tiny"}},
    "data": {"task": "induction", "seq_len": 8, "min_seq_len": 3, "n_eval": 4},
    "training": {"steps": 3, "batch": 8, "micro_batches": 2, "lr": 3e-3, "warmup_steps": 2, "log_every": 1},
}


def write_config(folder: Path, values: dict, name: str = "run.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(values))
    return path


def state(model) -> dict:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


# ---- config files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["induction-2l", "translate-tiny"])
def test_the_example_configs_retrain_the_shipped_models_with_their_recorded_settings(name):
    plan = plan_from_config(example_config(name))
    recorded = load_shipped_metadata(name)["training"]
    assert plan.shipped == name and plan.config == load_shipped(name).cfg
    settings, task = plan.settings.to_dict(), dataclasses.asdict(plan.task)
    assert {key: task[key] if key in task else settings[key] for key in recorded} == recorded
    assert type(plan.build_model()) is type(load_shipped(name))


def test_an_architecture_config_builds_the_model_its_parts_make(tmp_path):
    seq2seq = {"d_model": 16, "n_layers": 1, "n_decoder_layers": 1, "n_heads": 2, "d_head": 8, "d_mlp": 32}
    values = {
        "model": {"architecture": "seq2seq-pre-ln", "config": {**seq2seq, "d_vocab": 43, "n_ctx": 16}},
        "data": {"task": "translation", "n_eval": 8},
        "training": {"steps": 2, "batch": 4, "lr": 1e-3},
    }
    model = plan_from_config(write_config(tmp_path, values)).build_model()
    assert isinstance(model, EncoderDecoderTransformer) and model.tokenizer is not None
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[model]\narchitecture = "gpt2"\nconfig = { d_model = 16, n_heads = 2, d_head = 8 }\n'
        '[data]\ntask = "induction"\n[training]\nsteps = 2\nbatch = 4\nlr = 1e-3\n'
    )
    plan = plan_from_config(toml)
    assert isinstance(plan.build_model(), DemoTransformer) and plan.out_dir == Path("custom-trained")


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"trainnig": {}}, KeyError, "unknown key 'trainnig' (did you mean 'training'?)"),
        ({"model": {"shipped": "induction-2l", "architecture": "gpt2"}}, KeyError, "exactly one of 'shipped'"),
        ({"model": {"shipped": "gpt2-small"}}, ValueError, "shipped must be one of ['induction-2l', 'translate-tiny']"),
        ({"model": {"architecture": "gpt3"}}, ValueError, "architecture must be one of ["),
        ({"model": {"architecture": "gpt2", "config": {"d_modle": 8}}}, KeyError, "did you mean 'd_model'?"),
        ({"data": {"seq_len": 4}}, KeyError, "missing 'task'"),
        ({"data": {"task": "induction", "seq": 4}}, KeyError, "unknown key 'seq'"),
        ({"training": {"steps": 2, "batch": 4, "lr": 1e-3, "shedule": "cosine"}}, KeyError, "did you mean 'schedule'"),
        ({"training": {"steps": 2, "batch": 4, "lr": 1e-3, "warmup_steps": 0}}, ValueError, "warmup_steps must be"),
        ({"training": {"steps": 2, "batch": 4, "micro_batches": 0, "lr": 1}}, ValueError, "micro_batches must be"),
        ({"training": {"steps": 2, "batch": 4, "schedule": "step", "lr": 1}}, ValueError, "got 'step'"),
        ({"output": {"folder": "x"}}, KeyError, "unknown key 'folder'"),
    ],
)
def test_bad_config_files_are_refused_by_name(tmp_path, change, error, message):
    with pytest.raises(error) as raised:
        plan_from_config(write_config(tmp_path, {**TINY_RUN, **change}))
    assert message in str(raised.value.args[0])


def test_bad_files_are_refused(tmp_path):
    (tmp_path / "run.yaml").write_text("model: {}")
    with pytest.raises(ValueError, match="ends in .toml or .json, got 'run.yaml'"):
        plan_from_config(tmp_path / "run.yaml")
    (tmp_path / "run.toml").write_text("[model\n")
    with pytest.raises(ValueError, match="is not valid TOML"):
        plan_from_config(tmp_path / "run.toml")
    with pytest.raises(KeyError, match=r"missing table \[training\]"):
        plan_from_config(write_config(tmp_path, {key: TINY_RUN[key] for key in ("model", "data")}))


# ---- the command ----------------------------------------------------------------------------------


def test_train_command_writes_a_model_that_loads_and_resumes(tmp_path, capsys):
    config = write_config(tmp_path, TINY_RUN)
    out = tmp_path / "out"
    assert cli_main(["train", str(config), "--out-dir", str(out), "--no-progress"]) == 0
    assert "trained tiny for 3 steps" in capsys.readouterr().out
    card = json.loads((out / "model.json").read_text())
    assert card["architecture"] == "gpt2" and card["curve"]["steps"] == [1, 2, 3] and card["processes"] == 1
    assert card["data"] == {"task": "induction", "seq_len": 8, "min_seq_len": 3, "n_eval": 4}
    loaded = load_trained(out)
    reference = run_config(config, tmp_path / "again", progress=False).run.model
    for name, value in state(reference).items():
        assert torch.equal(state(loaded)[name], value), name
    assert not torch.equal(
        state(loaded)["blocks.0.attn.W_Q"], state(DemoTransformer(loaded.cfg, seed=0))["blocks.0.attn.W_Q"]
    )
    before = (out / "model.safetensors").read_bytes()
    assert cli_main(["train", str(config), "--out-dir", str(out), "--no-progress"]) == 0  # resumes at its end
    assert (out / "model.safetensors").read_bytes() == before


def test_train_command_reports_bad_input_in_one_line(tmp_path, capsys):
    config = write_config(tmp_path, {**TINY_RUN, "training": {**TINY_RUN["training"], "warmup": 3}})
    assert cli_main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("interp-transformer train: error:") and "did you mean 'warmup_steps'" in err
    assert len(err.splitlines()) == 1
    shipped = write_config(tmp_path, {**TINY_RUN, "model": {"shipped": "induction-2l"}}, "shipped.json")
    assert cli_main(["train", str(shipped), "--out-dir", str(PRETRAINED_DIR)]) == 2
    assert "inside the installed package" in capsys.readouterr().err


def test_a_shipped_model_retrains_into_its_own_format(tmp_path):
    values = {**TINY_RUN, "model": {"shipped": "translate-tiny"}, "data": {"task": "translation", "n_eval": 8}}
    values["training"] = {"steps": 2, "batch": 8, "lr": 2e-3, "warmup_steps": 1}
    trained = run_config(write_config(tmp_path, values), tmp_path / "out", progress=False)
    assert [path.name for path in trained.files] == ["translate-tiny.safetensors", "translate-tiny.json"]
    loaded = load_shipped("translate-tiny", directory=tmp_path / "out")
    for name, value in state(trained.run.model).items():
        assert torch.equal(state(loaded)[name], value), name
    card = json.loads((tmp_path / "out" / "translate-tiny.json").read_text())
    assert set(card["metrics"]) == {"held_out_accuracy"} and card["training"]["steps"] == 2


# ---- torchrun -------------------------------------------------------------------------------------


def test_torchrun_two_processes_train_the_same_weights_as_one(tmp_path):
    config = write_config(tmp_path, {**TINY_RUN, "training": {**TINY_RUN["training"], "max_grad_norm": 1.0}})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port of its own: another torchrun may run beside it (test workers)
        "--nproc_per_node",
        "2",
        "-m",
        "interp_transformer.training",
    ]
    result = subprocess.run(
        [*command, str(config), "--out-dir", str(tmp_path / "two"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    two = load_trained(tmp_path / "two")
    one = run_config(config, tmp_path / "one", progress=False).run
    assert json.loads((tmp_path / "two" / "model.json").read_text())["processes"] == 2
    assert json.loads((tmp_path / "two" / "model.json").read_text())["curve"]["loss"] == pytest.approx(
        one.curve["loss"], abs=2e-4
    )
    for name, value in state(one.model).items():
        torch.testing.assert_close(state(two)[name], value, rtol=0, atol=1e-5, msg=name)


# ---- the shipped induction-2l, retrained through the trainer ---------------------------------------


@pytest.mark.slow  # 1000 optimizer steps: about 30 s on an idle core, minutes on a busy one
def test_induction_2l_retrained_through_the_trainer_forms_induction_heads(tmp_path):
    """The example config's model, task and optimizer, a third of its steps: the induction heads form after about
    800 steps; the cosine ends at half the rate so that they sharpen in the steps left."""
    from analysis.readouts.attention import induction_scores, previous_token_scores, repeated_random_tokens
    from interp_transformer.pretrained.induction import BOS_TOKEN, half_losses
    from interp_transformer.training.config_file import read_config_file

    values = read_config_file(example_config("induction-2l"))
    values["training"].update(steps=1000, min_lr_ratio=0.5, log_every=1000, checkpoint_every=None)
    run = run_config(write_config(tmp_path, values), tmp_path / "out", progress=False).run
    model = load_shipped("induction-2l", directory=tmp_path / "out")
    tokens = repeated_random_tokens(model, 15, batch=16, seed=123, bos=BOS_TOKEN)
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    induction, previous = induction_scores(cache, tokens), previous_token_scores(cache)
    layer = int(induction.max(dim=1).values.argmax())
    assert induction.max() > 0.5, f"best induction score {induction.max():.2f}: {induction}"
    assert layer == 1 and previous[0].max() > 0.3, f"no previous-token head before the induction head: {previous}"
    with torch.no_grad():
        first, repeated = half_losses(model, tokens, 15)
    # the report's criterion for learning in context: the repeated half's loss below half the first half's
    assert repeated < 0.5 * first, f"repeated-half loss {repeated:.3f} vs first-half {first:.3f}"
    assert run.metrics["repeated_half_loss"] < 0.5 * run.metrics["first_half_loss"]

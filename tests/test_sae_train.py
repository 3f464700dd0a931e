"""The SAE trainer: its metrics against their definitions recomputed here, determinism, SAELens' format, every data
source."""

import json

import pytest
import torch
import torch.nn.functional as F

from interp_transformer.harvest import harvest
from interp_transformer.pretrained import load_shipped
from interp_transformer.pretrained.induction import repeated_tokens
from interp_transformer.sae import SAE
from interp_transformer.sae.data import token_batches
from interp_transformer.sae.train import SAETrainingConfig, train_sae
from interp_transformer.sae.training_data import from_harvest, from_model

from .sae_helpers import gpt2_with_tokenizer, prose_files

HOOK = "blocks.1.hook_resid_pre"
BOS = 50256  # GPT-2's <|endoftext|>: the BOS and the document separator
CONFIG = SAETrainingConfig(hook_name=HOOK, k=8, expansion_factor=2, steps=60, batch_size=64, context_length=32, lr=3e-3)


@pytest.fixture(scope="module")
def model():
    return gpt2_with_tokenizer()


@pytest.fixture(scope="module")
def trained(model):
    return train_sae(model, prose_files(), CONFIG, progress=False)


@pytest.fixture(scope="module")
def eval_set(model):
    """Recomputed here: the held-out contexts (every 8th, from the 8th), their tokens and non-BOS activations."""
    contexts = torch.cat(list(token_batches(model, prose_files(), context_length=32)))
    held_out = contexts[7::8]
    _, cache = model.run_with_cache(held_out, names_filter=[HOOK])
    keep = held_out != BOS
    return held_out, keep, cache[HOOK][keep]


def test_metrics_match_their_definitions(model, trained, eval_set):
    held_out, keep, x = eval_set
    sae, metrics = trained.sae, trained.metrics
    acts = sae.encode(x)
    x_hat = sae(x)
    assert metrics.n_tokens == len(x)
    assert metrics.l0 == pytest.approx(float((acts > 0).sum(-1).float().mean()), abs=1e-6)
    fve = 1 - ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert metrics.fraction_of_variance_explained == pytest.approx(float(fve), abs=1e-5)
    assert metrics.mse == pytest.approx(float(((x - x_hat) ** 2).sum(-1).mean()), rel=1e-5)
    assert metrics.dead_features == int(((acts > 0).sum(0) == 0).sum())
    assert 0 < metrics.l0 <= CONFIG.k

    def loss(logits):
        return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), held_out[:, 1:].flatten()))

    def replace(by):
        return lambda resid, hook: torch.where(keep[..., None], by(resid), resid)

    with torch.no_grad():
        clean = loss(model(held_out))
        zero = loss(model.run_with_hooks(held_out, fwd_hooks=[(HOOK, replace(torch.zeros_like))]))
        spliced = loss(model.run_with_hooks(held_out, fwd_hooks=[(HOOK, replace(sae))]))
    ce = metrics.ce_loss
    assert (ce.clean, ce.zero_ablated, ce.spliced) == pytest.approx((clean, zero, spliced), abs=1e-5)
    assert ce.recovered == pytest.approx((zero - spliced) / (zero - clean), rel=1e-4)


def test_training_metrics_and_the_loss_curve(trained):
    assert trained.train_metrics.n_tokens > 5 * trained.metrics.n_tokens  # 7 of every 8 contexts train
    assert len(trained.losses) == CONFIG.steps
    assert sum(trained.losses[-10:]) < 0.75 * sum(trained.losses[:10])
    assert trained.train_metrics.fraction_of_variance_explained > 0.5


def test_training_is_deterministic_for_a_seed(model, trained):
    again = train_sae(model, prose_files(), CONFIG, progress=False)
    assert all(torch.equal(again.sae.state_dict()[name], tensor) for name, tensor in trained.sae.state_dict().items())
    assert again.losses == trained.losses
    other = train_sae(model, prose_files(), SAETrainingConfig(**{**CONFIG.__dict__, "seed": 1}), progress=False)
    assert not torch.equal(other.sae.W_dec, trained.sae.W_dec)


def test_the_saved_sae_round_trips_in_saelens_format(trained, eval_set, tmp_path):
    folder = trained.save(tmp_path / "sae")
    assert sorted(p.name for p in folder.iterdir()) == [
        "cfg.json",
        "sae_weights.safetensors",
        "sparsity.safetensors",
        "training.json",
    ]
    loaded = SAE.load(folder)
    x = eval_set[2]
    assert torch.equal(loaded.encode(x), trained.sae.encode(x))
    acts = trained.sae.encode(x)
    assert torch.equal(loaded.decode(acts), trained.sae.decode(acts))
    assert loaded.cfg == trained.sae.cfg and loaded.cfg.k == CONFIG.k and loaded.hook_name == HOOK
    assert loaded.cfg.normalize_activations == "none"  # the input scaling is folded into the weights
    metadata = loaded.cfg.metadata
    assert (metadata["context_size"], metadata["exclude_special_tokens"], metadata["model_from_pretrained_kwargs"]) == (
        32,
        [BOS],
        {},
    )
    assert torch.equal(loaded.sparsity, trained.sae.sparsity)
    record = json.loads((folder / "training.json").read_text())
    assert record["metrics"]["l0"] == trained.metrics.l0 and record["config"]["k"] == CONFIG.k


def test_a_harvest_folder_gives_the_same_activations(model, tmp_path):
    harvest(model, prose_files(), tmp_path / "acts", hooks=HOOK, context_length=32, batch_size=4, progress=False)
    stored = from_harvest(tmp_path / "acts", HOOK)
    computed = from_model(model, token_batches(model, prose_files(), context_length=32), HOOK)
    assert torch.allclose(stored.train, computed.train, atol=1e-6) and torch.allclose(
        stored.eval, computed.eval, atol=1e-6
    )
    assert torch.equal(stored.eval_tokens, computed.eval_tokens) and stored.excluded_ids == computed.excluded_ids == (
        BOS,
    )
    without_model = train_sae(
        None, tmp_path / "acts", SAETrainingConfig(**{**CONFIG.__dict__, "steps": 5}), progress=False
    )
    assert without_model.metrics.ce_loss is None and without_model.sae.d_in == model.cfg.d_model


def test_max_tokens_and_the_split(model):
    data = from_model(model, token_batches(model, prose_files(), context_length=32), HOOK, max_tokens=100, eval_every=2)
    assert len(data.train) == 100 and 0 < len(data.eval) <= 3 * 31


def test_a_model_without_tokenizer_trains_on_token_batches():
    model = load_shipped("induction-2l")
    tokens = repeated_tokens(48, 15, model.cfg.d_vocab, torch.Generator().manual_seed(0))
    config = SAETrainingConfig(
        hook_name="blocks.1.hook_resid_pre", k=16, expansion_factor=2, steps=80, batch_size=128, lr=3e-3
    )
    result = train_sae(model, tokens, config, progress=False)
    assert result.sae.cfg.metadata.get("exclude_special_tokens") is None  # no tokenizer: no special ids
    assert result.metrics.n_tokens == 6 * tokens.shape[1]  # contexts 7, 15, ..., 47 held out, every position kept
    assert result.metrics.ce_loss.recovered > 0.5


def test_a_standard_sae_trades_reconstruction_for_sparsity(model):
    def l0(l1_coefficient):
        config = SAETrainingConfig(**{**CONFIG.__dict__, "architecture": "standard", "l1_coefficient": l1_coefficient})
        return train_sae(model, prose_files(), config, progress=False).train_metrics.l0

    assert l0(20.0) < 0.5 * l0(0.2)


def test_bad_settings_are_refused(model):
    with pytest.raises(ValueError, match="architecture must be one of"):
        SAETrainingConfig(hook_name=HOOK, architecture="gated")
    with pytest.raises(ValueError, match="steps must be a positive int"):
        SAETrainingConfig(hook_name=HOOK, steps=0)
    with pytest.raises(ValueError, match="k=40 must be at most d_sae=32"):
        train_sae(model, prose_files(), SAETrainingConfig(**{**CONFIG.__dict__, "k": 40, "d_sae": 32}), progress=False)
    with pytest.raises(KeyError, match="closest"):
        train_sae(
            model,
            prose_files(),
            SAETrainingConfig(**{**CONFIG.__dict__, "hook_name": "blocks.1.hook_resid_prex"}),
            progress=False,
        )
    with pytest.raises(ValueError, match="one vector per position"):
        train_sae(
            model,
            prose_files(),
            SAETrainingConfig(**{**CONFIG.__dict__, "hook_name": "blocks.0.attn.hook_z"}),
            progress=False,
        )
    with pytest.raises(ValueError, match="needs the model"):
        train_sae(None, prose_files(), CONFIG, progress=False)


# --------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from .gpt2_helpers import tiny_gpt2

    folder = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2(0, n_embd=32, vocab_size=50257, n_positions=64).save_pretrained(folder)
    return folder


def test_the_command_line_trains_and_saves(model_dir, tmp_path, capsys):
    from analysis.cli import main

    files = [str(f) for f in prose_files()]
    code = main(
        [
            "train-sae",
            "--model",
            str(model_dir),
            "--corpus",
            *files,
            "--hook",
            HOOK,
            "--out",
            str(tmp_path / "sae"),
            "--k",
            "8",
            "--expansion-factor",
            "2",
            "--steps",
            "20",
            "--context-length",
            "32",
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "held out: L0 " in out and "CE loss clean" in out
    loaded = SAE.load(tmp_path / "sae")
    assert (loaded.hook_name, loaded.d_sae, loaded.cfg.k) == (HOOK, 64, 8)
    assert json.loads((tmp_path / "sae" / "training.json").read_text())["config"]["steps"] == 20


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--hook", "blocks.1.hook_resid_prex"], "closest: ['blocks.1.hook_resid_pre'"),
        (["--hook", HOOK, "--eval-every", "1"], "eval_every must be an int >= 2"),
        (["--hook", HOOK, "--corpus", "missing.txt"], "corpus file not found"),
    ],
)
def test_the_command_line_reports_bad_input_in_one_line(model_dir, tmp_path, capsys, arguments, message):
    from analysis.cli import main

    corpus = [] if "--corpus" in arguments else ["--corpus", str(prose_files()[0])]
    code = main(
        ["train-sae", "--model", str(model_dir), *corpus, *arguments, "--out", str(tmp_path / "sae"), "--no-progress"]
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("interp-transformer")]
    assert code == 2 and len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "sae").exists()


def test_the_command_line_needs_one_source(capsys, tmp_path):
    from analysis.cli import main

    assert main(["train-sae", "--hook", HOOK, "--out", str(tmp_path)]) == 2
    assert "--corpus FILE ... (with --model) or --harvest DIR" in capsys.readouterr().err

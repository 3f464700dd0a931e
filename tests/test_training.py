"""The general trainer's parts: schedules against torch's own, decay groups by role, the loss against its formula,
gradient accumulation and resuming against uninterrupted single-batch training, and bad input refused by name."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.seq2seq.recipe import Seq2SeqConfig
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer
from interp_transformer.pretrained.translation import VOCAB
from interp_transformer.training import (
    InductionTask,
    TrainSettings,
    TranslationTask,
    cosine,
    inverse_sqrt,
    learning_rate,
    parameter_groups,
    parameter_roles,
    token_loss,
    train,
)
from interp_transformer.training.tasks import IGNORE, make_task

CFG = TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=32, d_vocab=13, n_ctx=24, name="tiny")
TASK = InductionTask(seq_len=8, min_seq_len=3, n_eval=4)


def tiny(dtype=torch.float32, seed=0) -> DemoTransformer:
    return DemoTransformer(CFG, dtype=dtype, seed=seed)


def tiny_seq2seq(dtype=torch.float32) -> EncoderDecoderTransformer:
    cfg = Seq2SeqConfig(
        d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=len(VOCAB), n_ctx=16
    )
    return EncoderDecoderTransformer(cfg, dtype=dtype, seed=0)


def settings(**changes) -> TrainSettings:
    values = dict(steps=4, batch=8, lr=3e-3, warmup_steps=2, log_every=2, max_grad_norm=None)
    return TrainSettings(**{**values, **changes})


def weights(model) -> dict:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


# ---- schedules ------------------------------------------------------------------------------------


def test_inverse_sqrt_is_the_papers_formula():
    d_model, warmup, scale = 512, 4000, 2.0
    rates = [inverse_sqrt(step, d_model, warmup, scale) for step in range(1, 20001)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == warmup  # the peak is at the last warmup step
    assert rates[warmup - 1] == pytest.approx(scale / math.sqrt(d_model * warmup), rel=1e-12)
    assert rates[99] == pytest.approx(scale * 100 / math.sqrt(d_model) / warmup**1.5, rel=1e-12)  # linear warmup
    assert rates[15999] == pytest.approx(scale / math.sqrt(d_model * 16000), rel=1e-12)  # 1/sqrt(step) after it


def test_cosine_equals_torch_warmup_then_cosine_annealing():
    peak, floor, warmup, steps = 2e-3, 2e-4, 5, 40
    parameter = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=peak)
    after = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps - warmup, eta_min=floor)
    reference = []
    for _ in range(steps - warmup):
        reference.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        after.step()
    reference.append(optimizer.param_groups[0]["lr"])
    ours = [cosine(step, peak, warmup, steps, floor) for step in range(warmup, steps + 1)]
    assert ours == pytest.approx(reference, rel=1e-9)
    assert [cosine(step, peak, warmup, steps) for step in range(1, warmup + 1)] == pytest.approx(
        [peak * step / warmup for step in range(1, warmup + 1)]
    )


def test_learning_rate_follows_the_settings():
    rate = learning_rate(TrainSettings(steps=10, batch=2, schedule="inverse_sqrt", warmup_steps=4, lr_scale=3.0), 64)
    assert rate(7) == inverse_sqrt(7, 64, 4, 3.0)
    rate = learning_rate(settings(steps=10, min_lr_ratio=0.5), 64)
    assert rate(10) == pytest.approx(1.5e-3) and rate(2) == pytest.approx(3e-3)


# ---- bad settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(schedule="linear"), "schedule must be one of ('cosine', 'inverse_sqrt'), got 'linear'"),
        (dict(warmup_steps=0), "warmup_steps must be an int >= 1, got 0"),
        (dict(warmup_steps=-5), "warmup_steps must be an int >= 1, got -5"),
        (dict(micro_batches=0), "micro_batches must be an int >= 1, got 0"),
        (dict(micro_batches=3), "batch=8 must be a multiple of micro_batches=3"),
        (dict(lr=None), "schedule 'cosine' needs lr, a finite number > 0, got lr=None"),
        (dict(schedule="inverse_sqrt"), "give lr_scale instead of lr, got lr=0.003"),
        (dict(precision="fp8"), "precision must be one of ('float32', 'bfloat16', 'float16'), got 'fp8'"),
        (dict(label_smoothing=1.0), "label_smoothing must be in [0, 1), got 1.0"),
        (dict(betas=(0.9,)), "betas must be two numbers in [0, 1), got (0.9,)"),
        (dict(steps=True), "steps must be an int >= 1, got True"),
    ],
)
def test_bad_settings_are_refused_by_name(changes, message):
    with pytest.raises(ValueError) as error:
        settings(**changes)
    assert message in str(error.value)


def test_unknown_setting_names_the_closest_one():
    with pytest.raises(KeyError, match=r"unknown key 'warmup' \(did you mean 'warmup_steps'\?\)"):
        TrainSettings.from_dict({"steps": 1, "batch": 1, "lr": 1e-3, "warmup": 10})
    with pytest.raises(KeyError, match=r"missing \['batch'\]"):
        TrainSettings.from_dict({"steps": 1, "lr": 1e-3})


# ---- decay groups by role -------------------------------------------------------------------------


def test_roles_of_a_gpt2_model():
    roles = parameter_roles(tiny())
    by_role = {role: sorted(name for name in roles if roles[name] == role) for role in set(roles.values())}
    assert by_role["embedding"] == ["embed.W_E", "pos_embed.W_pos"]
    assert by_role["norm"] == sorted(
        f"blocks.{l}.{ln}.{p}" for l in range(2) for ln in ("ln1", "ln2") for p in "wb"
    ) + [
        "ln_final.b",
        "ln_final.w",
    ]
    assert all(name.rsplit(".", 1)[1].startswith("b_") for name in by_role["bias"])
    assert all(name.rsplit(".", 1)[1].startswith("W_") for name in by_role["matrix"])
    assert len(by_role["bias"]) == 2 * 6 + 1 and len(by_role["matrix"]) == 2 * 6 + 1  # per block 6, and W_U / b_U


def test_cross_attention_and_grouped_heads_biases_are_biases():
    roles = parameter_roles(tiny_seq2seq())
    assert {roles[f"decoder.blocks.0.cross_attn.b_{x}"] for x in "QKVO"} == {"bias"}
    assert {roles[f"decoder.blocks.0.cross_attn.W_{x}"] for x in "QKVO"} == {"matrix"}
    llama = DemoTransformer(
        LlamaConfig(d_model=16, n_layers=1, n_heads=4, d_head=4, d_mlp=32, d_vocab=11, n_ctx=8, n_key_value_heads=2)
    )
    roles = parameter_roles(llama)
    assert roles["blocks.0.ln1.w"] == "norm" and roles["embed.W_E"] == "embedding"
    assert roles["blocks.0.mlp.W_gate"] == "matrix" and roles["unembed.W_U"] == "matrix"


def _rename_every_module(model: nn.Module) -> None:
    """Move every child to a name that says nothing (m0, m1, ...), in place: the same parameter objects."""
    for module in list(model.modules()):
        for index, (name, child) in enumerate(list(module.named_children())):
            delattr(module, name)
            setattr(module, f"m{index}", child)


def test_renaming_modules_does_not_change_the_groups():
    model = tiny()
    before = {id(p): role for name, p in model.named_parameters() for role in [parameter_roles(model)[name]]}
    _rename_every_module(model)
    names = [name for name, _ in model.named_parameters()]
    assert not any(word in name for name in names for word in ("ln", "embed", "attn", "mlp", "blocks"))
    after_roles = parameter_roles(model)
    assert {id(p): after_roles[name] for name, p in model.named_parameters()} == before
    groups = parameter_groups(model, 0.1)
    assert {id(p) for p in groups[0]["params"]} == {i for i, role in before.items() if role == "matrix"}


def test_roles_come_from_the_part_not_its_name():
    class Misnamed(nn.Module):
        def __init__(self):
            super().__init__()
            self.W_proj = nn.LayerNorm(4)  # a norm called like a weight
            self.ln = nn.Linear(4, 4)  # a linear map called like a norm
            self.bias = nn.Embedding(5, 4)  # an embedding called like a bias

    roles = parameter_roles(Misnamed())
    assert roles == {
        "W_proj.weight": "norm",
        "W_proj.bias": "norm",
        "ln.weight": "matrix",
        "ln.bias": "bias",
        "bias.weight": "embedding",
    }


def test_only_matrices_are_decayed_by_adamw():
    model = tiny()
    before = weights(model)
    optimizer = torch.optim.AdamW(parameter_groups(model, weight_decay=0.5), lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: only decay moves a weight
    optimizer.step()
    roles = parameter_roles(model)
    for name, value in model.state_dict().items():
        expected = before[name] * (1 - 0.1 * 0.5) if roles[name] == "matrix" else before[name]
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-7, msg=name)


# ---- the loss -------------------------------------------------------------------------------------


def test_token_loss_is_cross_entropy_with_label_smoothing():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 7, (3, 5), generator=generator)
    labels[0, 4] = labels[2, 0] = IGNORE
    kept = labels != IGNORE
    log_probs = logits.log_softmax(-1)
    nll = -log_probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    assert token_loss(logits, labels).item() == pytest.approx(nll[kept].sum().item(), rel=1e-6)
    smoothed = (1 - 0.1) * nll - 0.1 * log_probs.mean(-1)  # the target puts 0.1 / d_vocab on every token
    assert token_loss(logits, labels, 0.1).item() == pytest.approx(smoothed[kept].sum().item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"logits \(3, 5, 7\) and labels \(3, 4\) must share"):
        token_loss(logits, labels[:, :4])


def test_induction_labels_are_next_tokens_without_the_first_random_one():
    batch = TASK.batch(tiny(), 4, torch.Generator().manual_seed(0))
    (tokens,) = batch.inputs
    assert torch.equal(batch.labels[:, 1:-1], tokens[:, 2:])
    assert (batch.labels[:, [0, -1]] == IGNORE).all()
    n = (tokens.shape[1] - 1) // 2
    assert torch.equal(tokens[:, 1 : n + 1], tokens[:, n + 1 :]) and 3 <= n <= 8


# ---- gradient accumulation, precision, clipping, resuming -----------------------------------------


@pytest.mark.parametrize("task, build", [(TASK, tiny), (TranslationTask(n_eval=2), tiny_seq2seq)])
def test_micro_batches_equal_one_big_batch(task, build):
    one = train(build(torch.float64), task, settings(batch=8, steps=3), progress=False)
    four = train(build(torch.float64), task, settings(batch=8, steps=3, micro_batches=4), progress=False)
    assert one.curve["loss"] == pytest.approx(four.curve["loss"], rel=1e-12)
    for name, value in weights(one.model).items():
        torch.testing.assert_close(weights(four.model)[name], value, rtol=0, atol=1e-12, msg=name)
    moved = max((weights(one.model)[name] - value).abs().max() for name, value in weights(build(torch.float64)).items())
    assert moved > 1e-3  # the steps did change the weights


def test_clipping_bounds_the_gradient_norm_adam_steps_with():
    norms = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    handle = register_optimizer_step_pre_hook(record)
    try:
        train(tiny(), TASK, settings(steps=2), progress=False)
        unclipped, norms[:] = list(norms), []
        train(tiny(), TASK, settings(steps=2, max_grad_norm=0.05), progress=False)
    finally:
        handle.remove()
    assert min(unclipped) > 0.05
    assert norms == pytest.approx([0.05, 0.05], rel=1e-4)


def test_bfloat16_autocast_trains_close_to_float32():
    full = train(tiny(), TASK, settings(steps=2, log_every=1), progress=False)
    model, dtypes = tiny(), []
    model.unembed.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    half = train(model, TASK, settings(steps=2, log_every=1, precision="bfloat16"), progress=False)
    assert dtypes[0] == torch.bfloat16  # the training forward pass; the evaluations run in float32
    assert half.curve["loss"] == pytest.approx(full.curve["loss"], rel=2e-2)
    differences = [(value - weights(full.model)[name]).abs().max() for name, value in weights(half.model).items()]
    assert 0 < max(differences) < 1e-2
    assert all(value.dtype == torch.float32 for value in weights(half.model).values())
    with pytest.raises(ValueError, match="precision 'float16' needs a GPU .* this run is on cpu"):
        train(tiny(), TASK, settings(precision="float16"), progress=False)


def test_resumed_training_equals_uninterrupted_training(tmp_path):
    run_settings = settings(steps=6, micro_batches=2, checkpoint_every=2, max_grad_norm=1.0)
    straight = train(tiny(), TASK, run_settings, progress=False)
    stopped = train(tiny(), TASK, run_settings, checkpoint_dir=tmp_path, until=3, progress=False)
    assert stopped.step == 3 and (tmp_path / "checkpoint.pt").is_file()
    resumed = train(tiny(seed=7), TASK, run_settings, checkpoint_dir=tmp_path, progress=False)  # other weights
    assert resumed.step == 6
    for name, value in weights(straight.model).items():
        assert torch.equal(weights(resumed.model)[name], value), name
    assert resumed.curve["loss"] == straight.curve["loss"] and resumed.curve["steps"] == [2, 4, 6]
    assert resumed.metrics == straight.metrics


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    train(tiny(), TASK, settings(steps=4), checkpoint_dir=tmp_path, until=2, progress=False)
    with pytest.raises(ValueError, match=r"another run.*lr: checkpoint 0.003, now 0.001"):
        train(tiny(), TASK, settings(steps=4, lr=1e-3), checkpoint_dir=tmp_path, progress=False)
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is not a readable training checkpoint"):
        train(tiny(), TASK, settings(steps=4), checkpoint_dir=tmp_path, progress=False)


# ---- tasks refuse models they cannot train --------------------------------------------------------


def test_tasks_refuse_models_that_do_not_fit():
    with pytest.raises(ValueError, match="task 'induction' trains a causal decoder.*cross-attention=True"):
        train(tiny_seq2seq(), TASK, settings(), progress=False)
    with pytest.raises(ValueError, match="task 'translation' trains an encoder-decoder"):
        train(tiny(), TranslationTask(), settings(), progress=False)
    with pytest.raises(ValueError, match=r"2\*seq_len\+1 = 41 exceeds n_ctx=24"):
        train(tiny(), InductionTask(seq_len=20), settings(), progress=False)
    with pytest.raises(ValueError, match="until must be an int in"):
        train(tiny(), TASK, settings(), until=9, progress=False)
    with pytest.raises(ValueError, match="min_seq_len must be in"):
        InductionTask(seq_len=4, min_seq_len=6)
    with pytest.raises(KeyError, match=r"unknown key 'seqlen' \(did you mean 'seq_len'\?\)"):
        make_task("induction", {"seqlen": 4})
    with pytest.raises(ValueError, match=r"task must be one of \['induction', 'translation'\], got 'copying'"):
        make_task("copying")


def test_translation_accuracy_counts_exact_matches():
    from interp_transformer.pretrained import load_translation_model
    from interp_transformer.pretrained.translation import evaluate, sample_numbers

    model = load_translation_model()
    with torch.no_grad():
        model.unembed.W_U.add_(0.3 * torch.randn(model.unembed.W_U.shape, generator=torch.Generator().manual_seed(0)))
    numbers = sample_numbers(64, torch.Generator().manual_seed(3), held_out=True)
    ours = TranslationTask(n_eval=64).evaluate(model, seed=3)["held_out_accuracy"]
    assert ours == pytest.approx(evaluate(model, numbers), abs=1e-4)
    assert 0 < ours < 1


def test_the_loss_is_next_token_cross_entropy_of_the_model():
    model = tiny(torch.float64)
    batch = TASK.batch(model, 4, torch.Generator().manual_seed(1))
    (tokens,) = batch.inputs
    logits = model(tokens)
    reference = F.cross_entropy(logits[:, 1:-1].flatten(0, 1), tokens[:, 2:].flatten(), reduction="sum")
    assert token_loss(logits, batch.labels).item() == pytest.approx(reference.item(), rel=1e-12)


def test_the_progress_bar_shows_the_loss_and_tokens_per_second(capsys):
    train(tiny(), TASK, settings(steps=2), progress=True)
    err = capsys.readouterr().err
    assert "training tiny" in err and "loss=" in err and "tokens_per_s=" in err
    train(tiny(), TASK, settings(steps=2), progress=False)
    assert capsys.readouterr().err == ""

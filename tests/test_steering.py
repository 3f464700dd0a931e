"""Steering: known answers on built models, hooks that leave nothing behind, bad input refused by name."""

import math
import threading

import pytest
import torch

from analysis.steering import (
    actadd_vector,
    caa_vector,
    difference_of_means,
    feature_vector,
    steered_generate,
    steering,
    steering_sweep,
    sweep_figure,
)
from analysis.steering.vectors import SteeringVector
from interp_transformer.builder import build_decoder

from .sae_helpers import random_sae

D_MODEL, D_VOCAB, TARGET = 64, 40, 7
LAST = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def planted():
    """A decoder without norms whose read-out maps a planted unit direction ``d`` to token ``TARGET``: its W_U
    column is ``5 d``, so steering by ``s d`` after the last block raises that logit by exactly ``5 s`` (its bias
    of -3 keeps the unsteered model from predicting it)."""
    model = build_decoder(
        d_model=D_MODEL, n_layers=2, n_heads=4, d_mlp=128, d_vocab=D_VOCAB, n_ctx=32, norm="none", seed=0
    )
    generator = torch.Generator().manual_seed(1)
    d = torch.randn(D_MODEL, generator=generator)
    d = d / d.norm()
    with torch.no_grad():
        model.W_U[:, TARGET] = 5 * d
        model.b_U[TARGET] = -3.0
    return model.requires_grad_(False), d


@pytest.fixture(scope="module")
def embedded():
    """A decoder (with norms) whose embedding writes ``+3 d`` for tokens 1..5 and ``-3 d`` for tokens 6..10."""
    model = build_decoder(d_model=D_MODEL, n_layers=2, n_heads=4, d_mlp=128, d_vocab=D_VOCAB, n_ctx=32, seed=2)
    d = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(3))
    d = d / d.norm()
    with torch.no_grad():
        model.W_E[1:6] += 3 * d
        model.W_E[6:11] -= 3 * d
    return model.requires_grad_(False), d


def _texts(first: int, count: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(11, D_VOCAB, (4,), generator=generator), torch.tensor([first + i % 5])])
            for i in range(count)]  # fmt: skip


# ---- known answers ------------------------------------------------------------------------------------------


def test_steering_along_the_planted_direction_raises_its_token_by_the_construction(planted):
    model, d = planted
    tokens = torch.tensor([[1, 2, 3, 4]])
    clean = model(tokens)[0, -1]
    strength = 2.0
    with steering(model, d, LAST, strength):
        steered = model(tokens)[0, -1]
    expected = strength * float(d @ model.W_U[:, TARGET])  # 5 * strength: no norm between the stream and W_U
    assert float(steered[TARGET] - clean[TARGET]) == pytest.approx(expected, abs=1e-4)
    changes = []
    for random in torch.randn(8, D_MODEL, generator=torch.Generator().manual_seed(123)):
        with steering(model, random * d.norm() / random.norm(), LAST, strength):  # the same norm as d
            changes.append(abs(float(model(tokens)[0, -1, TARGET] - clean[TARGET])))
    assert max(changes) < 0.5 * expected and sum(changes) / len(changes) < 0.25 * expected
    assert int(steered.argmax()) == TARGET != int(clean.argmax())


def test_steering_only_the_chosen_positions(planted):
    model, d = planted
    tokens = torch.tensor([[1, 2, 3, 4]])
    clean = model(tokens)
    with steering(model, d, LAST, 2.0, positions=[1]):
        steered = model(tokens)
    changed = (steered - clean).abs().amax(dim=-1)[0]
    assert changed[1] > 1 and float(changed[[0, 2, 3]].max()) == 0.0  # after the last block: no later mixing


def test_difference_of_means_recovers_the_planted_direction(embedded):
    model, d = embedded
    positive, negative = _texts(1, 8, seed=4), _texts(6, 8, seed=5)
    for hook in ("blocks.0.hook_resid_pre", LAST):
        found = difference_of_means(model, positive, negative, hook)
        assert found.hook == hook and found.vector.shape == (D_MODEL,)
        assert float(torch.nn.functional.cosine_similarity(found.vector, d, dim=0)) >= 0.95
    swapped = difference_of_means(model, negative, positive, LAST)  # the sign is the contrast's
    assert float(torch.nn.functional.cosine_similarity(swapped.vector, d, dim=0)) <= -0.95


def test_caa_reads_the_answer_tokens_and_actadd_the_whole_pair(embedded):
    model, d = embedded
    prompt = torch.tensor([20, 21, 22])
    pairs = [(prompt, torch.tensor([1 + i]), torch.tensor([6 + i])) for i in range(5)]
    caa = caa_vector(model, pairs, "blocks.0.hook_resid_pre")
    assert float(torch.nn.functional.cosine_similarity(caa.vector, d, dim=0)) >= 0.95
    act = actadd_vector(model, torch.tensor([20, 1, 2]), torch.tensor([20, 6, 7]), "blocks.0.hook_resid_pre")
    assert act.vector.shape == (3, D_MODEL) and float(act.vector[0].abs().max()) == 0.0  # same first token
    assert float(torch.nn.functional.cosine_similarity(act.vector[1], d, dim=0)) >= 0.95
    with pytest.raises(ValueError, match="lengths 3 and 2"):
        actadd_vector(model, torch.tensor([20, 1, 2]), torch.tensor([20, 6]), "blocks.0.hook_resid_pre")


def test_feature_vector_is_the_decoder_row(planted):
    model, _ = planted
    sae = random_sae(hook_name=LAST, d_in=D_MODEL, d_sae=8)
    found = feature_vector(sae, 3, model=model)
    assert found.hook == LAST and torch.equal(found.vector, sae.W_dec[3].detach())
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        feature_vector(sae, 8)


# ---- hooks leave nothing behind, and belong to their thread --------------------------------------------------


@pytest.mark.parametrize("interrupt", [RuntimeError("inside"), KeyboardInterrupt("inside")], ids=["error", "ctrl-c"])
def test_hooks_are_gone_after_the_block_also_on_an_exception(planted, interrupt):
    model, d = planted
    tokens = torch.tensor([[1, 2, 3]])
    clean = model(tokens)
    grad_mode = torch.is_grad_enabled()
    with pytest.raises(type(interrupt), match="inside"), steering(model, d, LAST, 3.0):
        assert not torch.equal(model(tokens), clean)
        raise interrupt
    assert torch.is_grad_enabled() == grad_mode
    assert not any(point.has_hooks() for point in model.hook_dict.values())
    assert torch.equal(model(tokens), clean)


def test_another_thread_sees_no_steering(planted):
    model, d = planted
    tokens = torch.tensor([[1, 2, 3]])
    clean = model(tokens)
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait(5)
        seen["logits"] = model(tokens)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with steering(model, d, LAST, 3.0):
        inside.set()
        done.wait(5)
        steered = model(tokens)
    thread.join()
    assert torch.equal(seen["logits"], clean) and not torch.equal(steered, clean)


def test_steered_generation_with_positions_runs_without_the_cache(planted):
    model, d = planted
    tokens = torch.tensor([[1, 2, 3]])
    everywhere = steered_generate(model, tokens, d, LAST, 4.0, max_new_tokens=3)
    assert everywhere[0, 3:].tolist() == [TARGET] * 3  # the planted token wins every step
    last_only = steered_generate(model, tokens, d, LAST, 4.0, positions=[-1], max_new_tokens=3)
    assert int(last_only[0, 3]) == TARGET  # the prompt's last position predicts the first new token
    with pytest.raises(ValueError, match=r"positions \[3\] lie outside the prompt of 3 tokens"):
        steered_generate(model, tokens, d, LAST, 1.0, positions=[3])


# ---- the sweep ------------------------------------------------------------------------------------------------


def test_the_sweep_measures_concept_fluency_and_side_effects(planted):
    model, d = planted
    random = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(123))
    vectors = [SteeringVector(d, LAST, "planted"), SteeringVector(random / random.norm(), LAST, "random")]
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 8])]
    neutral = [torch.tensor([9, 10, 11])]
    sweep = steering_sweep(
        model, vectors, [0.0, 2.0, 4.0], prompts, neutral, prefix=torch.tensor([TARGET, TARGET]),
        targets=[TARGET], max_new_tokens=3, progress=False, threads=1,
    )  # fmt: skip
    concept, kl = sweep.grid("concept"), sweep.grid("kl")
    assert concept[0, 0] == pytest.approx(sweep.unsteered.concept) and kl[0, 0] == pytest.approx(0.0, abs=1e-12)
    assert concept[0, 2] > concept[0, 1] > concept[0, 0] + 1  # along d: more of the target, monotone in strength
    assert concept[1, 2] - concept[1, 0] < 0.3 * (concept[0, 2] - concept[0, 0])  # random direction: much less
    assert kl[0, 2] > kl[0, 1] > 0
    assert sweep.results[0][2].continuations[0] == " ".join([str(TARGET)] * 3)
    perplexity = sweep.grid("perplexity")  # the unsteered model finds the planted token unlikely (its bias is -3)
    assert perplexity[0, 2] > 2 * sweep.unsteered.perplexity and sweep.best(
        max_perplexity=math.inf, max_kl=math.inf
    ) == (0, 2)
    assert sweep.best()[0] == 1  # within twice the unsteered perplexity only the random direction's settings remain
    assert sweep.best(max_kl=0.0) == (0, 0)  # strength 0 is the only setting with no side effect
    fig = sweep_figure(sweep)
    names = {trace.name for trace in fig.data}
    assert {"prompt baseline", "unsteered", LAST} <= names


# ---- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "vector, hook, strength, positions, error, message",
    [
        (torch.ones(D_MODEL + 1), LAST, 1.0, None, ValueError, r"\[d_model=64\].*got \[65\]"),
        (torch.ones(D_MODEL, dtype=torch.float64), LAST, 1.0, None, TypeError, "torch.float64.*torch.float32"),
        (torch.ones(D_MODEL, dtype=torch.long), LAST, 1.0, None, TypeError, "torch.int64"),
        (torch.full((D_MODEL,), float("nan")), LAST, 1.0, None, ValueError, "non-finite"),
        (torch.ones(D_MODEL), "blocks.1.hook_resid_pots", 1.0, None, KeyError, "blocks.1.hook_resid_post"),
        (torch.ones(D_MODEL), LAST, float("nan"), None, ValueError, "strength must be finite, got nan"),
        (torch.ones(D_MODEL), LAST, 1.0, [], ValueError, "positions is empty"),
    ],
)
def test_bad_steering_input_is_refused_by_name(planted, vector, hook, strength, positions, error, message):
    model, _ = planted
    with pytest.raises(error, match=message), steering(model, vector, hook, strength, positions):
        pass
    assert not any(point.has_hooks() for point in model.hook_dict.values())


def test_positions_past_the_sequence_are_refused_at_the_forward(planted):
    model, d = planted
    with (
        pytest.raises(ValueError, match=r"positions \[5\] lie outside the 3 positions"),
        steering(model, d, LAST, 1.0, positions=[5]),
    ):
        model(torch.tensor([[1, 2, 3]]))


def test_empty_contrast_sets_are_refused(embedded):
    model, _ = embedded
    with pytest.raises(ValueError, match="negative set is empty"):
        difference_of_means(model, _texts(1, 2, seed=0), [], LAST)
    with pytest.raises(ValueError, match="CAA pair set is empty"):
        caa_vector(model, [], LAST)
    with pytest.raises(KeyError, match="closest"):
        difference_of_means(model, _texts(1, 2, seed=0), _texts(6, 2, seed=1), "blocks.9.hook_resid_post")


# ---- the command ------------------------------------------------------------------------------------------------

STEER = ["steer", "--model", "induction-2l", "--positive", "1 2 3 4", "5 6 7 8", "--negative", "9 10 11 12",
         "13 14 15 16", "--prompt", "20 21 22", "--neutral", "30 31 32", "--prefix", "1 2 3 4", "--targets", "4",
         "--max-new-tokens", "2", "--threads", "1"]  # fmt: skip


def test_the_command_writes_the_page(tmp_path, capsys):
    from analysis.cli import main

    out = tmp_path / "steer.html"
    assert main(STEER + ["--layers", "1", "--strengths", "1", "4", "--out", str(out)]) == 0
    page = out.read_text()
    assert "prompt baseline" in page and "blocks.1.hook_resid_post" in page and "<script" in page
    assert "http" not in page.split("<script")[0]  # nothing fetched before the scripts
    printed = capsys.readouterr().out
    assert "layer 1: blocks.1.hook_resid_post" in printed and "prompt baseline" in printed


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--layers", "7"], "layer=7 is out of range"),
        (["--strengths", "nan"], "strength must be finite, got nan"),
        (["--positive", " "], "--positive text is empty"),
        (["--targets", "x"], "--targets must be token ids"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(capsys, tmp_path, extra, message):
    from analysis.cli import main
    from analysis.cli.common import EXIT_USAGE

    code = main(STEER + extra + ["--out", str(tmp_path / "x.html")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1 and message in err[0], err

"""The tuned lens: a known answer on a model whose later layers are an affine map of an earlier one, the logit lens
at initialisation, the file round trip, and bad input refused by name (also on the command line)."""

import json

import pytest
import torch

from analysis.cli import main
from analysis.lens import (
    LensTrainingConfig,
    TunedLens,
    evaluate_lens,
    lens_contexts,
    lens_page,
    split_contexts,
    train_tuned_lens,
)
from analysis.lens.objective import FinalDistribution, read_out_kl
from analysis.readouts.attribution import logit_lens, logit_lens_hook_names
from interp_transformer.builder import build_decoder

D = 8


def affine_tail_model():
    """Block 0 as built; blocks 1 and 2 write ``x M_l + c_l`` and nothing else (attention's output zeroed, the MLP
    ``relu(x [M, -M]) [I; -I] = x M``), no norms: the final residual is an exact affine image of the residual
    entering block 1 (and 2), so the final distribution is a tuned lens of it with KL 0."""
    model = build_decoder(
        d_model=D, n_layers=3, n_heads=2, d_mlp=2 * D, d_vocab=24, n_ctx=12, norm="none", activation="relu", seed=0
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.W_E.copy_(torch.randn(model.W_E.shape, generator=g))
        model.W_U.copy_(torch.randn(model.W_U.shape, generator=g) * 0.5)
        for layer in (1, 2):
            block = model.blocks[layer]
            block.attn.W_O.zero_()
            block.attn.b_O.zero_()
            M = torch.randn(D, D, generator=g) * 0.4
            block.mlp.W_in.copy_(torch.cat([M, -M], dim=1))
            block.mlp.b_in.zero_()
            block.mlp.W_out.copy_(torch.cat([torch.eye(D), -torch.eye(D)], dim=0))
            block.mlp.b_out.copy_(torch.randn(D, generator=g) * 0.5)
    return model


def random_contexts(model, n=60, pos=12, seed=2):
    return torch.randint(0, model.cfg.d_vocab, (n, pos), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def trained():
    model = affine_tail_model()
    config = LensTrainingConfig(batch_size=12, epochs=20, lr=0.1, seed=0)
    return model, train_tuned_lens(model, random_contexts(model), config, progress=False)


def test_the_tuned_lens_learns_an_exact_affine_tail(trained):
    _, result = trained
    held = result.held_out
    for layer in (1, 2):  # the final residual is an affine image of these
        assert held.logit_kl[layer] > 0.5, held.table()  # the logit lens reads them badly
        assert held.tuned_kl[layer] < 0.02 * held.logit_kl[layer], held.table()
        assert held.tuned_top1[layer] > 0.95, held.table()
    assert result.losses[-1] < 0.1 * result.losses[0]


def test_identity_lens_is_the_logit_lens_exactly():
    for fields in (dict(norm="rms"), dict(norm="layer", final_softcap=5.0), dict(norm="rms", post_norms=True)):
        model = build_decoder(d_model=D, n_layers=2, n_heads=2, d_mlp=16, d_vocab=20, n_ctx=8, seed=3, **fields)
        tokens = random_contexts(model, n=2, pos=6)
        _, cache = model.run_with_cache(tokens, names_filter=logit_lens_hook_names(model))
        expected = logit_lens(cache)
        lens = TunedLens.for_model(model)
        for layer in range(model.cfg.n_layers):
            resid = cache[model.act_name("resid_pre", layer)]
            assert torch.equal(lens.logits(model, resid, layer), expected[layer]), fields


def test_read_out_kl_matches_autograd():
    model = build_decoder(
        d_model=D, n_layers=1, n_heads=2, d_mlp=16, d_vocab=20, n_ctx=8, seed=4, final_softcap=3.0, dtype=torch.float64
    )
    g = torch.Generator().manual_seed(5)
    z = torch.randn(7, D, dtype=torch.float64, generator=g, requires_grad=True)
    target = FinalDistribution.from_logits(torch.randn(7, 20, dtype=torch.float64, generator=g) * 3)
    fused = read_out_kl(model, z, target)
    (grad_fused,) = torch.autograd.grad(fused.sum(), z)
    logits = z @ model.W_U + model.b_U
    logits = 3.0 * torch.tanh(logits / 3.0)
    plain = (target.p * (target.p.log() - logits.log_softmax(-1))).sum(-1)
    (grad_plain,) = torch.autograd.grad(plain.sum(), z)
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(grad_fused, grad_plain)


def test_save_load_round_trip_is_bit_equal(trained, tmp_path):
    model, result = trained
    folder = result.save(tmp_path / "lens")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "params.pt", "training.json"]
    config = json.loads((folder / "config.json").read_text())
    assert config["d_model"] == D and config["num_hidden_layers"] == 3 and config["lens_type"] == "linear_tuned_lens"
    params = torch.load(folder / "params.pt", weights_only=True)
    assert sorted(params) == sorted(f"{i}.{kind}" for i in range(3) for kind in ("weight", "bias"))
    loaded = TunedLens.load(folder, model)
    for key, value in result.lens.layer_translators.state_dict().items():
        assert torch.equal(loaded.layer_translators.state_dict()[key], value), key
    again = evaluate_lens(model, loaded, lens_contexts(model, random_contexts(model, n=4)))
    assert again.n_tokens == 48


def test_a_lens_for_another_model_or_layer_is_refused(trained, tmp_path):
    model, result = trained
    folder = result.lens.save(tmp_path / "lens")
    wider = build_decoder(d_model=2 * D, n_layers=3, n_heads=2, d_mlp=16, d_vocab=24, n_ctx=12, seed=0)
    deeper = build_decoder(d_model=D, n_layers=4, n_heads=2, d_mlp=16, d_vocab=24, n_ctx=12, seed=0)
    with pytest.raises(ValueError, match="d_model=8 with 3 layers.*d_model=16 and 3 layers"):
        TunedLens.load(folder, wider)
    with pytest.raises(ValueError, match="d_model=8 with 3 layers.*d_model=8 and 4 layers"):
        result.lens.logits(deeper, torch.zeros(1, D), 0)
    with pytest.raises(ValueError, match="layer=3 is out of range.*3 translators"):
        result.lens.logits(model, torch.zeros(1, D), 3)
    with pytest.raises(ValueError, match="d_model=8 as its last axis, received shape \\(1, 5\\)"):
        result.lens.logits(model, torch.zeros(1, 5), 0)


def test_bad_files_are_refused_by_name(trained, tmp_path):
    model, result = trained
    folder = result.lens.save(tmp_path / "lens")
    state = torch.load(folder / "params.pt", weights_only=True)
    state["1.weight"][0, 0] = float("nan")
    torch.save(state, folder / "params.pt")
    with pytest.raises(ValueError, match="1.weight holds 1 non-finite"):
        TunedLens.load(folder)
    del state["1.weight"]
    torch.save(state, folder / "params.pt")
    with pytest.raises(KeyError, match="missing keys \\['1.weight'\\]"):
        TunedLens.load(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "lens_type": "other"}))
    with pytest.raises(ValueError, match="lens_type must be 'linear_tuned_lens'"):
        TunedLens.load(folder)
    with pytest.raises(FileNotFoundError, match="params.pt and config.json"):
        TunedLens.load(tmp_path / "nothing")


def test_bad_corpus_and_settings_are_refused(tmp_path):
    model = affine_tail_model()
    with pytest.raises(ValueError, match="the corpus is empty"):
        lens_contexts(model, [[], []], context_length=6, bos_token_id=0)
    with pytest.raises(ValueError, match="non-empty \\[context, pos\\] tensor, received shape \\(0, 12\\)"):
        lens_contexts(model, torch.zeros(0, 12, dtype=torch.long))
    with pytest.raises(ValueError, match="3 contexts cannot be split with held_out_every=5"):
        split_contexts(lens_contexts(model, random_contexts(model, n=3)), 5)
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got nan"):
        LensTrainingConfig(lr=float("nan"))
    with pytest.raises(ValueError, match="matmul_dtype must be one of"):
        LensTrainingConfig(matmul_dtype="int8")
    post = build_decoder(d_model=D, n_layers=1, n_heads=2, d_mlp=16, d_vocab=20, n_ctx=8, placement="post", seed=0)
    with pytest.raises(TypeError, match="the tuned lens needs"):
        TunedLens.for_model(post)


def test_training_is_seeded(trained):
    model, result = trained
    config = LensTrainingConfig(batch_size=12, epochs=1, lr=0.1, seed=0)
    contexts = random_contexts(model)
    first = train_tuned_lens(model, contexts, config, progress=False)
    second = train_tuned_lens(model, contexts, config, progress=False)
    assert first.losses == second.losses


def test_page_and_figure(trained):
    _, result = trained
    figure = result.held_out.figure()
    assert [trace.name for trace in figure.data] == ["tuned lens", "tuned lens", "logit lens", "logit lens"]
    page = lens_page(result.held_out, "affine tail").to_html()
    assert "<script" in page and 'src="http' not in page and "tuned KL" in page


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_cli_bad_input_is_one_line(capsys, tmp_path, trained):
    _, result = trained
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    text = tmp_path / "a.txt"
    text.write_text("some words")
    err = one_line_error(
        capsys, ["lens", "train", "--model", "induction-2l", "--corpus", str(empty), "--out", str(tmp_path / "out")]
    )
    assert "is empty" in err
    err = one_line_error(
        capsys, ["lens", "eval", "--model", "induction-2l", "--corpus", str(text), "--lens", str(tmp_path / "missing")]
    )
    assert "is not a folder" in err
    folder = result.lens.save(tmp_path / "lens")
    err = one_line_error(
        capsys, ["lens", "eval", "--model", "induction-2l", "--corpus", str(text), "--lens", str(folder)]
    )
    assert "d_model=8 with 3 layers" in err


def test_cli_train_then_eval(capsys, tmp_path):
    documents = tmp_path / "ids.jsonl"
    g = torch.Generator().manual_seed(0)
    rows = [json.dumps({"text": torch.randint(1, 60, (40,), generator=g).tolist()}) for _ in range(4)]
    documents.write_text("\n".join(rows) + "\n")
    common = [
        "--model",
        "induction-2l",
        "--corpus",
        str(documents),
        "--bos-token-id",
        "0",
        "--context-length",
        "9",
        "--threads",
        "1",
        "--no-progress",
    ]
    assert main(["lens", "train", *common, "--out", str(tmp_path / "lens"), "--max-steps", "2"]) == 0
    assert (tmp_path / "lens" / "lens.html").is_file()
    assert main(["lens", "eval", *common, "--lens", str(tmp_path / "lens"), "--out", str(tmp_path / "e.html")]) == 0
    assert "| layer |" in capsys.readouterr().out and (tmp_path / "e.html").is_file()

"""Inputs a hostile or careless user gives: each once gave a silently wrong answer, a leak or a raw error.

Each test is one defect, written as the failing example it was; all must now give the
right answer or a clear ``ValueError``/``TypeError``/``KeyError`` naming what was
expected and what came (and, on the command line, one line and exit code 2).
"""

import json
import os
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from analysis.cli import EXIT_USAGE, main
from interp_transformer import DemoTransformer, KeyValueCache, TransformerConfig
from interp_transformer.compat import HookedTransformer, HookedTransformerConfig
from interp_transformer.families.seq2seq.recipe import Seq2SeqConfig
from interp_transformer.loading import CheckpointError, from_pretrained
from interp_transformer.loading.sources import open_weights, read_bin_file
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer
from interp_transformer.pretrained import PRETRAINED_DIR, load_shipped, save_shipped
from interp_transformer.sae import SAE
from interp_transformer.text.generate import generate
from interp_transformer.text.tokens import offline_gpt2_tokenizer
from interp_transformer.verify import verify_against_hf

from .gpt2_helpers import tiny_gpt2
from .sae_helpers import random_sae
from .test_components import randomize
from .test_hooks import assert_no_hooks

CFG = TransformerConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=50257, n_ctx=32)


@pytest.fixture(scope="module")
def model():
    return randomize(
        DemoTransformer(CFG, tokenizer=offline_gpt2_tokenizer(), seed=0, dtype=torch.float64), seed=1
    ).eval()


@pytest.fixture
def gpt2_dir(tmp_path):
    tiny_gpt2(seed=0, n_layer=2).save_pretrained(tmp_path)
    return tmp_path


def one_line_error(capsys, *argv) -> str:
    code = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and err and "Traceback" not in "\n".join(err), err
    return err[-1]


# --- 1-4: silent wrong answers -------------------------------------------------------------------
def test_an_integer_storage_dtype_is_refused(model):
    tokens = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError, match="floating.*int64"):
        model.run_with_cache(tokens, dtype=torch.int64)
    with pytest.raises(TypeError, match="floating"):
        model.estimate_cache_bytes(1, 3, dtype=torch.int64)


def test_a_key_value_cache_is_never_filled_by_a_partial_run(model):
    cache = KeyValueCache(CFG.n_layers)
    with pytest.raises(ValueError, match="stop_at_layer"):
        model(torch.tensor([[1, 2, 3, 4, 5]]), stop_at_layer=1, kv_cache=cache)
    assert cache.n_positions == 0
    cache.layers[0].append(torch.zeros(1, 5, 4, 8, dtype=torch.float64), torch.zeros(1, 5, 4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="different numbers of positions"):
        model(torch.tensor([[6]]), kv_cache=cache)
    with pytest.raises(ValueError, match="KeyValueCache\\(2\\)"):
        model(torch.tensor([[6]]), kv_cache=KeyValueCache(3))


def test_stop_at_layer_n_layers_is_the_final_residual_not_the_logits(model):
    tokens = torch.tensor([[1, 2, 3]])
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(model(tokens, stop_at_layer=CFG.n_layers), cache["resid_post", -1], rtol=0, atol=1e-12)


def test_padded_text_gives_each_row_what_it_gives_alone(model):
    texts = ["Hi", "Hello there my good friend"]
    torch.testing.assert_close(model(texts)[0, -1], model("Hi")[0, -1], rtol=0, atol=1e-10)
    torch.testing.assert_close(model(texts)[1], model(texts[1])[0], rtol=0, atol=1e-10)
    for side in ("left", "right"):
        tokens, mask = model.to_tokens_and_mask(texts, padding_side=side)
        logits = model(tokens, attention_mask=mask)
        real = mask[0].bool()
        torch.testing.assert_close(logits[0][real], model("Hi")[0], rtol=0, atol=1e-10)
        _, cache = model.run_with_cache(tokens, attention_mask=mask)
        _, alone = model.run_with_cache("Hi")
        torch.testing.assert_close(cache["resid_post", 1][0][real], alone["resid_post", 1][0], rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="attention mask"):
        model.to_tokens(texts, padding_side="left")  # ids alone would silently shift the short row


def test_verify_accepts_a_padded_decoder_batch():
    hf = tiny_gpt2(seed=3, n_layer=2, vocab_size=50257).double()
    ours = from_pretrained(hf, dtype=torch.float64)
    report = verify_against_hf(ours, hf, ["Hi", "Hello there my good friend"])
    assert report.within_tolerance and report.real_positions == 2 + 6, str(report)


# --- 5-6: threads and interrupts -----------------------------------------------------------------
def test_two_threads_hook_and_cache_one_model_without_seeing_each_other(model):
    tokens = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[9, 8, 7, 6]])]
    expected_cache = [
        model.run_with_cache(t, names_filter="blocks.1.attn.hook_pattern")[1]["pattern", 1] for t in tokens
    ]
    scale = [2.0, 3.0]
    expected_hooked = [
        model.run_with_hooks(t, fwd_hooks=[("blocks.0.hook_attn_out", lambda x, hook, s=s: x * s)])
        for t, s in zip(tokens, scale)
    ]
    failures, start = [], threading.Barrier(2)

    def work(index):
        start.wait()
        for _ in range(30):
            _, cache = model.run_with_cache(tokens[index], names_filter="blocks.1.attn.hook_pattern")
            if not torch.equal(cache["pattern", 1], expected_cache[index]):
                failures.append(("cache", index))
            hooked = model.run_with_hooks(
                tokens[index], fwd_hooks=[("blocks.0.hook_attn_out", lambda x, hook, s=scale[index]: x * s)]
            )
            if not torch.equal(hooked, expected_hooked[index]):
                failures.append(("hooks", index))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert_no_hooks(model)


def test_an_interrupt_while_hooks_are_added_leaves_none():
    model = DemoTransformer(
        TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=8), seed=0
    )
    seen = []

    def interrupting_filter(name):  # a names filter is user code: it may be interrupted half-way
        seen.append(name)
        if len(seen) == 5:
            raise KeyboardInterrupt
        return True

    with pytest.raises(KeyboardInterrupt):
        model.run_with_hooks(torch.tensor([[1, 2]]), fwd_hooks=[(interrupting_filter, lambda x, hook: None)])
    assert_no_hooks(model)
    with pytest.raises(KeyboardInterrupt), model.hooks([("blocks.0.hook_resid_pre", lambda x, hook: None)]):
        raise KeyboardInterrupt
    assert_no_hooks(model)
    # a torch-level hook registered on a hook point directly (what an interrupted registration once left) is
    # cleared by reset_hooks(including_permanent=True)
    fired = []
    model.hook_dict["blocks.1.hook_resid_post"].register_forward_hook(lambda m, i, o: fired.append(1))
    model.reset_hooks(including_permanent=True)
    model(torch.tensor([[1, 2]]))
    assert fired == [] and not model.hook_dict["blocks.1.hook_resid_post"]._forward_hooks


# --- 7-13: errors that escaped the contract -------------------------------------------------------
def test_a_config_claiming_a_million_layers_is_refused_before_enumerating_them(gpt2_dir):
    config = json.loads((gpt2_dir / "config.json").read_text())
    for n_layer in (1_000_000, 10**9):
        (gpt2_dir / "config.json").write_text(json.dumps({**config, "n_layer": n_layer}))
        start = time.perf_counter()
        with pytest.raises(CheckpointError, match=f"n_layer={n_layer}.*holds layers 0..1"):
            from_pretrained(gpt2_dir)
        assert time.perf_counter() - start < 5


def test_a_hook_returning_another_dtype_names_the_hook(model):
    with pytest.raises(ValueError, match="hook 'to_float' on blocks.0.attn.hook_pattern returned a torch.float32"):

        def to_float(x, hook):
            return x.float()

        model.run_with_hooks(torch.tensor([[1, 2, 3]]), fwd_hooks=[("blocks.0.attn.hook_pattern", to_float)])
    assert_no_hooks(model)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("n_head", 0, "n_head must be a positive int, got 0"),
        ("n_head", "4", "n_head"),
        ("layer_norm_epsilon", "inf", "finite"),
    ],
)
def test_bad_config_fields_are_one_line_errors(gpt2_dir, capsys, field, value, message):
    config = json.loads((gpt2_dir / "config.json").read_text())
    value = float("inf") if value == "inf" else value
    (gpt2_dir / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError, match=message):
        from_pretrained(gpt2_dir)
    for command in (
        ["verify", gpt2_dir],
        ["report", "--model", gpt2_dir, "--prompt", "hello", "--out", gpt2_dir / "r.html"],
    ):
        assert message.split(",")[0] in one_line_error(capsys, *command)


def test_a_checkpoint_tensor_of_integers_is_refused(gpt2_dir):
    weights = load_file(gpt2_dir / "model.safetensors")
    name = next(name for name in weights if name.endswith("ln_1.weight"))
    weights[name] = weights[name].long()
    save_file(weights, gpt2_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="int64 values, a weight must be floating point"):
        from_pretrained(gpt2_dir)


def test_verify_in_float64_of_a_gpt2_that_upcasts_its_attention(tmp_path):
    tiny_gpt2(seed=0, n_layer=2, reorder_and_upcast_attn=True).save_pretrained(tmp_path)
    assert main(["verify", str(tmp_path), "--float64"]) == 0


def test_corrupt_weights_dirs_are_one_line_errors(tmp_path, capsys):
    for case in ("unknown key", "truncated", "missing tensor"):
        directory = tmp_path / case.replace(" ", "-")
        directory.mkdir()
        for suffix in (".json", ".safetensors"):
            (directory / f"induction-2l{suffix}").write_bytes((PRETRAINED_DIR / f"induction-2l{suffix}").read_bytes())
        meta_path, weights_path = directory / "induction-2l.json", directory / "induction-2l.safetensors"
        if case == "unknown key":
            meta = json.loads(meta_path.read_text())
            meta["config"]["n_experts"] = 4
            meta_path.write_text(json.dumps(meta))
            expected = "unknown config keys \\['n_experts'\\]"
        elif case == "truncated":
            weights_path.write_bytes(weights_path.read_bytes()[:300])
            expected = "corrupt or truncated"
        else:
            weights = load_file(weights_path)
            del weights["blocks.1.attn.W_O"]
            save_file(weights, weights_path)
            expected = "missing 1 tensor.*blocks.1.attn.W_O"
        with pytest.raises(ValueError, match=expected):
            load_shipped("induction-2l", directory=directory)
        line = one_line_error(
            capsys,
            "report",
            "--model",
            "induction-2l",
            "--prompt",
            "1 2 3",
            "--weights-dir",
            directory,
            "--out",
            tmp_path / "r.html",
        )
        assert expected.split(" ")[0].strip("\\[") in line


def test_misusing_verify_or_the_cache_names_what_was_expected(model):
    with pytest.raises(TypeError, match="Hugging Face transformers model"):
        verify_against_hf(model, "gpt2", torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="n_layers must be a positive int"):
        KeyValueCache(0)


# --- 14-16: argument checks and messages ----------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=True), "top_k"),
    ],
)
def test_generation_arguments(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(model, torch.tensor([[1, 2]]), 2, **kwargs)


def test_argument_checks(model, capsys):
    tokens = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError, match="backward_metric must return a scalar tensor"):
        model.run_with_cache(tokens, incl_bwd=True, backward_metric=lambda logits: 1.0)
    with pytest.raises(ValueError, match="device must be a torch device.*banana"):
        model.run_with_cache(tokens, device="banana")
    with pytest.raises(ValueError, match="meta device"):
        model(torch.tensor([[1, 2]], device="meta"))
    line = one_line_error(capsys, "report", "--model", "induction-2l", "--prompt", "0 99999999999999999999999")
    assert "99999999999999999999999 is not below d_vocab" in line


def test_messages_say_what_is_wrong(model, tmp_path):
    torch.testing.assert_close(model([1, 2, 3]), model(torch.tensor([[1, 2, 3]])))  # a list of ids is ids
    noise = tmp_path / "pytorch_model.bin"
    noise.write_bytes(os.urandom(2048))
    with pytest.raises(ValueError, match="not a PyTorch checkpoint"):
        read_bin_file(noise)
    with pytest.raises(ValueError, match="lone surrogate"):
        model("abc \ud800 def")


def test_training_never_writes_into_the_package_nor_saves_nan(capsys, tmp_path):
    assert "--lr must be a finite positive number" in one_line_error(
        capsys, "train-induction", "--lr", "inf", "--steps", 1, "--out-dir", tmp_path
    )
    with pytest.raises(ValueError, match="inside the installed package"):
        save_shipped(load_shipped("induction-2l"), "induction-2l", {}, directory=PRETRAINED_DIR)


def test_a_shard_index_may_not_name_files_outside_the_checkpoint(gpt2_dir):
    outside = gpt2_dir.parent / f"{gpt2_dir.name}-outside.safetensors"
    (gpt2_dir / "model.safetensors").rename(outside)
    index = {"weight_map": {name: f"../{outside.name}" for name in load_file(outside)}}
    (gpt2_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="outside"):
        open_weights(gpt2_dir)


def test_config_and_tokenizer_values(model):
    with pytest.raises(ValueError, match="layer_norm_eps must be > 0 and finite"):
        TransformerConfig(layer_norm_eps=float("inf"))
    with pytest.raises(TypeError, match="tokenizer must be a Hugging Face tokenizer"):
        DemoTransformer(
            TransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_vocab=20, n_ctx=8), tokenizer="gpt2"
        )


def test_caching_gradients_leaves_the_models_grads_alone(model):
    tokens = torch.tensor([[1, 2, 3]])
    _, cache = model.run_with_cache(tokens, incl_bwd=True, names_filter="blocks.0.hook_resid_pre")
    assert cache["blocks.0.hook_resid_pre_grad"].abs().sum() > 0
    assert all(param.grad is None for param in model.parameters())


# --- 17-21: caches, vocabularies, devices and weights that do not fit -----------------------------
def test_a_kv_cache_that_is_not_one_is_a_type_error(model):
    with pytest.raises(TypeError, match="kv_cache must be a KeyValueCache, received dict"):
        model(torch.tensor([[1, 2, 3]]), kv_cache={})
    tl_model = HookedTransformer(HookedTransformerConfig(d_model=16, d_head=8, n_layers=1, n_ctx=8, d_vocab=20))
    with pytest.raises(TypeError, match="past_kv_cache must be a HookedTransformerKeyValueCache, received list"):
        tl_model(torch.tensor([[1, 2]]), past_kv_cache=[])
    with pytest.raises(TypeError, match="kv_cache must be a KeyValueCache, received dict"):
        tl_model(torch.tensor([[1, 2]]), kv_cache={})
    seq2seq_cfg = Seq2SeqConfig(
        d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=8
    )
    seq2seq = EncoderDecoderTransformer(seq2seq_cfg, seed=0)
    source = seq2seq.encode(torch.tensor([[1, 2, 3]]))
    with pytest.raises(TypeError, match="kv_cache must be an EncoderDecoderKVCache, received KeyValueCache"):
        seq2seq.decode(torch.tensor([[0]]), source, kv_cache=KeyValueCache(1))


def test_a_kv_cache_filled_by_another_model_names_both_shapes(model):
    tokens = torch.tensor([[1, 2, 3]])
    cache = KeyValueCache(CFG.n_layers)
    model(tokens, kv_cache=cache)
    other_cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=2, d_head=16, d_mlp=64, d_vocab=20, n_ctx=32)
    other = DemoTransformer(other_cfg, seed=0, dtype=torch.float64)
    with pytest.raises(
        ValueError,
        match=r"holds keys \[batch, pos, n_key_value_heads, d_head\] = \[1, 3, 4, 8\], "
        r"the model's block 0 needs \[batch, pos, 2, 16\]",
    ):
        other(torch.tensor([[4]]), kv_cache=cache)
    key_is_real = cache.key_is_real
    with pytest.raises(
        ValueError,
        match=r"\[1, 3, 4, 8\] \(torch.float64 on cpu\), "
        r"this layer computes \[1, 1, 4, 8\] \(torch.float32 on cpu\)",
    ):
        randomize(DemoTransformer(CFG, seed=0), seed=1)(torch.tensor([[4]]), kv_cache=cache)
    assert cache.n_positions == 3 and cache.key_is_real is key_is_real  # a refused run leaves the cache as it was
    continued = model(torch.tensor([[4]]), kv_cache=cache)[0, -1]
    torch.testing.assert_close(continued, model(torch.tensor([[1, 2, 3, 4]]))[0, -1])
    meta = KeyValueCache(CFG.n_layers)
    for layer in meta.layers:  # filled on another device
        layer.append(*(torch.empty(1, 3, 4, 8, dtype=torch.float64, device="meta") for _ in range(2)))
    with pytest.raises(ValueError, match="on meta.*on cpu"):
        model(torch.tensor([[4]]), kv_cache=meta)


def test_verify_refuses_a_hugging_face_model_of_another_vocabulary():
    ours = from_pretrained(tiny_gpt2(seed=0), dtype=torch.float64)  # vocab_size 61
    with pytest.raises(ValueError, match="the Hugging Face model's vocabulary has 50 tokens, the model's has 61"):
        verify_against_hf(ours, tiny_gpt2(seed=0, vocab_size=50).double(), torch.tensor([[1, 2, 55]]))
    hf = tiny_gpt2(seed=0).double()
    for token, message in ((70, "the id 70, outside the model's vocabulary .* of 61 tokens"), (-2, "id -2, outside")):
        with pytest.raises(ValueError, match=message):  # once an IndexError inside the Hugging Face model
            verify_against_hf(ours, hf, torch.tensor([[1, 2, token]]))


def test_a_device_torch_cannot_read_is_refused_before_any_weight_is_read(gpt2_dir, tmp_path):
    (gpt2_dir / "model.safetensors").write_bytes(b"not weights")  # reading any weight would fail with another error
    sae_dir = random_sae().save(tmp_path / "sae")
    (sae_dir / "sae_weights.safetensors").write_bytes(b"not weights")
    expected = r"device='banana' is not a valid torch device \(expected e.g. 'cpu', 'cuda', 'cuda:0'\)"
    loaders = (
        lambda: from_pretrained(gpt2_dir, device="banana"),
        lambda: DemoTransformer.from_pretrained(gpt2_dir, device="banana"),
        lambda: HookedTransformer.from_pretrained(gpt2_dir, device="banana"),
        lambda: load_shipped("induction-2l", device="banana"),
        lambda: SAE.load(sae_dir, device="banana"),
    )
    for load in loaders:
        with pytest.raises(ValueError, match=expected):
            load()
    with pytest.raises(TypeError, match="device must be a torch device or its name.*received float 1.5"):
        from_pretrained(gpt2_dir, device=1.5)


def test_non_finite_weights_are_refused_at_load(gpt2_dir, tmp_path):
    sae_dir = random_sae().save(tmp_path / "sae")
    weights = load_file(sae_dir / "sae_weights.safetensors")
    weights["W_enc"][0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    save_file(weights, sae_dir / "sae_weights.safetensors")
    with pytest.raises(ValueError, match=r"W_enc holds 3 non-finite values \(NaN or inf\)"):
        SAE.load(sae_dir)
    weights = load_file(gpt2_dir / "model.safetensors")
    name = next(name for name in weights if name.endswith("h.1.ln_2.weight"))
    weights[name][5] = float("nan")
    save_file(weights, gpt2_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"blocks.1.ln2.w holds 1 non-finite value \(NaN or inf\)"):
        from_pretrained(gpt2_dir)

"""Loading GPT-2 from Hugging Face: parity with HF (every hook), directories, the hub cache, bad input."""

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoConfig, GPTNeoForCausalLM

from interp_transformer import DemoTransformer
from interp_transformer.families.gpt2 import hf as gpt2
from interp_transformer.loading import CheckpointError, build_model, from_pretrained, supported_architectures
from interp_transformer.text.tokens import offline_gpt2_tokenizer
from interp_transformer.verify import verify_against_hf

from .gpt2_helpers import one_thread, random_tokens, tiny_gpt2  # noqa: F401 (autouse fixture)

PER_BLOCK_HOOKS = [
    "hook_resid_pre",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_pattern",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_normalized",
    "mlp.hook_pre",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
]


def assert_same_parameters(model_a: DemoTransformer, model_b: DemoTransformer) -> None:
    params_a, params_b = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    assert params_a.keys() == params_b.keys()
    for name, param in params_a.items():
        assert param.dtype == params_b[name].dtype, name
        assert torch.equal(param, params_b[name]), name


# ---------------------------------------------------------------- parity with Hugging Face


@settings(max_examples=10, deadline=None, database=None)
@given(
    n_layer=st.integers(1, 3),
    n_head=st.sampled_from([1, 2, 4]),
    d_head=st.sampled_from([4, 8, 16]),
    mlp_ratio=st.sampled_from([None, 2, 3]),
    vocab_size=st.integers(11, 300),
    n_positions=st.integers(8, 40),
    layer_norm_epsilon=st.sampled_from([1e-5, 1e-3, 1e-8]),
    activation_function=st.sampled_from(["gelu_new", "relu", "gelu"]),
    seed=st.integers(0, 2**16),
)
def test_random_gpt2_configs_match_hugging_face_at_every_hook(
    n_layer, n_head, d_head, mlp_ratio, vocab_size, n_positions, layer_norm_epsilon, activation_function, seed
):
    n_embd = n_head * d_head
    hf_model = tiny_gpt2(
        seed,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_inner=None if mlp_ratio is None else mlp_ratio * n_embd,
        vocab_size=vocab_size,
        n_positions=n_positions,
        layer_norm_epsilon=layer_norm_epsilon,
        activation_function=activation_function,
    )
    tokens = random_tokens(vocab_size, 2, min(n_positions, 12), seed)

    model = from_pretrained(hf_model)
    assert model.cfg.d_mlp == (4 if mlp_ratio is None else mlp_ratio) * n_embd
    report = verify_against_hf(model, hf_model, tokens, float64_recheck=False)
    expected_rows = (
        ["hook_embed", "hook_pos_embed"]
        + [f"blocks.{layer}.{hook}" for layer in range(n_layer) for hook in PER_BLOCK_HOOKS]
        + ["ln_final.hook_normalized", "logits"]
    )
    assert [row.hook for row in report.rows] == expected_rows
    assert report.ok, str(report)
    assert report.logits_max_diff < 1e-4

    hf_model.double()
    model64 = from_pretrained(hf_model, dtype=torch.float64)
    report64 = verify_against_hf(model64, hf_model, tokens, atol=1e-10, rtol=0.0, float64_recheck=False)
    assert report64.ok, str(report64)
    assert report64.logits_max_diff < 1e-10


@pytest.fixture(scope="module")
def gpt2_small():
    """A GPT-2 small-shaped HF model (124M parameters, random weights) and ours, loaded from it."""
    torch.manual_seed(0)
    hf_model = GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).eval()
    return hf_model, from_pretrained(hf_model)


def test_gpt2_small_shape_logits_greedy_ids_and_text_match_hugging_face(gpt2_small):
    hf_model, model = gpt2_small
    assert sum(p.numel() for p in hf_model.parameters()) == 124_439_808
    # ours stores W_U apart from W_E, and a zero b_U
    assert sum(p.numel() for p in model.parameters()) == 124_439_808 + 768 * 50257 + 50257
    tokenizer = offline_gpt2_tokenizer()
    assert model.tokenizer is tokenizer  # no tokenizer in an in-memory model: GPT-2's own is the fallback
    prompt = "Hello world, my name is"
    tokens = tokenizer(prompt, return_tensors="pt")["input_ids"]

    with torch.no_grad():
        hf_logits = hf_model(tokens).logits
    assert (model(tokens) - hf_logits).abs().max() < 1e-4
    report = verify_against_hf(model, hf_model, tokens, float64_recheck="always")
    assert report.within_tolerance and len(report.rows) == 2 + 12 * len(PER_BLOCK_HOOKS) + 2, str(report)
    assert report.float64.logits_max_diff < 1e-10 and report.float64.within_tolerance, str(report.float64)

    hf_ids = hf_model.generate(
        tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=8, do_sample=False, pad_token_id=50256
    )
    our_ids = model.generate(tokens, max_new_tokens=8, temperature=0)
    assert our_ids.tolist() == hf_ids.tolist()
    assert model.generate(prompt, max_new_tokens=8, temperature=0, prepend_bos=False) == tokenizer.decode(hf_ids[0])


# ---------------------------------------------------------------- local directories


@pytest.fixture(scope="module")
def hf_tiny():
    return tiny_gpt2(3)


def save_bin_directory(hf_model, directory) -> None:
    """A directory as ``save_pretrained(safe_serialization=False)`` wrote it before transformers 5 dropped it."""
    hf_model.config.save_pretrained(directory)
    state = {name: t for name, t in hf_model.state_dict().items() if name != "lm_head.weight"}  # tied to wte
    torch.save(state, directory / "pytorch_model.bin")


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_save_pretrained_directory_loads_like_the_in_memory_model(hf_tiny, tmp_path, weights):
    if weights == "model.safetensors":
        hf_tiny.save_pretrained(tmp_path)
    else:
        save_bin_directory(hf_tiny, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(("model", "pytorch_model"))] == [weights]
    from_dir, from_memory = from_pretrained(tmp_path), from_pretrained(hf_tiny)
    assert_same_parameters(from_dir, from_memory)
    assert from_dir.tokenizer is None  # vocab 61 is not GPT-2's, so no fallback tokenizer
    tokens = random_tokens(61, 1, 8)
    assert (from_dir(tokens) - hf_tiny(tokens).logits).abs().max() < 1e-4


def test_gpt2_model_without_lm_head_loads_with_the_unembedding_tied():
    from transformers import GPT2Model

    from .gpt2_helpers import randomize_

    torch.manual_seed(1)
    body = randomize_(GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=30, n_positions=8)), 1).eval()
    model = from_pretrained(body)
    assert torch.equal(model.W_U, body.wte.weight.T) and torch.equal(model.b_U, torch.zeros(30))
    report = verify_against_hf(model, body, random_tokens(30, 1, 5))
    assert report.ok and report.logits_max_diff is None  # no LM head, so no logits to compare


def test_dtype_and_string_dtype(hf_tiny):
    model = from_pretrained(hf_tiny, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(random_tokens(61, 1, 4)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        from_pretrained(hf_tiny, dtype=torch.int64)


def test_conversion_is_pure_reads_each_tensor_once_and_shares_no_memory(hf_tiny):
    hf_state = hf_tiny.state_dict()
    before = {name: t.clone() for name, t in hf_state.items()}
    reads: dict[str, int] = {}

    class CountingDict(dict):
        def __getitem__(self, name):
            reads[name] = reads.get(name, 0) + 1
            return super().__getitem__(name)

    ours = gpt2.convert_state_dict(CountingDict(hf_state), gpt2.config_from_hf(hf_tiny.config))
    assert max(reads.values()) == 1
    assert all(torch.equal(hf_state[name], before[name]) for name in hf_state)
    hf_pointers = {t.untyped_storage().data_ptr() for t in hf_state.values()}
    assert not any(t.untyped_storage().data_ptr() in hf_pointers for t in ours.values())
    # the converter's own math, checked against a direct reading of HF's fused c_attn
    c_attn = hf_state["transformer.h.1.attn.c_attn.weight"]
    head, d_head, d_model = 2, 8, 32
    assert torch.equal(
        ours["blocks.1.attn.W_K"][head], c_attn[:, d_model + head * d_head : d_model + (head + 1) * d_head]
    )


def _save_safetensors(directory, hf_model, state):
    hf_model.config.save_pretrained(directory)
    save_file({name: t.contiguous() for name, t in state.items()}, str(directory / "model.safetensors"))


def test_missing_unexpected_and_mis_shaped_tensors_are_all_listed(hf_tiny, tmp_path):
    state = {name: t for name, t in hf_tiny.state_dict().items() if name != "lm_head.weight"}
    del state["transformer.h.1.mlp.c_fc.bias"]
    state["transformer.h.0.attn.c_proj.weight"] = torch.zeros(32, 31)
    state["transformer.h.0.extra.weight"] = torch.zeros(3)
    _save_safetensors(tmp_path, hf_tiny, state)
    with pytest.raises(CheckpointError) as error:
        from_pretrained(tmp_path)
    assert error.value.missing == ["h.1.mlp.c_fc.bias"]
    assert error.value.unexpected == ["h.0.extra.weight"]
    assert error.value.mis_shaped == {"h.0.attn.c_proj.weight": ((32, 32), (32, 31))}
    message = str(error.value)
    assert "h.1.mlp.c_fc.bias" in message and "expected [32, 32] received [32, 31]" in message


def test_old_checkpoint_layout_without_prefix_and_with_mask_buffers_loads(hf_tiny, tmp_path):
    # The hub's original "gpt2" files: no "transformer." prefix, no lm_head, causal-mask buffers per layer.
    state = {
        name.removeprefix("transformer."): t for name, t in hf_tiny.state_dict().items() if name != "lm_head.weight"
    }
    for layer in range(2):
        state[f"h.{layer}.attn.bias"] = torch.ones(1, 1, 24, 24)
    _save_safetensors(tmp_path, hf_tiny, state)
    assert_same_parameters(from_pretrained(tmp_path), from_pretrained(hf_tiny))


def test_build_model_is_strict():
    cfg = gpt2.config_from_hf(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=8, vocab_size=20))
    state = DemoTransformer(cfg, seed=0).state_dict()
    del state["blocks.0.attn.b_O"]
    with pytest.raises(CheckpointError, match="blocks.0.attn.b_O"):
        build_model(cfg, state)


class _RunsCode:
    """Unpickling this object would create a file: the classic malicious checkpoint."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("format", ["zip", "legacy_pickle"])
def test_malicious_bin_is_refused_without_running_its_code(hf_tiny, tmp_path, format):
    marker = tmp_path / "code_ran"
    hf_tiny.config.save_pretrained(tmp_path)
    payload = {"wte.weight": torch.zeros(2), "evil": _RunsCode(marker)}
    if format == "zip":
        torch.save(payload, tmp_path / "pytorch_model.bin")
    else:
        (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(payload))
    with pytest.raises(ValueError, match=r"refusing to load .*arbitrary code"):
        from_pretrained(tmp_path)
    assert not marker.exists()
    # the payload is live: an unsafe load would have run it
    torch.load(tmp_path / "pytorch_model.bin", weights_only=False) if format == "zip" else pickle.loads(
        (tmp_path / "pytorch_model.bin").read_bytes()
    )
    assert marker.exists()


@pytest.mark.parametrize("file_name", ["model.safetensors", "pytorch_model.bin"])
def test_corrupt_weight_file_gives_a_clear_error(hf_tiny, tmp_path, file_name):
    if file_name == "model.safetensors":
        hf_tiny.save_pretrained(tmp_path)
    else:
        save_bin_directory(hf_tiny, tmp_path)
    path = tmp_path / file_name
    path.write_bytes(path.read_bytes()[:300])  # truncated
    with pytest.raises(ValueError, match="corrupt"):
        from_pretrained(tmp_path)


def test_directory_without_weights_or_config(hf_tiny, tmp_path):
    hf_tiny.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no weights in"):
        from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        from_pretrained(tmp_path / "..")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    gpt_neo = GPTNeoForCausalLM(
        GPTNeoConfig(
            num_layers=1,
            attention_types=[[["global"], 1]],
            hidden_size=16,
            num_heads=2,
            vocab_size=30,
            max_position_embeddings=16,
        )
    )
    with pytest.raises(ValueError, match=r"'gpt_neo' is not supported.*\['bart', 'bert', 'bloom', 'gemma'"):
        from_pretrained(gpt_neo)
    gpt_neo.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not read: the architecture is rejected first")
    with pytest.raises(ValueError, match=r"'gpt_neo' is not supported"):
        from_pretrained(tmp_path)
    assert "gpt2" in supported_architectures()


def test_unsupported_gpt2_variants_and_bad_sources(hf_tiny):
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        gpt2.config_from_hf(GPT2Config(scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(ValueError, match="activation_function"):
        gpt2.config_from_hf(GPT2Config(activation_function="quick_gelu"))
    with pytest.raises(TypeError, match="source must be"):
        from_pretrained(42)
    with pytest.raises(TypeError, match="plain torch module"):
        from_pretrained(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no directory at"):
        from_pretrained("./does/not/exist")


# ---------------------------------------------------------------- the hub, through the local cache


def _fake_hub_cache(cache_dir, repo_id: str, hf_model, tokenizer=None):
    """The Hugging Face cache layout: models--org--name/{refs/main, snapshots/<commit>/...}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snapshot = repo_dir / "snapshots" / commit
    hf_model.save_pretrained(snapshot)
    if tokenizer is not None:
        tokenizer.save_pretrained(snapshot)
    return snapshot


@pytest.fixture(scope="module")
def hf_gpt2_vocab():
    return tiny_gpt2(5, vocab_size=50257, n_embd=16, n_head=2, n_layer=1)


def test_hub_name_resolves_through_the_cache_with_cli_style_arguments(hf_tiny, tmp_path):
    _fake_hub_cache(tmp_path, "org/tiny-gpt2", hf_tiny)
    model = from_pretrained("org/tiny-gpt2", cache_dir=tmp_path, local_files_only=True)
    assert_same_parameters(model, from_pretrained(hf_tiny))


def test_hub_name_resolves_offline_from_hf_hub_cache_with_its_tokenizer(hf_gpt2_vocab, tmp_path, monkeypatch):
    from huggingface_hub import constants

    _fake_hub_cache(tmp_path, "gpt2", hf_gpt2_vocab, tokenizer=offline_gpt2_tokenizer())
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # what HF_HUB_CACHE=... sets
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets
    model = from_pretrained("gpt2")
    assert_same_parameters(model, from_pretrained(hf_gpt2_vocab))
    assert model.tokenizer is not offline_gpt2_tokenizer()  # read from the snapshot, not the fallback
    assert model.to_tokens("Hello world").tolist() == [[50256, 15496, 995]]


def test_unknown_hub_name_gives_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"cannot load 'gpt-2'.*did you mean \['gpt2'"):
        from_pretrained("gpt-2", cache_dir=tmp_path, local_files_only=True)
    with pytest.raises(ValueError, match="not a local directory"):
        from_pretrained("nobody/no-such-model", cache_dir=tmp_path, local_files_only=True)


def test_tokenizer_argument_wins(hf_tiny):
    tokenizer = offline_gpt2_tokenizer()
    assert from_pretrained(hf_tiny, tokenizer=tokenizer).tokenizer is tokenizer

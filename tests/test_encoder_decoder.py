"""Encoder-decoders: identities of the decoder's residual stream, short cache keys through both stacks, parts, bad
input."""

import pytest
import torch

from analysis.readouts import cross_attention
from analysis.readouts import encoder_decoder as attribution
from interp_transformer.families.t5.recipe import T5Config
from interp_transformer.loading import from_pretrained
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer, Seq2SeqConfig
from interp_transformer.parts.relative_position_bias import relative_position_bucket
from interp_transformer.parts.sinusoidal import sinusoidal_table

from .encoder_decoder_helpers import DECODER_INPUT, SOURCE, SOURCE_MASK, converted

SMALL = dict(
    d_model=32,
    n_layers=2,
    n_decoder_layers=2,
    n_heads=4,
    d_head=8,
    d_mlp=48,
    d_vocab=50,
    n_ctx=24,
    pad_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=3,
)


def perturbed(cfg, seed: int = 0) -> EncoderDecoderTransformer:
    model = EncoderDecoderTransformer(cfg, dtype=torch.float64, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return model.eval()


@pytest.fixture(scope="module", params=["seq2seq", "t5"])
def pre_norm(request):
    cfg = (
        Seq2SeqConfig(**SMALL)
        if request.param == "seq2seq"
        else T5Config(**SMALL, gated_mlp=True, act_fn="gelu_new", n_buckets=8, max_distance=12)
    )
    model = perturbed(cfg)
    logits, cache = model.run_with_cache(SOURCE, DECODER_INPUT, attention_mask=SOURCE_MASK)
    return model, logits, cache


def test_capabilities_say_what_it_is(pre_norm):
    model, _, _ = pre_norm
    capabilities = model.capabilities
    assert capabilities.causal and capabilities.linear_logits and model.has_cross_attention
    assert model.final_norm is model.decoder.ln_final and model.read_out is model.unembed


def test_per_head_results_sum_to_the_attention_outputs(pre_norm):
    model, _, cache = pre_norm
    for attention, out in (("cross", ("attn_out", "cross")), ("decoder", ("attn_out", "decoder"))):
        results, labels = attribution.head_results(cache, attention)
        biases = model.decoder.b_O_cross if attention == "cross" else model.decoder.b_O
        for layer in range(model.cfg.n_decoder_layers):
            summed = results[layer].sum(dim=0) + biases[layer]
            torch.testing.assert_close(summed, cache[out[0], layer, out[1]], atol=1e-12, rtol=0)
        assert labels[model.cfg.n_heads] == ("L1C0" if attention == "cross" else "L1H0")


def test_the_decoder_decomposition_sums_to_its_final_residual(pre_norm):
    _, _, cache = pre_norm
    components, labels = attribution.decompose_decoder_resid(cache)
    torch.testing.assert_close(components.sum(dim=0), attribution.decoder_final_residual(cache), atol=1e-12, rtol=0)
    assert labels[:3] == ["embed", "pos_embed", "0_attn_out"][: len(labels[:3])] or labels[0] == "embed"
    assert "1_cross_attn_out" in labels


def test_direct_logit_attribution_sums_to_the_logits(pre_norm):
    model, logits, cache = pre_norm
    pos = torch.tensor([1, 4, 2])
    tokens, wrong = torch.tensor([7, 8, 9]), torch.tensor([10, 11, 12])
    attr = attribution.decoder_logit_attribution(cache, tokens, wrong, pos=pos)
    rows = torch.arange(3)
    expected = logits[rows, pos, tokens] - logits[rows, pos, wrong]
    torch.testing.assert_close(attr.total(), expected, atol=1e-10, rtol=0)
    assert attr.cross_heads.shape == (model.cfg.n_decoder_layers, model.cfg.n_heads, 3)


def test_post_norm_models_refuse_the_decomposition():
    ours, _ = converted("bart")
    _, cache = ours.run_with_cache(SOURCE, DECODER_INPUT, attention_mask=SOURCE_MASK)
    with pytest.raises(ValueError, match="post-norm"):
        attribution.decompose_decoder_resid(cache)
    with pytest.raises(ValueError, match="post-norm"):
        attribution.decoder_logit_attribution(cache, 5)
    assert attribution.optional_attribution(ours) is not None


def test_short_keys_reach_both_stacks(pre_norm):
    model, _, cache = pre_norm
    assert cache["pattern", 0, "cross"] is cache["decoder.blocks.0.cross_attn.hook_pattern"]
    assert cache["pattern", -1, "encoder"] is cache["encoder.blocks.1.attn.hook_pattern"]
    assert cache["attn", 1, "decoder"] is cache["decoder.blocks.1.attn.hook_pattern"]
    assert cache["resid_mid", 0, "cross"] is cache["decoder.blocks.0.hook_resid_mid_cross"]
    assert cache["normalized", 0, "decoder.ln2"] is cache["decoder.blocks.0.ln2.hook_normalized"]
    assert cache["embed", "decoder"] is cache["decoder.hook_embed"]
    assert cache["normalized", "encoder"] is cache["encoder.ln_final.hook_normalized"]
    assert cache["pattern", 0, "cross"].shape == (3, model.cfg.n_heads, DECODER_INPUT.shape[1], SOURCE.shape[1])
    with pytest.raises(KeyError, match="needs its stack"):
        cache["embed"]
    with pytest.raises(KeyError, match="'encoder' \\| 'decoder' \\| 'cross'"):
        cache["pattern", 0]
    with pytest.raises(KeyError, match="needs the stack and the norm"):
        cache["scale", 0, "encoder.ln3"]
    with pytest.raises(KeyError, match="out of range"):
        cache["pattern", 2, "cross"]
    with pytest.raises(AttributeError, match="model.decoder.W_Q_cross"):
        model.W_Q


def test_t5s_bias_is_hooked_once_per_stack_and_read_by_every_layer():
    model = perturbed(T5Config(**SMALL, n_buckets=8, max_distance=12))
    zero = lambda bias, hook: torch.zeros_like(bias)  # noqa: E731
    with_bias = model(SOURCE, DECODER_INPUT, attention_mask=SOURCE_MASK)
    with model.hooks(fwd_hooks=[("encoder.rel_pos_bias.hook_bias", zero), ("decoder.rel_pos_bias.hook_bias", zero)]):
        without = model(SOURCE, DECODER_INPUT, attention_mask=SOURCE_MASK)
    for block in list(model.encoder.blocks) + list(model.decoder.blocks):
        block.attn.W_Q.data  # every self-attention is biased: removing the bias moves every logit
    assert (with_bias - without).abs().min() > 0
    _, cache = model.run_with_cache(SOURCE, DECODER_INPUT, attention_mask=SOURCE_MASK)
    bias = cache["rel_pos_bias", "encoder"]
    assert bias.shape == (1, 4, SOURCE.shape[1], SOURCE.shape[1])
    # key after
    torch.testing.assert_close(bias[0, :, 0, 1], model.encoder.rel_pos_bias.W_rel_pos[4 + 1], atol=0, rtol=0)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 12), (6, 7)])
def test_relative_buckets_equal_hugging_faces(bidirectional, buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(-300, 301)
    ours = relative_position_bucket(distance, bidirectional, buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(distance, bidirectional, buckets, max_distance)
    assert torch.equal(ours, theirs)
    assert ours.min() == 0 and ours.max() == buckets - 1


def test_sinusoidal_positions_are_the_original_formula():
    table = sinusoidal_table(torch.arange(6), 8, interleaved=True).double()
    assert torch.allclose(table[3, 2], torch.tensor(3 / 10000 ** (2 / 8)).sin().double(), atol=1e-7)
    assert torch.allclose(table[3, 3], torch.tensor(3 / 10000 ** (2 / 8)).cos().double(), atol=1e-7)
    halves = sinusoidal_table(torch.arange(6), 8)
    torch.testing.assert_close(halves[:, :4], table[:, 0::2].float())


# ---- bad input ---------------------------------------------------------------------------------------


def test_a_target_longer_than_allowed_is_refused(pre_norm):
    model, _, _ = pre_norm
    too_long = torch.full((1, model.cfg.n_ctx + 1), 5)
    with pytest.raises(ValueError, match="decoder_input \\(the target\\): sequence of 25 tokens exceeds n_ctx=24"):
        model(SOURCE[:1], too_long)
    with pytest.raises(ValueError, match="exceed n_ctx=24"):
        model.generate(SOURCE, SOURCE_MASK, max_new_tokens=24)


def test_source_padding_without_a_mask_is_refused(pre_norm):
    model, _, _ = pre_norm
    with pytest.raises(ValueError, match="holds the padding id 1 .* without attention_mask"):
        model(SOURCE, DECODER_INPUT)
    with pytest.raises(ValueError, match="has batch 1, the source batch 3"):
        model(SOURCE, DECODER_INPUT[:1], attention_mask=SOURCE_MASK)


def test_unsupported_encoder_decoder_checkpoints_are_refused():
    import transformers

    mbart = transformers.MBartForConditionalGeneration(
        transformers.MBartConfig(
            vocab_size=50,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            max_position_embeddings=16,
        )
    )
    with pytest.raises(
        ValueError, match="architecture 'mbart' is not supported; supported architectures .*'bart'.*'t5'"
    ):
        from_pretrained(mbart)
    wide = transformers.T5ForConditionalGeneration(
        transformers.T5Config(vocab_size=50, d_model=16, d_kv=8, d_ff=16, num_layers=1, num_heads=4)
    )
    with pytest.raises(ValueError, match="num_heads \\* d_kv = 4 \\* 8 must equal d_model=16"):
        from_pretrained(wide)
    uneven = transformers.BartForConditionalGeneration(
        transformers.BartConfig(
            vocab_size=50,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=4,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            max_position_embeddings=16,
        )
    )
    with pytest.raises(ValueError, match="encoder_attention_heads=2 differs from decoder_attention_heads=4"):
        from_pretrained(uneven)


def test_a_checkpoint_with_a_missing_tensor_is_refused():
    from interp_transformer.core.strict import CheckpointError
    from interp_transformer.families.bart import hf as bart_loading

    ours, hf = converted("bart")
    state = {
        name: tensor
        for name, tensor in hf.state_dict().items()
        if "decoder.layers.1.encoder_attn.k_proj.bias" not in name
    }
    with pytest.raises(CheckpointError, match="missing 1 tensor\\(s\\): decoder.layers.1.encoder_attn.k_proj.bias"):
        bart_loading.convert_state_dict(state, ours.cfg)


def test_an_alignment_of_the_wrong_shape_is_refused(pre_norm):
    _, _, cache = pre_norm
    with pytest.raises(ValueError, match="alignment must be \\[batch, query_pos\\] = \\[3, 5\\]"):
        cross_attention.alignment_scores(cache, torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="entries must lie in \\[-1, 7\\)"):
        cross_attention.alignment_scores(cache, torch.full((3, 5), 7))


def test_the_alignment_score_of_a_perfect_and_a_uniform_head():
    n_target, n_source = 4, 5
    alignment = torch.tensor([[0, 2, -1, 4]])
    perfect = torch.zeros(1, 1, 1, n_target, n_source)
    perfect[0, 0, 0, torch.arange(n_target), alignment[0].clamp(min=0)] = 1.0
    uniform = torch.full((1, 1, 1, n_target, n_source), 1 / n_source)
    scores = cross_attention.attention_on_alignment(torch.cat([perfect, uniform], dim=2), alignment)
    torch.testing.assert_close(scores, torch.tensor([[1.0, 1 / n_source]]))
    assert cross_attention.diagonal_alignment(3, torch.tensor([5])).tolist() == [[0, 2, 4]]


def test_separate_source_and_target_embeddings():
    """The target reads its own embedding, the source its own: decoding the encoder's output with a shared-embedding
    twin whose embedding is the target's gives the same logits, exactly; the shared model's differ."""
    separate = perturbed(Seq2SeqConfig(**SMALL, separate_embeddings=True))
    assert separate.decoder_embed is not None and not torch.equal(separate.embed.W_E, separate.decoder_embed.W_E)
    shared = EncoderDecoderTransformer(Seq2SeqConfig(**SMALL), dtype=torch.float64)
    state = {k: v for k, v in separate.state_dict().items() if not k.startswith("decoder_embed.")}
    shared.load_state_dict(state)
    logits, cache = separate.run_with_cache(SOURCE, DECODER_INPUT, attention_mask=SOURCE_MASK)
    torch.testing.assert_close(cache["decoder.hook_embed"], separate.decoder_embed(DECODER_INPUT), rtol=0, atol=0)
    with torch.no_grad():
        encoded = separate.encode(SOURCE, SOURCE_MASK)
        shared.embed.W_E.copy_(separate.decoder_embed.W_E)
        twin = shared.decode(DECODER_INPUT, encoded)
        shared.embed.W_E.copy_(separate.embed.W_E)
        one_table = shared(SOURCE, DECODER_INPUT, attention_mask=SOURCE_MASK)
    torch.testing.assert_close(logits, twin, rtol=0, atol=1e-12)
    assert (logits - one_table).abs().max() > 1e-3
    with pytest.raises(TypeError, match="separate_embeddings must be a bool"):
        Seq2SeqConfig(**SMALL, separate_embeddings=1)

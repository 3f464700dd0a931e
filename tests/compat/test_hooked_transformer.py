"""HookedTransformer against references: Hugging Face's model, the core DemoTransformer, by-hand losses and loops."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from interp_transformer import DemoTransformer, HookedTransformer, HookedTransformerKeyValueCache, KeyValueCache
from interp_transformer.compat import utils
from interp_transformer.compat.model import Output

from ..gpt2_helpers import randomize_, tiny_gpt2

TEXTS = ["The cat sat on the mat", "A", "Tomorrow it will rain in Paris, they say"]


@pytest.fixture(scope="module")
def hf():
    """A small random GPT-2 with GPT-2's vocabulary (so GPT-2's real tokenizer applies)."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=50257, attn_implementation="eager")
    return randomize_(GPT2LMHeadModel(config), seed=3).eval()


@pytest.fixture(scope="module")
def model(hf):
    return HookedTransformer.from_pretrained(hf)


@pytest.fixture(scope="module")
def raw(hf):
    return HookedTransformer.from_pretrained_no_processing(hf)


def test_from_pretrained_processes_as_transformer_lens_does_and_keeps_the_log_probs(hf, model, raw):
    tokens = model.to_tokens(TEXTS[0])
    with torch.no_grad():
        reference = hf(tokens).logits
    assert model.processing == ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]
    assert model.cfg.normalization_type == "LNPre" and not any(
        name.endswith(("ln1.w", "ln_final.b")) for name, _ in model.named_parameters()
    )
    assert raw.processing == [] and raw.cfg.normalization_type == "LN"
    torch.testing.assert_close(raw(tokens), reference, rtol=0, atol=1e-5)
    torch.testing.assert_close(model(tokens).log_softmax(-1), reference.log_softmax(-1), rtol=0, atol=1e-5)
    _, cache = model.run_with_cache(tokens)
    assert cache["resid_pre", 1].mean(-1).abs().max() < 1e-5  # centred writing weights
    assert model.cfg.default_prepend_bos and model.tokenizer.padding_side == "right"


def test_refactor_factored_attn_matrices_changes_no_output(hf):
    refactored = HookedTransformer.from_pretrained(hf, refactor_factored_attn_matrices=True)
    plain = HookedTransformer.from_pretrained(hf)
    tokens = plain.to_tokens(TEXTS[2])
    torch.testing.assert_close(refactored(tokens), plain(tokens), rtol=0, atol=1e-4)
    assert refactored.processing[-1] == "refactor_factored_attn_matrices"
    # balanced factors: W_V and W_O^T have the same singular values, as do [W_Q; b_Q] and [W_K; b_K]
    attn = refactored.blocks[0].attn
    torch.testing.assert_close(torch.linalg.svdvals(attn.W_V), torch.linalg.svdvals(attn.W_O), rtol=1e-4, atol=1e-5)
    assert attn.b_V.abs().max() == 0


def test_it_is_a_demo_transformer_and_our_keywords_still_work(model):
    ours = model.to_tokens_and_mask(TEXTS, padding_side="left")
    logits = model(ours.tokens, attention_mask=ours.attention_mask)
    for row, text in enumerate(TEXTS):
        alone = model(text)
        torch.testing.assert_close(logits[row, -1], alone[0, -1], rtol=0, atol=1e-5)
    assert isinstance(model, DemoTransformer)
    residual = model(ours.tokens, attention_mask=ours.attention_mask, stop_at_layer=1)
    assert residual.shape == (3, ours.tokens.shape[1], 32)


def test_return_types_and_the_masked_loss(model):
    tokens = model.to_tokens(TEXTS)  # right-padded, as TransformerLens does
    logits = model(tokens)
    assert model(tokens, return_type=None) is None
    both = model(tokens, return_type="both", loss_per_token=True)
    assert isinstance(both, Output) and torch.equal(both.logits, logits)
    log_probs = logits.log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    torch.testing.assert_close(both.loss, -log_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(model(tokens, return_type="loss"), -log_probs.mean(), rtol=0, atol=1e-6)
    mask = utils.get_attention_mask(model.tokenizer, tokens, prepend_bos=True)
    keep = (mask[:, :-1] * mask[:, 1:]).bool()
    masked = model(tokens, return_type="loss", attention_mask=mask)
    torch.testing.assert_close(masked, -log_probs[keep].mean(), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="return_type"):
        model(tokens, return_type="logprobs")


def test_left_padded_text_gets_its_mask_inferred(model):
    model.tokenizer.padding_side = "left"
    try:
        tokens = model.to_tokens(TEXTS)
        logits = model(tokens)
        batched_text = model(TEXTS)
    finally:
        model.tokenizer.padding_side = "right"
    for row, text in enumerate(TEXTS):
        torch.testing.assert_close(logits[row, -1], model(text)[0, -1], rtol=0, atol=1e-5)
    torch.testing.assert_close(batched_text, logits, rtol=0, atol=0)


def test_both_key_value_caches_continue_a_padded_batch_exactly(model):
    model.tokenizer.padding_side = "left"
    try:
        prompts = model.to_tokens(TEXTS)
    finally:
        model.tokenizer.padding_side = "right"
    mask = utils.get_attention_mask(model.tokenizer, prompts, prepend_bos=True)
    following = model.to_tokens([" and then", " so", " again"], prepend_bos=False)  # right-padded: no mask inferred
    full_tokens = torch.cat([prompts, following], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(following)], dim=1)
    reference = model(full_tokens, attention_mask=full_mask)[:, -following.shape[1] :]
    ours = KeyValueCache(model.cfg.n_layers)
    model(prompts, attention_mask=mask, kv_cache=ours)
    torch.testing.assert_close(model(following, kv_cache=ours), reference, rtol=0, atol=1e-5)
    theirs = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, len(TEXTS))
    model(prompts, attention_mask=mask, past_kv_cache=theirs)
    torch.testing.assert_close(
        model(following, past_kv_cache=theirs, attention_mask=torch.ones_like(following)), reference, rtol=0, atol=1e-5
    )
    assert theirs.previous_attention_mask.shape == full_mask.shape and theirs.n_positions == full_mask.shape[1]


def test_start_at_layer_resumes_the_same_forward_pass(model):
    tokens = model.to_tokens(TEXTS[2])
    logits, cache = model.run_with_cache(tokens)
    resumed = model(cache["resid_pre", 1], start_at_layer=1, tokens=tokens, return_type="both")
    torch.testing.assert_close(resumed.logits, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(resumed.loss, model(tokens, return_type="loss"), rtol=0, atol=1e-5)
    embed, toks, shortformer, mask = model.input_to_embed(tokens)
    assert torch.equal(toks, tokens) and shortformer is None and mask is None
    torch.testing.assert_close(model(embed, start_at_layer=0), logits, rtol=0, atol=1e-5)


def test_generate_greedily_matches_a_loop_of_forward_passes(model):
    prompt = "The cat sat"
    tokens = model.to_tokens(prompt)
    expected = tokens
    for _ in range(4):
        expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], dim=1)
    for use_cache in (True, False):
        out = model.generate(
            tokens, max_new_tokens=4, do_sample=False, use_past_kv_cache=use_cache, verbose=False, stop_at_eos=False
        )
        assert torch.equal(out, expected)
    text = model.generate(prompt, max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False)
    assert text == model.tokenizer.decode(expected[0, 1:].tolist())
    assert (
        model.generate(
            prompt, max_new_tokens=4, do_sample=False, return_type="tokens", verbose=False, stop_at_eos=False
        ).tolist()
        == expected.tolist()
    )
    embeds = model.generate(
        prompt, max_new_tokens=2, do_sample=False, return_type="embeds", verbose=False, stop_at_eos=False
    )
    torch.testing.assert_close(embeds, model.W_E[expected[:, :6]], rtol=0, atol=0)
    # sampling with top_k=1 is greedy; the same seeds give the same samples
    torch.manual_seed(0)
    assert torch.equal(model.generate(tokens, max_new_tokens=4, top_k=1, verbose=False, stop_at_eos=False), expected)


def test_batched_generation_continues_each_text_as_alone(model):
    alone = [
        model.generate(text, max_new_tokens=3, do_sample=False, verbose=False, stop_at_eos=False) for text in TEXTS
    ]
    batched = model.generate(TEXTS, max_new_tokens=3, do_sample=False, verbose=False, stop_at_eos=False)
    assert batched == alone


def test_generation_stops_at_eos_and_pads_finished_rows(model):
    tokens = model.to_tokens(TEXTS[0])
    first = int(model(tokens)[0, -1].argmax())
    out = model.generate(tokens, max_new_tokens=5, do_sample=False, eos_token_id=first, verbose=False)
    assert out.shape == (1, tokens.shape[1] + 1) and out[0, -1] == first
    with pytest.warns(UserWarning, match="unsupported generation kwargs"):
        model.generate(tokens, max_new_tokens=1, verbose=False, num_beams=2)


def test_text_methods_follow_transformer_lens(model):
    assert model.to_tokens("Hello world").tolist() == [[50256, 15496, 995]]
    assert model.to_tokens("Hello world", prepend_bos=False).tolist() == [[15496, 995]]
    left = model.to_tokens(["Hello world", "Hi"], padding_side="left")
    assert left[1].tolist() == [50256, 50256, 17250]
    assert model.to_tokens("a " * 100, truncate=True).shape[1] == model.cfg.n_ctx
    assert model.to_str_tokens(torch.tensor([[15496, 995]])) == ["Hello", " world"]
    import numpy as np

    assert model.to_str_tokens(np.array([15496, 995])) == ["Hello", " world"]
    assert model.to_single_token(" world") == 995 and model.to_single_str_token(995) == " world"
    with pytest.raises(ValueError, match="tokens"):
        model.to_single_token(" SolidGoldMagikarp is")
    assert model.get_token_position(" world", "Hello world") == 2
    assert model.get_token_position(" world", "Hello world", prepend_bos=False) == 1
    assert model.tokens_to_residual_directions(" world").shape == (32,)
    assert model(np.array([[50256, 15496, 995]])).shape == (1, 3, 50257)  # ids as numpy arrays and lists
    assert model([[50256, 15496, 995]]).shape == (1, 3, 50257)


def test_run_with_cache_pos_slice_and_plain_dict(model):
    tokens = model.to_tokens(TEXTS[2])
    _, full = model.run_with_cache(tokens)
    _, sliced = model.run_with_cache(tokens, pos_slice=-1, return_cache_object=False)
    assert isinstance(sliced, dict)
    torch.testing.assert_close(sliced["blocks.0.attn.hook_q"], full["q", 0][:, -1:], rtol=0, atol=0)
    torch.testing.assert_close(sliced["blocks.1.attn.hook_pattern"], full["pattern", 1][:, :, -1:], rtol=0, atol=0)
    torch.testing.assert_close(sliced["blocks.1.hook_resid_post"], full["resid_post", 1][:, -1:], rtol=0, atol=0)


def test_saelens_model_protocol(model):
    """The calls SAELens makes on a HookedTransformer: cache one hook and stop early; splice with loss per token."""
    hook, layer = "blocks.0.hook_resid_post", 0
    tokens = model.to_tokens(TEXTS[0], prepend_bos=True)
    assert model.tokenizer.bos_token_id == 50256 and model.W_E.device == tokens.device
    residual, cache = model.run_with_cache(tokens, names_filter=[hook], stop_at_layer=layer + 1, prepend_bos=False)
    assert list(cache.keys()) == [hook]
    torch.testing.assert_close(residual, cache[hook], rtol=0, atol=0)
    _, full = model.run_with_cache(tokens)
    torch.testing.assert_close(cache[hook], full[hook], rtol=0, atol=0)
    generator = torch.Generator().manual_seed(0)
    W_enc, W_dec = torch.randn(32, 64, generator=generator) / 8, torch.randn(64, 32, generator=generator) / 8

    def sae_replacement(activations, hook):
        return torch.relu(activations @ W_enc) @ W_dec

    logits, loss = model.run_with_hooks(
        tokens, return_type="both", loss_per_token=True, fwd_hooks=[(hook, sae_replacement)]
    )
    assert loss.shape == (1, tokens.shape[1] - 1)
    spliced = torch.relu(full[hook] @ W_enc) @ W_dec
    expected = model(spliced, start_at_layer=layer + 1)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, utils.lm_cross_entropy_loss(expected, tokens, per_token=True), rtol=0, atol=1e-5)


def test_sae_splice_methods_take_transformer_lens_keywords(raw, model):
    """``run_with_saes(..., return_type="loss")`` as SAELens' HookedSAETransformer is called (on the unprocessed
    model SAELens trains on): the spliced loss by hand; a processed model is refused, since its residual moved."""
    from interp_transformer.sae.processing import ProcessingMismatch

    from ..sae_helpers import random_sae

    hook = "blocks.0.hook_resid_post"
    sae = random_sae("standard", hook_name=hook, d_in=32, d_sae=48, seed=1)
    tokens = raw.to_tokens(TEXTS[0])
    with torch.no_grad():
        loss = raw.run_with_saes(tokens, saes=[sae], return_type="loss")
        _, full = raw.run_with_cache(tokens, names_filter=[hook])
        expected = raw(sae(full[hook]), start_at_layer=1, tokens=tokens, return_type="loss")
        _, cache = raw.run_with_cache_with_saes(tokens, saes=[sae], return_type=None)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-5)
    assert f"{hook}.hook_sae_acts_post" in cache and not any(point.has_hooks() for point in raw.hook_dict.values())
    with pytest.raises(ProcessingMismatch, match="center_writing_weights"):
        model.run_with_saes(tokens, saes=[sae])


def test_a_tiny_hf_model_without_gpt2_vocabulary_has_no_tokenizer_but_runs():
    small = HookedTransformer.from_pretrained_no_processing(tiny_gpt2())
    assert small.tokenizer is None and small.cfg.d_vocab == 61
    tokens = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(small(tokens), tiny_gpt2()(tokens).logits, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="tokenizer"):
        small("text")


def test_from_pretrained_loads_the_llama_family_with_rms_processing():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=32,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    hf_llama = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norm weights away from 1, so that folding them matters
        for name, param in hf_llama.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    tokens = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf_llama(tokens).logits
    raw = HookedTransformer.from_pretrained_no_processing(hf_llama)
    assert (raw.cfg.normalization_type, raw.cfg.positional_embedding_type, raw.cfg.n_key_value_heads) == (
        "RMS",
        "rotary",
        2,
    )
    torch.testing.assert_close(raw(tokens), reference, rtol=0, atol=1e-5)
    processed = HookedTransformer.from_pretrained(hf_llama)
    assert processed.cfg.normalization_type == "RMSPre"
    # RMSNorm keeps the mean: no centring
    assert processed.processing == ["fold_ln", "center_unembed", "fold_value_biases"]
    torch.testing.assert_close(processed(tokens).log_softmax(-1), reference.log_softmax(-1), rtol=0, atol=1e-5)

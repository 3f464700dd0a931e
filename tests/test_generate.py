"""Generation (KV cache, greedy, sampling, EOS, hooks) and test_prompt, against independent references."""

import pytest
import torch

from interp_transformer import KeyValueCache
from interp_transformer.loading import from_pretrained
from interp_transformer.text import prompts
from interp_transformer.text.generate import generate, sample_next_token

from .gpt2_helpers import one_thread, random_tokens, tiny_gpt2  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def hf_model():
    return tiny_gpt2(31, n_layer=2, n_embd=32, n_head=4, vocab_size=67, n_positions=32)


@pytest.fixture(scope="module")
def model(hf_model):
    return from_pretrained(hf_model)


@pytest.fixture(scope="module")
def prompt():
    return random_tokens(67, 2, 6, seed=2)


@pytest.fixture(scope="module")
def hf_gpt2_vocab():
    """GPT-2's vocabulary size, so the model gets GPT-2's real tokenizer."""
    return tiny_gpt2(8, vocab_size=50257, n_embd=16, n_head=2, n_layer=2, n_positions=32)


@pytest.mark.parametrize("observe_pattern", [False, True], ids=["fused", "explicit"])
def test_kv_cache_logits_equal_a_full_forward_in_float64(hf_model, observe_pattern):
    model = from_pretrained(hf_model, dtype=torch.float64)
    tokens = random_tokens(67, 2, 12, seed=5)
    hooks = [("blocks.1.attn.hook_pattern", lambda pattern, hook: None)] if observe_pattern else []
    with model.hooks(hooks), torch.no_grad():
        assert model.blocks[1].attn.uses_fused_path() != observe_pattern
        full = model(tokens)
        cache = KeyValueCache(model.cfg.n_layers)
        steps = [model(tokens[:, :5], kv_cache=cache)]  # a prompt, then one token at a time
        steps += [model(tokens[:, pos : pos + 1], kv_cache=cache) for pos in range(5, 12)]
    assert cache.n_positions == 12
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-12


def reference_greedy(model, tokens, n):
    """Greedy decoding by re-running the whole sequence: argmax of the last position, n times."""
    with torch.no_grad():
        for _ in range(n):
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


def test_greedy_with_and_without_cache_equals_reference_and_hugging_face(model, hf_model, prompt):
    with_cache = generate(model, prompt, 10, temperature=0)
    without_cache = generate(model, prompt, 10, temperature=0, use_kv_cache=False)
    assert with_cache.shape == (2, 16)
    assert torch.equal(with_cache, without_cache)
    assert torch.equal(with_cache, reference_greedy(model, prompt, 10))
    hf_ids = hf_model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=10,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert torch.equal(with_cache, hf_ids)


def test_one_dimensional_tokens_in_and_out(model, prompt):
    out = model.generate(prompt[0], 3, temperature=0)
    assert out.shape == (9,) and torch.equal(out, generate(model, prompt[:1], 3, temperature=0)[0])


def test_seed_makes_sampling_reproducible_and_private(model, prompt):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = generate(model, prompt, 12, temperature=1.5, seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert torch.equal(first, generate(model, prompt, 12, temperature=1.5, seed=7, use_kv_cache=False))
    others = [generate(model, prompt, 12, temperature=1.5, seed=seed) for seed in (8, 9)]
    assert not all(torch.equal(first, other) for other in others)
    assert torch.equal(generate(model, prompt, 12, top_k=1, seed=3), generate(model, prompt, 12, temperature=0))
    assert torch.equal(generate(model, prompt, 12, top_p=1e-6, seed=3), generate(model, prompt, 12, temperature=0))


def test_top_k_and_top_p_sample_only_allowed_tokens():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(0)) * 2
    generator = torch.Generator().manual_seed(1)
    draws = torch.stack([sample_next_token(logits, 1.0, top_k=5, generator=generator) for _ in range(300)])
    allowed = logits.topk(5).indices
    assert all(set(draws[:, row].tolist()) <= set(allowed[row].tolist()) for row in range(4))
    assert all(len(set(draws[:, row].tolist())) > 1 for row in range(4))  # still sampling
    # nucleus: the fewest top tokens whose probability first reaches top_p, computed row by row
    probs = logits.softmax(-1)
    draws = torch.stack([sample_next_token(logits, 1.0, top_p=0.6, generator=generator) for _ in range(300)])
    for row in range(4):
        nucleus, mass = set(), 0.0
        for token in probs[row].argsort(descending=True).tolist():
            nucleus.add(token)
            mass += float(probs[row, token])
            if mass >= 0.6:
                break
        assert set(draws[:, row].tolist()) <= nucleus
        assert len(set(draws[:, row].tolist())) == len(nucleus) or len(nucleus) > 3


def test_unrestricted_sampling_follows_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([sample_next_token(logits.expand(1000, 4), 0.5, generator=generator) for _ in range(10)])
    frequencies = torch.bincount(draws, minlength=4).double() / draws.numel()
    assert (frequencies - (logits[0] / 0.5).softmax(-1).double()).abs().max() < 0.02


def test_stop_at_eos_finishes_sequences_and_pads_with_eos(model, prompt):
    greedy = generate(model, prompt, 8, temperature=0)
    eos = int(greedy[0, 6 + 2])  # the third new token of sequence 0
    out = generate(model, prompt, 8, temperature=0, eos_token_id=eos)
    first_eos = [int((row[6:] == eos).nonzero()[0]) if (row[6:] == eos).any() else None for row in greedy]
    if all(position is not None for position in first_eos):
        assert out.shape[1] == 6 + max(first_eos) + 1
    for row, position in enumerate(first_eos):
        if position is not None:
            assert torch.equal(out[row, : 6 + position + 1], greedy[row, : 6 + position + 1])
            assert (out[row, 6 + position :] == eos).all()
    assert torch.equal(generate(model, prompt, 8, temperature=0, eos_token_id=eos, stop_at_eos=False), greedy)


def test_hooks_run_during_generation_with_and_without_cache(model, prompt):
    target = 42
    direction = model.W_U[:, target].detach()

    def push_towards_target(resid, hook):
        return resid + 50 * direction / direction.norm()

    with model.hooks([("blocks.1.hook_resid_post", push_towards_target)]):
        with_cache = generate(model, prompt, 5, temperature=0)
        without_cache = generate(model, prompt, 5, temperature=0, use_kv_cache=False)
    assert torch.equal(with_cache, without_cache)
    assert (with_cache[:, 6:] == target).all()
    assert not (generate(model, prompt, 5, temperature=0)[:, 6:] == target).all()  # the hook is gone


def test_bad_arguments(model, prompt):
    with pytest.raises(ValueError, match="exceeds n_ctx=32"):
        generate(model, prompt, 27)
    generate(model, prompt, 26, temperature=0)  # exactly n_ctx is fine
    for kwargs, message in [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed=1.5), "seed"),
        (dict(eos_token_id=67), "eos_token_id"),
    ]:
        with pytest.raises(ValueError, match=message):
            generate(model, prompt, **{"max_new_tokens": 2, **kwargs})
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_text_in_text_out_with_gpt2_tokenizer(hf_gpt2_vocab):
    model = from_pretrained(hf_gpt2_vocab)
    text = model.generate("Hello world", 5, temperature=0, verbose=True)
    ids = generate(model, model.to_tokens("Hello world"), 5, temperature=0)
    assert text == model.tokenizer.decode(ids[0, 1:])  # the prompt and continuation, without the BOS
    assert text.startswith("Hello world")
    assert generate(model, ["Hello world", "Hello there"], 3, temperature=0) == [
        generate(model, "Hello world", 3, temperature=0),
        generate(model, "Hello there", 3, temperature=0),
    ]
    # texts of different lengths are padded on the left with their mask: each row continues as it would alone
    assert generate(model, ["Hello", "Hello world, and more"], 4, temperature=0) == [
        generate(model, "Hello", 4, temperature=0),
        generate(model, "Hello world, and more", 4, temperature=0),
    ]
    assert generate(model, ["Hello", "Hello world, and more"], 4, temperature=0, use_kv_cache=False) == [
        generate(model, "Hello", 4, temperature=0),
        generate(model, "Hello world, and more", 4, temperature=0),
    ]
    with pytest.raises(ValueError, match="exceeds n_ctx"):
        generate(model, "word " * 40, 1)


def test_test_prompt_matches_hugging_face_probabilities(hf_gpt2_vocab, capsys):
    model = from_pretrained(hf_gpt2_vocab)
    result = prompts.test_prompt(model, "The capital of France is", "Paris city", top_k=5)
    tokens = model.to_tokens("The capital of France is Paris city")
    with torch.no_grad():
        hf_probs = hf_gpt2_vocab(tokens).logits[0].softmax(-1)
    n_prompt = len(model.to_tokens("The capital of France is")[0])
    assert result.answer_str_tokens == [" Paris", " city"]
    for offset, prediction in enumerate(result.answer):
        position_probs = hf_probs[n_prompt - 1 + offset]
        token_id = int(tokens[0, n_prompt + offset])
        assert prediction.token_id == token_id
        assert abs(prediction.prob - float(position_probs[token_id])) < 1e-5
        assert prediction.rank == int((position_probs > position_probs[token_id]).sum())
        assert [c.token_id for c in result.top[offset]] == position_probs.topk(5).indices.tolist()
    printed = capsys.readouterr().out
    assert printed.strip() == str(result).strip()
    assert f"Rank: {result.answer[0].rank}" in printed and "| Paris|" in printed
    assert (
        f"Ranks of the answer tokens: [(' Paris', {result.answer[0].rank}), (' city', {result.answer[1].rank})]"
        in printed
    )
    prompts.test_prompt(model, "The capital of France is", "Paris", print_details=False)
    assert capsys.readouterr().out == ""

"""What SAE tools read: streamed contexts equal the harvest's, token batches from every source, decoding as an affine
map."""

import einops
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from interp_transformer.harvest import iter_contexts, make_contexts
from interp_transformer.harvest.contexts import special_tokens, tokenize_documents
from interp_transformer.sae.data import activation_at, feature_acts, keep_mask, token_batches

from .sae_helpers import FIXTURES, SAE_CASES, fixture_sae, gpt2_with_tokenizer, prose_files


@pytest.fixture(scope="module")
def model():
    return gpt2_with_tokenizer()


@pytest.mark.parametrize("bos", [0, None])
def test_streamed_contexts_equal_the_harvest_contexts(bos):
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(2, 50, (int(n),), generator=generator).tolist() for n in (7, 0, 30, 1, 12, 19)]
    for length in (2, 5, 9):
        streamed = np.stack(list(iter_contexts(iter(documents), length, bos, separator_token_id=1)))
        assert np.array_equal(streamed, make_contexts(documents, length, bos, 1).token_ids.numpy())
    with pytest.raises(ValueError, match="fewer than"):
        list(iter_contexts(iter(documents), 200, bos, 1))
    with pytest.raises(ValueError, match="empty"):
        list(iter_contexts(iter([[], []]), 4, bos, 1))


def test_a_text_corpus_is_cut_as_the_harvest_cuts_it(model):
    files = prose_files()
    batches = token_batches(model, files, batch_size=5, context_length=32)
    streamed = torch.cat(list(batches))
    specials = special_tokens(model.tokenizer, True, None, None)
    documents = tokenize_documents([f.read_text() for f in files], model.tokenizer, model.cfg.d_vocab)
    reference = make_contexts(documents, 32, specials.bos_token_id, specials.separator_token_id).token_ids
    assert torch.equal(streamed, reference.long())
    assert batches.special_token_ids == (50256,)  # GPT-2's BOS is its separator, <|endoftext|>
    assert [len(b) for b in batches] == [5] * (len(reference) // 5) + (
        [len(reference) % 5] if len(reference) % 5 else []
    )
    assert len(reference) > 100  # a few thousand tokens of prose


def test_token_batches_from_tensors_and_iterators(model):
    tokens = torch.randint(0, 1000, (7, 9), generator=torch.Generator().manual_seed(1))
    assert [b.shape[0] for b in token_batches(model, tokens, batch_size=3)] == [3, 3, 1]
    assert torch.equal(torch.cat(list(token_batches(model, list(tokens.split(2))))), tokens)
    once = token_batches(model, iter(tokens.split(4)))
    assert torch.equal(torch.cat(list(once)), tokens) and list(once) == []  # an iterator is read once
    assert token_batches(model, tokens).special_token_ids == (50256,)
    with pytest.raises(TypeError, match="integer tensor"):
        token_batches(model, [tokens.float()])
    with pytest.raises(ValueError, match=r"\[batch, pos\]"):
        token_batches(model, tokens[0])
    with pytest.raises(ValueError, match="context_length"):
        token_batches(model, prose_files(), context_length=65)


def test_activation_at_runs_only_as_deep_as_the_hook(model):
    tokens = torch.randint(0, 1000, (2, 6), generator=torch.Generator().manual_seed(2))
    _, cache = model.run_with_cache(tokens)
    for name in ("hook_embed", "blocks.0.hook_mlp_out", "blocks.1.hook_resid_post", "ln_final.hook_normalized"):
        # fused LayerNorm when no scale is cached
        assert torch.allclose(activation_at(model, tokens, name), cache[name], atol=1e-6)
    with pytest.raises(KeyError, match="closest"):
        activation_at(model, tokens, "blocks.0.hook_mlp_outt")


def test_keep_mask_leaves_out_the_given_ids():
    tokens = torch.tensor([[5, 0, 3, 0], [1, 2, 3, 4]])
    assert keep_mask(tokens, [0, 4]).tolist() == [[True, False, True, False], [True, True, True, False]]
    assert bool(keep_mask(tokens, []).all())


@pytest.mark.parametrize("case", SAE_CASES)
def test_decoding_is_the_affine_map_decode_affine_gives(case):
    """``(acts * multiplier) @ directions + offset`` equals SAELens' own decoding of the same features."""
    sae = fixture_sae(case)
    expected = load_file(FIXTURES / case / "expected.safetensors")
    x = expected["x"].to(sae.dtype)
    acts, state = sae.encode_with_state(x, hooked=False)
    assert torch.allclose(acts, expected["feature_acts"].to(sae.dtype), atol=1e-6)
    directions, multiplier, offset = sae.decode_affine(state)
    affine = (acts * multiplier) @ directions + offset
    decoded = expected["decoded"].to(sae.dtype)
    if sae.cfg.reshape_activations == "hook_z":
        decoded = einops.rearrange(decoded, "... head_index d_head -> ... (head_index d_head)")
    assert torch.allclose(affine, decoded, atol=1e-5)
    assert torch.allclose(feature_acts(sae, x), acts)

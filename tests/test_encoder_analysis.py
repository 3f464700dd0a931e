"""Head detectors, circuits, neurons on BERT-style encoders: real MiniLM weights and a random BertForMaskedLM.

References: scores recomputed with explicit loops over the cached patterns, per-sentence
runs without padding, and dense weight products.
"""

import pytest
import torch

from analysis import patching
from analysis.readouts import attention, circuits, neurons
from interp_transformer.models.encoder import EncoderTokens

from .encoder_helpers import SENTENCES, minilm, random_mlm

TARGETS = {  # (tokens [pos], q, k) -> is k a target of query q? The definitions of the module docstring.
    "previous_token": lambda tokens, q, k: k == q - 1,
    "next_token": lambda tokens, q, k: k == q + 1,
    "duplicate_token": lambda tokens, q, k: k != q and tokens[k] == tokens[q],
    "induction": lambda tokens, q, k: 1 <= k <= q and tokens[k - 1] == tokens[q],
}


def scores_of(name: str, cache, batch: EncoderTokens) -> torch.Tensor:
    """The library's score for detector ``name`` on a padded batch."""
    if name == "previous_token":
        return attention.previous_token_scores(cache, batch.attention_mask)
    if name == "next_token":
        return attention.next_token_scores(cache, batch.attention_mask)
    if name == "duplicate_token":
        return attention.duplicate_token_scores(cache, batch)
    return attention.induction_scores(cache, batch)


def loop_reference(name: str, cache, batch: EncoderTokens) -> torch.Tensor:
    """Mean over real queries with a real target key of the attention mass on those keys, one query at a time."""
    is_target = TARGETS[name]
    n_layers = cache.model.cfg.n_layers
    total, rows = torch.zeros(n_layers, cache.model.cfg.n_heads, dtype=torch.float64), 0
    for b, (tokens, mask) in enumerate(zip(batch.tokens.tolist(), batch.attention_mask.tolist())):
        real = [p for p, m in enumerate(mask) if m]
        for q in real:
            keys = [k for k in real if is_target(tokens, q, k)]
            if keys:
                rows += 1
                for layer in range(n_layers):
                    total[layer] += cache["pattern", layer][b, :, q, keys].double().sum(dim=-1)
    return (total / rows).float()


@pytest.fixture(scope="module")
def minilm_batch():
    model, _ = minilm(torch.float32)
    batch = model.to_tokens_and_mask(SENTENCES)
    assert not bool(batch.attention_mask.all()), "the batch must be padded for these tests to bite"
    _, cache = model.run_with_cache(batch, names_filter=attention.pattern_hook_names(model))
    return model, batch, cache


@pytest.mark.parametrize("name", list(TARGETS))
def test_detectors_on_a_padded_batch_match_a_loop_reference(minilm_batch, name):
    _, batch, cache = minilm_batch
    torch.testing.assert_close(scores_of(name, cache, batch), loop_reference(name, cache, batch), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["previous_token", "next_token", "duplicate_token"])
def test_padding_never_changes_detector_scores(minilm_batch, name):
    """The padded batch scores what the sentences score one at a time, unpadded, pooled over their query rows."""
    model, batch, cache = minilm_batch
    pooled, rows = 0.0, 0
    for sentence in SENTENCES:
        alone = model.to_tokens_and_mask(sentence)
        ids = alone.tokens[0].tolist()
        n_rows = sum(any(TARGETS[name](ids, q, k) for k in range(len(ids))) for q in range(len(ids)))
        if n_rows == 0:
            continue  # e.g. no repeated token in this sentence
        _, alone_cache = model.run_with_cache(alone, names_filter=attention.pattern_hook_names(model))
        pooled = pooled + scores_of(name, alone_cache, alone) * n_rows
        rows += n_rows
    torch.testing.assert_close(scores_of(name, cache, batch), pooled / rows, atol=1e-5, rtol=1e-5)


def test_duplicate_scores_without_the_mask_count_padding(minilm_batch):
    # the padding id repeats: without the mask, padding queries "attend to their duplicates"
    _, batch, cache = minilm_batch
    with_mask = attention.duplicate_token_scores(cache, batch)
    without_mask = attention.duplicate_token_scores(cache, batch.tokens)
    assert (with_mask - without_mask).abs().max() > 1e-2


def test_minilm_has_a_previous_token_head_on_random_tokens():
    model, _ = minilm(torch.float32)
    cls_id, sep_id = model.tokenizer.cls_token_id, model.tokenizer.sep_token_id
    tokens = attention.repeated_random_tokens(model, 20, batch=4, seed=0, bos=cls_id, eos=sep_id)
    _, cache = model.run_with_cache(tokens, names_filter=attention.pattern_hook_names(model))
    previous = attention.previous_token_scores(cache)
    reference = torch.stack(
        [
            cache["pattern", layer][:, :, 1:, :].diagonal(dim1=-2, dim2=-1).mean(dim=(0, 2))
            for layer in range(model.cfg.n_layers)
        ]
    )
    torch.testing.assert_close(previous, reference)
    assert float(previous.max()) > 0.9  # a real checkpoint's positional head, found on random tokens


def test_repeated_random_tokens_framed_for_an_encoder():
    model, _ = random_mlm()
    bos, eos = 7, 3
    tokens = attention.repeated_random_tokens(model, seq_len=19, batch=40, seed=1, bos=bos, eos=eos)
    assert tokens.shape == (40, 40)
    assert (tokens[:, 0] == bos).all() and (tokens[:, -1] == eos).all()
    first, second = tokens[:, 1:20], tokens[:, 20:39]
    assert torch.equal(first, second)
    assert not bool(((first == bos) | (first == eos)).any())  # 760 draws from 59 ids: the exclusion is exercised
    assert set(first.flatten().tolist()) == set(range(model.cfg.d_vocab)) - {bos, eos}
    with pytest.raises(ValueError, match=r"\+ 1 \(bos\) \+ 1 \(eos\)"):
        attention.repeated_random_tokens(model, seq_len=20, bos=bos, eos=eos)


def test_encoder_targets_may_look_ahead_a_decoders_may_not(minilm_batch, small_model):
    _, batch, cache = minilm_batch
    n_pos = batch.tokens.shape[1]
    torch.testing.assert_close(
        attention.detect_head(cache, attention.next_token_target(n_pos), attention_mask=batch.attention_mask),
        attention.next_token_scores(cache, batch.attention_mask),
    )
    _, decoder_cache = small_model.run_with_cache(torch.tensor([[1, 2, 3, 1, 2, 3]]))
    with pytest.raises(ValueError, match="causal attention"):
        attention.next_token_scores(decoder_cache)
    with pytest.raises(ValueError, match="causal attention"):
        attention.detect_head(decoder_cache, attention.next_token_target(6))
    with pytest.raises(ValueError, match="causal attention"):
        attention.duplicate_token_scores(decoder_cache, torch.tensor([[1, 2, 3, 1, 2, 3]]), bidirectional=True)


@pytest.mark.parametrize(
    "mask, error, match",
    [
        (torch.ones(3, 4, dtype=torch.long), ValueError, "shape"),
        ("float", TypeError, "integer or bool"),
        ("twos", ValueError, "1 \\(real token\\) or 0"),
    ],
)
def test_bad_attention_masks_are_refused(minilm_batch, mask, error, match):
    _, batch, cache = minilm_batch
    if mask == "float":
        mask = batch.attention_mask.float()
    elif mask == "twos":
        mask = batch.attention_mask * 2
    with pytest.raises(error, match=match):
        attention.previous_token_scores(cache, mask)


def test_encoder_tokens_carry_their_own_mask(minilm_batch):
    _, batch, cache = minilm_batch
    with pytest.raises(ValueError, match="its own attention_mask"):
        attention.induction_scores(cache, batch, attention_mask=batch.attention_mask)


# --- circuits -----------------------------------------------------------------------------------
def test_ov_circuit_of_an_encoder_without_mlm_head_reads_out_with_the_embeddings():
    model, _ = minilm(torch.float32)
    with pytest.raises(ValueError, match="read_out='embed'"):
        circuits.full_ov_circuit(model, 2, 5)
    ids = model.to_tokens("the cat sat on the mat")[0].unique()
    W_E = model.W_E[ids]
    dense_ov = W_E @ model.W_V[2, 5] @ model.W_O[2, 5] @ W_E.T
    ov = circuits.circuit_on_tokens(circuits.full_ov_circuit(model, 2, 5, read_out="embed"), ids, ids)
    torch.testing.assert_close(ov, dense_ov, atol=1e-4, rtol=1e-4)
    dense_qk = W_E @ model.W_Q[2, 5] @ model.W_K[2, 5].T @ W_E.T
    torch.testing.assert_close(
        circuits.circuit_on_tokens(circuits.full_qk_circuit(model, 2, 5), ids, ids), dense_qk, atol=1e-4, rtol=1e-4
    )
    with pytest.raises(ValueError, match="read_out must be one of"):
        circuits.full_ov_circuit(model, 2, 5, read_out="logits")


def test_ov_circuit_and_copying_of_an_mlm_encoder_use_its_decoder():
    model, hf = random_mlm()
    W_U = hf.cls.predictions.decoder.weight.T  # HF's own MLM decoder [d_model, d_vocab]
    dense = model.W_E @ model.W_V[1, 2] @ model.W_O[1, 2] @ W_U
    torch.testing.assert_close(circuits.full_ov_circuit(model, 1, 2).AB, dense)
    # copying score from the eigenvalues of the dense d_vocab x d_vocab circuit
    eigenvalues = torch.linalg.eigvals(dense)
    expected = eigenvalues.real.sum() / eigenvalues.abs().sum()
    torch.testing.assert_close(circuits.copying_scores(model, 1, 2), expected, atol=1e-8, rtol=1e-6)


# --- neurons and patching -----------------------------------------------------------------------
def test_neuron_tools_on_an_encoder(minilm_batch):
    model, batch, _ = minilm_batch
    _, cache = model.run_with_cache(batch, names_filter=neurons.post_hook_names(model))
    torch.testing.assert_close(neurons.neuron_activations(cache, 3, 17), cache["post", 3][..., 17])
    summary = neurons.neuron_summary(cache, "max")
    assert summary.shape == (model.cfg.n_layers, model.cfg.d_mlp)
    torch.testing.assert_close(summary[4], cache["post", 4].flatten(0, 1).max(dim=0).values)
    with pytest.raises(TypeError, match="encoder_direct_attribution"):
        neurons.neuron_logit_effect(model, 0, 0)


def test_patching_is_for_decoders_only():
    model, _ = random_mlm()
    tokens = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(TypeError, match="DemoTransformer"):
        patching.patch_residual(model, tokens, tokens, lambda output: output.sum(), progress=False)

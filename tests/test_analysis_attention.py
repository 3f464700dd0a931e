"""Attention patterns, entropy and head detectors, checked on hand-built heads and loop references."""

import math

import pytest
import torch

from analysis.readouts import attention
from interp_transformer import ActivationCache, DemoTransformer, TransformerConfig

# Hand-built model: one-hot subspaces of the residual stream.
D_VOCAB, N_CTX, D_HEAD = 10, 16, 32
TOKEN, POSITION, PREVIOUS = 0, D_VOCAB, D_VOCAB + N_CTX  # first residual dimension of each subspace
PREV_HEAD, DUP_HEAD, INDUCTION_HEAD = (0, 1), (0, 2), (1, 1)  # (layer, head) of each planted head


def hand_built_model() -> DemoTransformer:
    """Two attention-only layers with three planted heads, every other weight zero.

    The residual stream holds a one-hot token (dims 0..9), a one-hot position (10..25)
    and, after layer 0, a one-hot "previous token" (26..35). LayerNorm sees the same
    number of hot entries at every position, so it only rescales uniformly.

    - L0H1 previous-token head: query position p matches key position p - 1 (via W_pos);
      its OV copies the key's token into the previous-token subspace.
    - L0H2 duplicate-token head: query token t matches key token t, and a negative
      position match stops it from attending to itself.
    - L1H1 induction head: query token t matches keys whose previous token is t.
    """
    cfg = TransformerConfig(
        d_model=3 * D_HEAD, n_layers=2, n_heads=3, d_head=D_HEAD, d_mlp=None, d_vocab=D_VOCAB, n_ctx=N_CTX
    )
    model = DemoTransformer(cfg, seed=0).eval()
    big = 4.0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith(".w"):
                param.zero_()
        model.embed.W_E[:, TOKEN : TOKEN + D_VOCAB] = torch.eye(D_VOCAB)
        model.pos_embed.W_pos[:, POSITION : POSITION + N_CTX] = torch.eye(N_CTX)
        prev = model.blocks[0].attn
        for p in range(N_CTX):
            prev.W_Q[PREV_HEAD[1], POSITION + p, p] = big
            if p + 1 < N_CTX:
                prev.W_K[PREV_HEAD[1], POSITION + p, p + 1] = 1.0  # key p answers query p + 1
        for t in range(D_VOCAB):
            prev.W_V[PREV_HEAD[1], TOKEN + t, t] = 1.0
            prev.W_O[PREV_HEAD[1], t, PREVIOUS + t] = 0.2
        dup = model.blocks[0].attn
        for t in range(D_VOCAB):
            dup.W_Q[DUP_HEAD[1], TOKEN + t, t] = big
            dup.W_K[DUP_HEAD[1], TOKEN + t, t] = 1.0
        for p in range(N_CTX):
            dup.W_Q[DUP_HEAD[1], POSITION + p, D_VOCAB + p] = -big
            dup.W_K[DUP_HEAD[1], POSITION + p, D_VOCAB + p] = 1.0
        induction = model.blocks[1].attn
        for t in range(D_VOCAB):
            induction.W_Q[INDUCTION_HEAD[1], TOKEN + t, t] = big
            induction.W_K[INDUCTION_HEAD[1], PREVIOUS + t, t] = 1.0
    return model


@pytest.fixture(scope="module")
def hand_model():
    return hand_built_model()


@pytest.fixture(scope="module")
def hand_run(hand_model):
    tokens = attention.repeated_random_tokens(hand_model, seq_len=7, batch=6, seed=3, bos=0)
    _, cache = hand_model.run_with_cache(tokens, names_filter=attention.pattern_hook_names(hand_model))
    return tokens, cache


def argmax_head(scores: torch.Tensor) -> tuple[int, int]:
    index = int(scores.argmax())
    return divmod(index, scores.shape[1])


def test_previous_token_detector_ranks_planted_head_first(hand_run):
    _, cache = hand_run
    scores = attention.previous_token_scores(cache)
    assert argmax_head(scores) == PREV_HEAD
    assert scores[PREV_HEAD] > 0.95
    others = scores.flatten()[torch.arange(scores.numel()) != PREV_HEAD[0] * 3 + PREV_HEAD[1]]
    assert others.max() < 0.5


def test_duplicate_token_detector_ranks_planted_head_first(hand_run):
    tokens, cache = hand_run
    scores = attention.duplicate_token_scores(cache, tokens)
    assert argmax_head(scores) == DUP_HEAD
    assert scores[DUP_HEAD] > 0.9


def test_induction_detector_ranks_planted_head_first(hand_model):
    scores = attention.induction_head_scores(hand_model, seq_len=7, batch=6, seed=0, bos=0)
    assert argmax_head(scores) == INDUCTION_HEAD
    assert scores[INDUCTION_HEAD] > 0.9
    assert scores[0].max() < 0.5  # layer 0 has no induction head


def test_random_model_scores_low(attn_only_model):
    tokens = attention.repeated_random_tokens(attn_only_model, seq_len=8, batch=4, seed=0, bos=0)
    _, cache = attn_only_model.run_with_cache(tokens)
    for scores in (
        attention.previous_token_scores(cache),
        attention.duplicate_token_scores(cache, tokens),
        attention.induction_scores(cache, tokens),
    ):
        assert scores.shape == (2, 4)
        assert scores.max() < 0.3


def synthetic_cache(model, patterns: list[torch.Tensor]) -> ActivationCache:
    return ActivationCache({f"blocks.{layer}.attn.hook_pattern": p for layer, p in enumerate(patterns)}, model)


def random_patterns(model, batch, n_pos, seed=0):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(n_pos, n_pos).tril().bool()
    patterns = []
    for _ in range(model.cfg.n_layers):
        scores = torch.randn(batch, model.cfg.n_heads, n_pos, n_pos, generator=generator) * 2
        patterns.append(scores.masked_fill(~mask, float("-inf")).softmax(-1))
    return patterns


def test_detect_head_matches_loop_reference(attn_only_model):
    batch, n_pos = 2, 6
    patterns = random_patterns(attn_only_model, batch, n_pos)
    cache = synthetic_cache(attn_only_model, patterns)
    target = (torch.rand(batch, n_pos, n_pos, generator=torch.Generator().manual_seed(1)) > 0.6).float().tril()
    target[:, 2] = 0  # one query row without targets: left out of the mean
    scores = attention.detect_head(cache, target)
    for layer, pattern in enumerate(patterns):
        for head in range(attn_only_model.cfg.n_heads):
            masses = [
                sum(float(pattern[b, head, q, k]) for k in range(n_pos) if target[b, q, k])
                for b in range(batch)
                for q in range(n_pos)
                if target[b, q].sum() > 0
            ]
            assert scores[layer, head] == pytest.approx(sum(masses) / len(masses), abs=1e-6)


def test_detect_head_perfect_and_exclusions(attn_only_model):
    n_pos = 5
    target = attention.previous_token_target(n_pos)
    perfect = target.clone()
    perfect[0, 0] = 1.0  # query 0 can only attend to itself
    cache = synthetic_cache(attn_only_model, [perfect.expand(1, 4, n_pos, n_pos)] * 2)
    assert torch.allclose(attention.detect_head(cache, target), torch.ones(2, 4))
    assert torch.allclose(attention.previous_token_scores(cache), torch.ones(2, 4))
    # excluding BOS drops query 1's only target (key 0): mean over queries 2..4 stays 1
    assert torch.allclose(attention.detect_head(cache, target, exclude_bos=True), torch.ones(2, 4))
    with pytest.raises(ValueError, match="marks no position"):
        attention.detect_head(cache, torch.eye(n_pos), exclude_current_token=True)


def test_target_patterns_match_definitions():
    tokens = torch.tensor([[5, 3, 5, 3, 7, 5]])
    duplicate = attention.duplicate_token_target(tokens)[0]
    induction = attention.induction_target(tokens)[0]
    for q in range(6):
        for k in range(6):
            assert duplicate[q, k] == float(k < q and tokens[0, k] == tokens[0, q])
            assert induction[q, k] == float(1 <= k <= q and tokens[0, k - 1] == tokens[0, q])


def test_attention_entropy_matches_reference(attn_only_model):
    patterns = random_patterns(attn_only_model, batch=2, n_pos=5, seed=2)
    cache = synthetic_cache(attn_only_model, patterns)
    entropy = attention.attention_entropy(cache)
    per_position = attention.attention_entropy(cache, per_position=True)
    for layer, pattern in enumerate(patterns):
        for head in range(4):
            values = [
                -sum(p * math.log(p) for p in pattern[b, head, q].tolist() if p > 0) for b in range(2) for q in range(5)
            ]
            assert entropy[layer, head] == pytest.approx(sum(values) / len(values), abs=1e-5)
            assert per_position[layer, head, 3] == pytest.approx((values[3] + values[8]) / 2, abs=1e-5)
    uniform = torch.ones(1, 4, 3, 3).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)
    expected = (0 + math.log(2) + math.log(3)) / 3
    assert torch.allclose(
        attention.attention_entropy(synthetic_cache(attn_only_model, [uniform] * 2)), torch.full((2, 4), expected)
    )


def test_attention_pattern_reads_the_cache(small_model, tokens):
    _, cache = small_model.run_with_cache(tokens)
    assert torch.equal(attention.attention_pattern(cache, -1), cache["pattern", 1])
    assert torch.equal(attention.attention_pattern(cache, 0, head=2), cache["pattern", 0][:, 2])
    _, single = small_model.run_with_cache(tokens[:1], remove_batch_dim=True)
    assert attention.attention_pattern(single, 0, 1).shape == (1, 12, 12)


def test_repeated_random_tokens_reproducible(small_model):
    a = attention.repeated_random_tokens(small_model, seq_len=6, batch=3, seed=7, bos=5)
    b = attention.repeated_random_tokens(small_model, seq_len=6, batch=3, seed=7, bos=5)
    c = attention.repeated_random_tokens(small_model, seq_len=6, batch=3, seed=8, bos=5)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (3, 13)
    assert (a[:, 0] == 5).all() and not (a[:, 1:] == 5).any()
    assert torch.equal(a[:, 1:7], a[:, 7:])
    assert attention.repeated_random_tokens(small_model, seq_len=4, batch=2).shape == (2, 8)
    with pytest.raises(ValueError, match="n_ctx"):
        attention.repeated_random_tokens(small_model, seq_len=16, bos=0)
    with pytest.raises(ValueError, match="bos"):
        attention.repeated_random_tokens(small_model, seq_len=4, bos=97)


def test_bad_input(small_model, tokens):
    _, cache = small_model.run_with_cache(tokens)
    with pytest.raises(ValueError, match="layer=2 is out of range"):
        attention.attention_pattern(cache, 2)
    with pytest.raises(ValueError, match="head=4 is out of range"):
        attention.attention_pattern(cache, 0, head=4)
    _, partial = small_model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern"])
    with pytest.raises(KeyError, match=r"blocks\.1\.attn\.hook_pattern.*names_filter="):
        attention.previous_token_scores(partial)
    with pytest.raises(ValueError, match="pass the tokens the cache was computed on"):
        attention.induction_scores(cache, tokens[:, :5])
    with pytest.raises(ValueError, match="key_pos > query_pos"):
        attention.detect_head(cache, torch.ones(12, 12))
    with pytest.raises(ValueError, match="shape"):
        attention.detect_head(cache, torch.eye(5))
    with pytest.raises(TypeError, match="ActivationCache"):
        attention.attention_entropy({"blocks.0.attn.hook_pattern": torch.ones(1)})

"""Ported from TransformerLens v3.5.1, tests/unit/utilities/test_logits_utils.py: the sample_logits tests (MIT License,
see LICENSE-TransformerLens).

Changed: imports.
Skipped: the repetition-penalty test (repetition_penalty is an addition of TransformerLens 3, not the classic API).
Not ported: TestLogitsToDf and TestApplyRepetitionPenalty (TransformerLens 3 additions: logits_to_df and a private
helper).
"""

import pytest
import torch

from interp_transformer.compat.utils import sample_logits


class TestSampleLogitsTopK:
    def test_top_k_larger_than_vocab_does_not_crash(self):
        # Regression test: before clamping top_k, final_logits.topk(top_k)
        # raised "selected index k out of range" when top_k > vocab size.
        out = sample_logits(torch.randn(1, 3), top_k=10)
        assert out.shape == (1,)
        assert 0 <= out.item() < 3

    def test_top_k_larger_than_vocab_batched(self):
        out = sample_logits(torch.randn(4, 5), top_k=8)
        assert out.shape == (4,)
        assert torch.all((out >= 0) & (out < 5))

    def test_top_k_equal_to_vocab(self):
        out = sample_logits(torch.randn(1, 4), top_k=4)
        assert out.shape == (1,)
        assert 0 <= out.item() < 4

    def test_top_k_restricts_to_dominant_token(self):
        # With top_k=1 only the argmax token is ever sampled.
        logits = torch.tensor([[0.0, 100.0, 0.0, 0.0]])
        outs = [sample_logits(logits, top_k=1).item() for _ in range(20)]
        assert set(outs) == {1}

    def test_top_k_rejects_non_positive(self):
        with pytest.raises(AssertionError):
            sample_logits(torch.randn(1, 4), top_k=0)


class TestSampleLogitsTemperature:
    def test_temperature_zero_is_greedy_argmax(self):
        logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
        out = sample_logits(logits, temperature=0.0)
        assert out.tolist() == [1]

    def test_temperature_zero_batched_argmax(self):
        logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]])
        out = sample_logits(logits, temperature=0.0)
        assert out.tolist() == [1, 0]

    @pytest.mark.skip(reason="repetition_penalty is an addition of TransformerLens 3, not the classic API")
    def test_temperature_zero_applies_repetition_penalty(self):
        # Token 1 is the argmax but has appeared, so the penalty should push
        # the greedy choice onto the next-best unseen token (token 2).
        logits = torch.tensor([[0.0, 10.0, 9.0, 0.0]])
        tokens = torch.tensor([[1]])
        out = sample_logits(logits, temperature=0.0, repetition_penalty=100.0, tokens=tokens)
        assert out.tolist() == [2]


class TestSampleLogitsTopP:
    def test_top_p_keeps_dominant_token(self):
        # One token holds essentially all the probability mass, so even a small
        # top_p must keep it and it is the only token ever sampled.
        logits = torch.tensor([[0.0, 50.0, 0.0, 0.0]])
        outs = [sample_logits(logits, top_p=0.5).item() for _ in range(20)]
        assert set(outs) == {1}

    def test_top_p_rejects_out_of_range(self):
        with pytest.raises(AssertionError):
            sample_logits(torch.randn(1, 4), top_p=0.0)
        with pytest.raises(AssertionError):
            sample_logits(torch.randn(1, 4), top_p=1.5)


class TestSampleLogitsFreqPenalty:
    def test_freq_penalty_suppresses_repeated_token(self):
        # Token 0 starts as the clear favourite, but appears many times in the
        # context; a large frequency penalty should make it never get sampled.
        logits = torch.tensor([[5.0, 4.0, 4.0, 4.0]])
        tokens = torch.zeros((1, 50), dtype=torch.long)  # token 0 repeated 50x
        outs = [sample_logits(logits, freq_penalty=10.0, tokens=tokens).item() for _ in range(50)]
        assert 0 not in outs

    def test_freq_penalty_requires_tokens(self):
        with pytest.raises(AssertionError):
            sample_logits(torch.randn(1, 4), freq_penalty=1.0)

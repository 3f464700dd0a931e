"""The shipped induction-2l model, judged by the project's own analysis tools (no hard-coded heads)."""

import pytest
import torch

from analysis.readouts.attention import induction_scores, previous_token_scores, repeated_random_tokens
from interp_transformer.pretrained import load_induction_model, load_shipped_metadata
from interp_transformer.pretrained.induction import BOS_TOKEN, half_losses, train_induction_model

SEQ_LEN = 15


def head_scores(model):
    tokens = repeated_random_tokens(model, SEQ_LEN, batch=16, seed=123, bos=BOS_TOKEN)
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    return tokens, induction_scores(cache, tokens), previous_token_scores(cache)


def top_head(scores):
    index = int(scores.flatten().argmax())
    return divmod(index, scores.shape[1])


@pytest.fixture(scope="module")
def shipped():
    return load_induction_model()


def test_shipped_model_has_an_induction_circuit(shipped):
    tokens, induction, previous = head_scores(shipped)
    ind_layer, _ = top_head(induction)
    prev_layer, _ = top_head(previous)
    assert induction.max() > 0.5, f"best induction score {induction.max():.2f}"
    assert previous[:ind_layer].max() > 0.4, f"no previous-token head before layer {ind_layer}: {previous}"
    assert prev_layer < ind_layer
    with torch.no_grad():
        first, repeated = half_losses(shipped, tokens, SEQ_LEN)
    assert repeated < 0.25 * first, f"repeated-half loss {repeated:.3f} vs first-half {first:.3f}"


def test_a_random_model_of_the_same_shape_has_no_circuit(shipped):
    from interp_transformer import DemoTransformer

    _, induction, _ = head_scores(DemoTransformer(shipped.cfg, seed=0).eval())
    assert induction.max() < 0.3


def test_retraining_with_the_recorded_settings_reproduces_the_behaviour(shipped):
    settings = load_shipped_metadata("induction-2l")["training"]
    retrained = train_induction_model(**settings, progress=False).model
    _, ind_a, prev_a = head_scores(shipped)
    _, ind_b, prev_b = head_scores(retrained)
    assert top_head(ind_a) == top_head(ind_b)
    assert top_head(prev_a) == top_head(prev_b)
    torch.testing.assert_close(ind_a, ind_b, atol=0.05, rtol=0)
    torch.testing.assert_close(prev_a, prev_b, atol=0.05, rtol=0)

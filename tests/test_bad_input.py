"""Bad input gets a clear error naming what was expected and what came (DESIGN section 7)."""

import pytest
import torch

from interp_transformer import TransformerConfig, preset

from .test_components import single_thread  # noqa: F401
from .test_hooks import assert_no_hooks


@pytest.mark.parametrize("bad_id", [-1, 97, 10_000])
def test_token_ids_outside_the_vocabulary(small_model, tokens, bad_id):
    bad = tokens.clone()
    bad[1, 3] = bad_id
    with pytest.raises(ValueError, match=rf"\[0, d_vocab=97\).*{bad_id}"):
        small_model(bad)


def test_largest_valid_token_id_is_accepted(small_model):
    small_model(torch.tensor([[0, 96]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_non_integer_tokens(small_model, tokens, dtype):
    with pytest.raises(TypeError, match="integer"):
        small_model(tokens.to(dtype))


def test_non_tensor_tokens(small_model):
    with pytest.raises(TypeError, match="Tensor"):
        small_model(3)


def test_1d_tokens_are_a_batch_of_one(small_model, tokens):
    one = small_model(tokens[0])
    assert one.shape == (1, tokens.shape[1], small_model.cfg.d_vocab)
    assert torch.equal(one, small_model(tokens[:1]))
    assert small_model(tokens[0].to(torch.int32)).dtype == torch.float32  # any integer dtype


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 1, 1, 4), ()])
def test_tokens_with_other_ranks(small_model, shape):
    with pytest.raises(ValueError, match=r"\[batch, pos\]"):
        small_model(torch.zeros(shape, dtype=torch.long))


@pytest.mark.parametrize("shape", [(0, 4), (2, 0)])
def test_empty_tokens(small_model, shape):
    with pytest.raises(ValueError, match="non-empty"):
        small_model(torch.zeros(shape, dtype=torch.long))


def test_sequence_longer_than_n_ctx(small_model):
    small_model(torch.zeros(1, 32, dtype=torch.long))  # exactly n_ctx is fine
    with pytest.raises(ValueError, match="33 tokens exceeds n_ctx=32"):
        small_model(torch.zeros(1, 33, dtype=torch.long))


def test_text_without_a_tokenizer(small_model):
    with pytest.raises(ValueError, match="no tokenizer"):
        small_model("Hello world")


def test_config_d_model_must_equal_n_heads_times_d_head():
    with pytest.raises(ValueError, match=r"d_model=768 must equal n_heads\*d_head=12\*32"):
        TransformerConfig(d_model=768, n_heads=12, d_head=32)


def test_unknown_hook_name(small_model, tokens):
    with pytest.raises(KeyError, match=r"blocks\.0\.hook_resid_post"):
        small_model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pots", lambda t, hook: None)])
    with pytest.raises(KeyError, match="closest"):
        small_model.add_hook("blocks.9.attn.hook_z", lambda t, hook: None)
    assert_no_hooks(small_model)


def test_hook_returning_wrong_shape(small_model, tokens):
    with pytest.raises(
        ValueError,
        match=r"blocks\.1\.mlp\.hook_post.*returned shape \(2, 12, 255\).*expected \(2, 12, "
        r"256\)",
    ):
        small_model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.mlp.hook_post", lambda t, hook: t[..., :-1])])
    assert_no_hooks(small_model)


def test_hook_that_raises_leaves_no_hook_behind(small_model, tokens):
    def broken(t, hook=None):
        raise ZeroDivisionError("broken hook")

    with pytest.raises(ZeroDivisionError):
        small_model.run_with_hooks(tokens, fwd_hooks=[(lambda name: "attn" in name, broken)])
    assert_no_hooks(small_model)
    with pytest.raises(ZeroDivisionError):
        small_model.run_with_cache(
            tokens, names_filter="blocks.0.attn.hook_pattern", incl_bwd=True, backward_metric=broken
        )
    assert_no_hooks(small_model)


def test_unknown_preset():
    with pytest.raises(KeyError, match=r"gpt2-medium"):
        preset("gpt2-meduim")

"""``loading.reference``: the one recorder every family's Hugging Face reference uses, and how it runs a model."""

import pytest
import torch
import torch.nn.functional as F

from interp_transformer.families.reference import (
    FLOAT64_ATTENTION,
    Recorder,
    current_attention,
    eager_attention_in_input_dtype,
    forward_patch,
    norm_scale,
    patched,
    reference_run,
    run_reference,
)

from .llama_helpers import tiny_hf_model

pytestmark = pytest.mark.hf_parity


def tiny_llama(dtype=torch.float64):
    """A small Hugging Face Llama (grouped keys and values) that runs SDPA attention outside a reference run."""
    hf_model = tiny_hf_model("llama-gqa3-tied-llama3").to(dtype)
    hf_model.set_attn_implementation("sdpa")
    return hf_model


def test_norm_scale_is_layer_norms_or_rms_norms_by_argument():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    layer = norm_scale(x, 1e-5, centred=True)
    rms = norm_scale(x, 1e-5, centred=False)
    torch.testing.assert_close((x - x.mean(-1, keepdim=True)) / layer, F.layer_norm(x, (8,), eps=1e-5))
    torch.testing.assert_close(x / rms, F.rms_norm(x, (8,), eps=1e-5))
    in_float32 = norm_scale(x, 1e-5, centred=False, mean_square_dtype=torch.float32)
    assert in_float32.dtype == torch.float64 and in_float32.shape == (2, 5, 1)
    assert torch.equal(in_float32, 1.0 / torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).double())


def test_eager_attention_repeats_key_value_groups_and_keeps_the_input_dtype():
    query, key, value = (torch.randn(2, heads, 5, 4, dtype=torch.float64) for heads in (4, 2, 2))
    mask = torch.zeros(5, 5, dtype=torch.float64).masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
    z, pattern = eager_attention_in_input_dtype(None, query, key, value, mask, scaling=0.5)
    expected = F.scaled_dot_product_attention(
        query, key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1), attn_mask=mask, scale=0.5
    )
    assert z.dtype == pattern.dtype == torch.float64
    torch.testing.assert_close(z, expected.transpose(1, 2), atol=1e-12, rtol=0)


def test_patches_are_restored_also_on_error():
    linear = torch.nn.Linear(2, 2)
    linear.register_buffer("factor", torch.ones(1))
    with (
        pytest.raises(RuntimeError),
        forward_patch(linear, lambda self, x: x),
        patched(linear, "factor", torch.zeros(1)),
    ):
        assert torch.equal(linear(torch.ones(2)), torch.ones(2)) and linear.factor.item() == 0
        raise RuntimeError
    assert "forward" not in vars(linear) and linear.factor.item() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_reference_run_is_eager_in_eval_mode_and_restores_the_model(dtype):
    hf_model = tiny_llama(dtype).train()
    seen = {}
    with reference_run(hf_model):
        seen.update(attention=current_attention(hf_model), training=hf_model.training, grad=torch.is_grad_enabled())
    assert seen == {
        "attention": FLOAT64_ATTENTION if dtype == torch.float64 else "eager",
        "training": False,
        "grad": False,
    }
    assert current_attention(hf_model) == "sdpa" and hf_model.training


def test_the_recorder_removes_its_hooks_also_after_a_failed_run():
    hf_model = tiny_llama()
    rec = Recorder()
    rec.norm(hf_model.model.norm, "ln_final.", centred=False)
    acts = run_reference(hf_model, rec, {"input_ids": torch.tensor([[1, 2, 3]])})
    assert set(acts) == {"ln_final.hook_scale", "ln_final.hook_normalized", "logits"} and not rec.handles
    rec.kwargs(hf_model.model.norm, lambda kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_reference(hf_model, rec, {"input_ids": torch.tensor([[1, 2, 3]])})
    assert not rec.handles and not hf_model.model.norm._forward_pre_hooks
    assert current_attention(hf_model) == "sdpa"

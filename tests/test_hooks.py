"""Hooks: reading and replacing activations and gradients, adding and removing hooks, no leaks."""

import copy

import pytest
import torch

from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.core.losses import lm_loss

from .test_components import random_tokens, randomize, single_thread  # noqa: F401


def assert_no_hooks(model) -> None:
    """No hook point holds a hook, at our level or at torch's."""
    for name, hook_point in model.hook_dict.items():
        assert not hook_point.has_hooks() and not hook_point._hooks, name
        assert not hook_point._forward_hooks and not hook_point._backward_hooks, name
        assert not hook_point._forward_pre_hooks, name


@pytest.fixture
def model():
    """A fresh model per test: these tests add permanent hooks and edit weights."""
    cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=53, n_ctx=16)
    return randomize(DemoTransformer(cfg, seed=0), seed=1).eval()


@pytest.fixture
def toks(model):
    return random_tokens(model.cfg, 2, 10, seed=2)


# --- reading and replacing activations --------------------------------------------------------
def test_noop_hook_leaves_logits_bit_identical(model, toks):
    baseline = model(toks)
    for name in model.hook_dict:
        # observing a LayerNorm's scale selects its explicit path: the bitwise reference is a run with its fused path
        # off; observing the scores or the pattern keeps the fast kernels but forms the scores (no fused softmax), which
        # no switch selects: the reference is then the other no-op hook, and the baseline to float32 rounding
        module_name, hook_name = name.rsplit(".", 1) if "." in name else ("", name)
        observed = model.get_submodule(module_name) if hook_name == "hook_scale" else None
        if observed is not None:
            observed.use_fused_layer_norm = False
        expected = model(toks)
        if observed is not None:
            observed.use_fused_layer_norm = True
        elif hook_name in ("hook_attn_scores", "hook_pattern"):
            expected = model.run_with_hooks(toks, fwd_hooks=[(name, lambda t, hook: None)])
            torch.testing.assert_close(expected, baseline, rtol=0, atol=1e-5)
        else:
            assert torch.equal(expected, baseline)
        for noop in (lambda t, hook: None, lambda t, hook: t.clone()):
            assert torch.equal(model.run_with_hooks(toks, fwd_hooks=[(name, noop)]), expected), name
    assert_no_hooks(model)


def test_zero_ablating_a_head_equals_zeroing_its_W_O(model, toks):
    layer, head = 1, 2

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, head] = 0.0
        return z

    ablated = model.run_with_hooks(toks, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)])
    reference_model = copy.deepcopy(model)
    with torch.no_grad():
        reference_model.blocks[layer].attn.W_O[head] = 0.0  # b_O stays: it belongs to no head
    assert reference_model.blocks[layer].attn.b_O.abs().sum() > 0
    torch.testing.assert_close(ablated, reference_model(toks), rtol=0, atol=1e-6)
    assert (ablated - model(toks)).abs().max() > 1e-3  # the ablation did something
    assert_no_hooks(model)


def test_replacing_an_activation_propagates(model, toks):
    """Replacing resid_pre of block 1 with another run's makes the rest of that run's output."""
    other = random_tokens(model.cfg, 2, 10, seed=9)
    _, other_cache = model.run_with_cache(other, names_filter="blocks.1.hook_resid_pre")
    patched = model.run_with_hooks(
        toks, fwd_hooks=[("blocks.1.hook_resid_pre", lambda t, hook: other_cache["resid_pre", 1])]
    )
    torch.testing.assert_close(patched, model(other), rtol=0, atol=1e-6)


def test_hooks_by_string_predicate_list_and_attribute(model, toks):
    seen = []

    def record(t, hook):
        seen.append(hook.name)

    model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_attn_out", record)])
    assert seen == ["blocks.0.hook_attn_out"]
    seen.clear()
    model.run_with_hooks(toks, fwd_hooks=[(lambda name: name.endswith("hook_z"), record)])
    assert seen == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    seen.clear()
    model.run_with_hooks(
        toks, fwd_hooks=[("hook_embed", record), ("blocks.1.mlp.hook_post", record), ("ln_final.hook_scale", record)]
    )
    assert seen == ["hook_embed", "blocks.1.mlp.hook_post", "ln_final.hook_scale"]  # forward order
    seen.clear()
    model.run_with_hooks(toks, fwd_hooks=[(["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"], record)])
    assert seen == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    seen.clear()
    handle = model.blocks[1].attn.hook_pattern.add_hook(record)
    model(toks)
    handle.remove()
    model.blocks[1].attn.hook_pattern.remove_hook(handle)
    assert seen == ["blocks.1.attn.hook_pattern"]
    assert model.blocks[1].attn.hook_pattern is model.hook_dict["blocks.1.attn.hook_pattern"]
    assert_no_hooks(model)


def test_hook_receives_its_hook_point(model, toks):
    received = {}
    model.run_with_hooks(
        toks, fwd_hooks=[("blocks.0.ln2.hook_scale", lambda t, hook: received.update(hook=hook, shape=t.shape))]
    )
    assert received["hook"] is model.blocks[0].ln2.hook_scale
    assert received["shape"] == (2, 10, 1)


# --- adding and removing -----------------------------------------------------------------------
def test_add_hook_reset_hooks_and_permanent_hooks(model, toks):
    calls = []
    model.add_hook("blocks.0.hook_mlp_out", lambda t, hook: calls.append("temp"))
    model.add_hook("blocks.0.hook_mlp_out", lambda t, hook: calls.append("perm"), is_permanent=True)
    model.add_hook(lambda name: name.endswith("hook_scale"), lambda t, hook: calls.append("scale"))
    model(toks)
    assert calls == ["scale", "scale", "temp", "perm", "scale", "scale", "scale"]
    model.reset_hooks()
    calls.clear()
    model(toks)
    assert calls == ["perm"]  # permanent hooks survive reset_hooks()
    # and temporary hooks of a run_with_hooks call leave the permanent one alone
    model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_mlp_out", lambda t, hook: calls.append("run"))])
    model(toks)
    assert calls == ["perm", "perm", "run", "perm"]
    model.reset_hooks(including_permanent=True)
    calls.clear()
    model(toks)
    assert calls == []
    assert_no_hooks(model)


def test_reset_hooks_by_direction(model, toks):
    model.add_hook("blocks.0.hook_resid_mid", lambda t, hook: None)
    model.add_hook("blocks.0.hook_resid_mid", lambda t, hook: None, dir="bwd")
    model.reset_hooks(direction="fwd")
    hook_point = model.hook_dict["blocks.0.hook_resid_mid"]
    assert not hook_point.has_hooks("fwd") and hook_point.has_hooks("bwd")
    model.reset_hooks()
    assert_no_hooks(model)


def test_hooks_context_manager_removes_its_hooks(model, toks):
    model.add_hook("blocks.1.hook_resid_post", lambda t, hook: None, is_permanent=True)
    with model.hooks([("blocks.0.attn.hook_q", lambda t, hook: None)]):
        assert model.hook_dict["blocks.0.attn.hook_q"].has_hooks()
        model(toks)
    assert not model.hook_dict["blocks.0.attn.hook_q"].has_hooks()
    assert model.hook_dict["blocks.1.hook_resid_post"].has_hooks()  # not ours to remove
    model.reset_hooks(including_permanent=True)
    assert_no_hooks(model)


def test_hooks_are_removed_when_the_forward_raises(model, toks):
    def explode(t, hook):
        raise RuntimeError("boom")

    with (
        pytest.raises(RuntimeError, match="boom"),
        model.hooks([("blocks.0.hook_attn_out", lambda t, hook: None), ("blocks.1.attn.hook_pattern", explode)]),
    ):
        model(toks)
    assert_no_hooks(model)
    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(toks, fwd_hooks=[("hook_embed", lambda t, hook: None), ("blocks.1.mlp.hook_pre", explode)])
    assert_no_hooks(model)
    with pytest.raises(RuntimeError, match="boom"), model.hooks([("blocks.0.hook_resid_mid", explode)]):
        model.run_with_cache(toks)
    assert_no_hooks(model)
    assert model.blocks[1].attn.uses_fused_path()  # the pattern hook is gone, so is the explicit path
    torch.testing.assert_close(model(toks), model(toks))


def test_a_bad_hook_list_adds_nothing(model, toks):
    with (
        pytest.raises(KeyError),
        model.hooks(
            [("blocks.0.hook_attn_out", lambda t, hook: None), ("blocks.0.hook_atn_out", lambda t, hook: None)]
        ),
    ):
        pass
    assert_no_hooks(model)
    with pytest.raises(TypeError, match="pairs"):
        model.run_with_hooks(toks, fwd_hooks=["blocks.0.hook_attn_out"])
    assert_no_hooks(model)


def test_wrong_shape_replacement_raises_naming_the_hook(model, toks):
    def too_short(t, hook):
        return t[:, :-1]

    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.hook_v.*\(2, 9, 4, 8\).*\(2, 10, 4, 8\)"):
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_v", too_short)])
    assert_no_hooks(model)
    with pytest.raises(TypeError, match="blocks.0.attn.hook_v.*Tensor or None"):
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_v", lambda t, hook: t.tolist())])
    assert_no_hooks(model)
    with pytest.raises(TypeError, match="callable"):
        model.add_hook("hook_embed", "not a function")
    assert_no_hooks(model)


# --- backward hooks ------------------------------------------------------------------------------
def _activation_and_grad(model, toks, name):
    """Reference: the activation captured by a forward hook, and autograd's gradient of the loss."""
    captured = {}

    def keep(t, hook):
        t.retain_grad()
        captured["act"] = t

    with model.hooks([(name, keep)]):
        (autograd_grad,) = torch.autograd.grad(lm_loss(model(toks), toks), captured["act"])
        # separately, since autograd.grad also fills .grad of a tensor that retains it
        lm_loss(model(toks), toks).backward()
    model.zero_grad()
    torch.testing.assert_close(captured["act"].grad, autograd_grad, rtol=0, atol=0)
    return captured["act"].detach(), autograd_grad


@pytest.mark.parametrize(
    "name", ["blocks.0.attn.hook_pattern", "blocks.1.mlp.hook_post", "blocks.0.hook_resid_mid", "hook_embed"]
)
def test_backward_hook_sees_the_gradient(model, toks, name):
    _, expected = _activation_and_grad(model, toks, name)
    seen = []
    with model.hooks(bwd_hooks=[(name, lambda grad, hook: seen.append(grad.clone()))]):
        lm_loss(model(toks), toks).backward()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=1e-7)
    assert_no_hooks(model)
    # through run_with_hooks: the hook stays on that run's tensors until backward
    seen.clear()
    logits = model.run_with_hooks(toks, bwd_hooks=[(name, lambda grad, hook: seen.append(grad.clone()))])
    assert_no_hooks(model)
    lm_loss(logits, toks).backward()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=1e-7)
    # ... and never fires on another run
    lm_loss(model(toks), toks).backward()
    assert len(seen) == 1
    model.zero_grad()


def test_backward_hook_replacing_the_gradient_changes_upstream_grads(model, toks):
    def grads():
        g = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return g

    lm_loss(model(toks), toks).backward()
    baseline = grads()
    # everything before block 1 reaches the loss only through blocks.1.hook_resid_pre
    with model.hooks(bwd_hooks=[("blocks.1.hook_resid_pre", lambda grad, hook: 2 * grad)]):
        lm_loss(model(toks), toks).backward()
    doubled = grads()
    with model.hooks(bwd_hooks=[("blocks.1.hook_resid_pre", lambda grad, hook: torch.zeros_like(grad))]):
        lm_loss(model(toks), toks).backward()
    zeroed = grads()
    upstream = [name for name in baseline if name.startswith(("embed.", "pos_embed.", "blocks.0."))]
    downstream = [name for name in baseline if name not in upstream]
    assert upstream and downstream
    for name in upstream:
        torch.testing.assert_close(doubled[name], 2 * baseline[name], rtol=1e-5, atol=1e-8)
        assert name not in zeroed or torch.count_nonzero(zeroed[name]) == 0, name
    for name in downstream:
        torch.testing.assert_close(doubled[name], baseline[name], rtol=0, atol=0)
        torch.testing.assert_close(zeroed[name], baseline[name], rtol=0, atol=0)
    with (
        pytest.raises(ValueError, match="blocks.1.hook_resid_pre"),
        model.hooks(bwd_hooks=[("blocks.1.hook_resid_pre", lambda grad, hook: grad[:, :1])]),
    ):
        lm_loss(model(toks), toks).backward()
    model.zero_grad()
    assert_no_hooks(model)


def test_no_hook_left_after_runs(model, toks):
    model.run_with_hooks(
        toks,
        fwd_hooks=[(lambda name: True, lambda t, hook: None)],
        bwd_hooks=[(lambda name: True, lambda g, hook: None)],
    )
    model.run_with_cache(toks)
    model.run_with_cache(toks, incl_bwd=True)
    model.hook_shapes(1, 3)
    model.estimate_cache_bytes(1, 3)
    assert_no_hooks(model)

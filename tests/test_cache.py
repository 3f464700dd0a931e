"""run_with_cache and ActivationCache: what is stored, how it is addressed, residual-stream tools."""

import pytest
import torch
import torch.nn.functional as F

from interp_transformer import DemoTransformer, TransformerConfig, get_act_name
from interp_transformer.core.losses import lm_loss

from .test_components import random_tokens, randomize, single_thread  # noqa: F401
from .test_hooks import assert_no_hooks


@pytest.fixture(scope="module")
def model():
    cfg = TransformerConfig(d_model=32, n_layers=3, n_heads=4, d_head=8, d_mlp=64, d_vocab=53, n_ctx=16)
    return randomize(DemoTransformer(cfg, seed=0), seed=4).eval()


@pytest.fixture(scope="module")
def toks(model):
    return random_tokens(model.cfg, 2, 11, seed=5)


@pytest.fixture(scope="module")
def full(model, toks):
    return model.run_with_cache(toks)


# --- what gets stored ----------------------------------------------------------------------------
def test_names_filter_stores_exactly_what_was_asked(model, toks, full):
    _, everything = full
    assert list(everything.keys()) == list(model.hook_dict)
    cases = {
        "blocks.1.attn.hook_pattern": ["blocks.1.attn.hook_pattern"],
        "ln_final.hook_scale": ["ln_final.hook_scale"],
    }
    wanted = ["blocks.2.hook_resid_post", "hook_embed", "blocks.0.mlp.hook_post"]
    cases[tuple(wanted)] = ["hook_embed", "blocks.0.mlp.hook_post", "blocks.2.hook_resid_post"]  # forward order
    for filt, expected in cases.items():
        _, cache = model.run_with_cache(toks, names_filter=list(filt) if isinstance(filt, tuple) else filt)
        assert list(cache.keys()) == expected
    _, cache = model.run_with_cache(toks, names_filter=lambda name: name.endswith("hook_q"))
    assert list(cache.keys()) == [f"blocks.{l}.attn.hook_q" for l in range(3)]
    for name, value in cache.items():  # equal up to the fused/explicit attention paths' rounding
        torch.testing.assert_close(value, everything[name], rtol=0, atol=1e-6)
    assert_no_hooks(model)


def test_names_filter_errors(model, toks):
    with pytest.raises(KeyError, match="blocks.0.attn.hook_pattern"):
        model.run_with_cache(toks, names_filter="blocks.0.attn.hook_patern")
    with pytest.raises(KeyError, match="hook_resid_pre"):
        model.run_with_cache(toks, names_filter=["hook_embed", "blocks.0.hook_resid_pr"])
    with pytest.raises(ValueError, match="matched no hook"):
        model.run_with_cache(toks, names_filter=lambda name: name.startswith("transformer.h"))
    with pytest.raises(ValueError, match="empty"):
        model.run_with_cache(toks, names_filter=[])
    with pytest.raises(TypeError, match="names_filter"):
        model.run_with_cache(toks, names_filter=3)
    assert_no_hooks(model)


def test_device_and_dtype(model, toks, full):
    logits, everything = full
    _, cache = model.run_with_cache(toks, dtype=torch.bfloat16, device="cpu")
    assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in cache.values())
    for name, value in cache.items():
        assert torch.equal(value, everything[name].to(torch.bfloat16)), name
    as64 = everything.to(dtype=torch.float64)
    assert all(t.dtype == torch.float64 for t in as64.values())
    assert all(t.dtype == torch.float32 for t in everything.values())  # .to returns a copy
    torch.testing.assert_close(as64["pattern", 0], everything["pattern", 0].double(), rtol=0, atol=0)
    assert as64.to("cpu")["embed"].device.type == "cpu"


def test_remove_batch_dim(model, toks, full):
    one = toks[:1]
    _, batched = model.run_with_cache(one)
    _, cache = model.run_with_cache(one, remove_batch_dim=True)
    assert not cache.has_batch_dim
    for name, value in cache.items():
        assert value.shape == batched[name].shape[1:]
        assert torch.equal(value, batched[name][0])
    dropped = batched.remove_batch_dim()
    assert dropped is batched and not batched.has_batch_dim  # in place, as in TransformerLens
    assert all(torch.equal(batched[n], cache[n]) for n in cache)
    assert batched.remove_batch_dim() is batched and batched["embed"].ndim == 2  # a second call changes nothing
    with pytest.raises(ValueError, match="batch"):
        model.run_with_cache(toks, remove_batch_dim=True)
    untouched = full[1]["embed"]
    with pytest.raises(ValueError, match="batch size 1"):
        full[1].remove_batch_dim()
    assert full[1].has_batch_dim and full[1]["embed"] is untouched
    assert_no_hooks(model)


def test_stop_at_layer_caches_only_hooks_that_ran(model, toks, full):
    _, everything = full
    residual, cache = model.run_with_cache(toks, stop_at_layer=2)
    torch.testing.assert_close(residual, everything["resid_pre", 2], rtol=0, atol=0)
    ran = [
        n for n in model.hook_dict if n in ("hook_embed", "hook_pos_embed") or n.startswith(("blocks.0.", "blocks.1."))
    ]
    assert list(cache.keys()) == ran
    with pytest.raises(KeyError, match="not cached"):
        cache["resid_pre", 2]


def test_incl_bwd_caches_autograd_gradients(model, toks):
    names = ["hook_pos_embed", "blocks.0.attn.hook_pattern", "blocks.1.hook_resid_mid", "blocks.2.mlp.hook_post"]
    logits, cache = model.run_with_cache(toks, names_filter=names, incl_bwd=True)
    assert list(cache.keys()) == names + [n + "_grad" for n in names]
    assert not logits.requires_grad
    captured = {}

    def keep(t, hook):
        captured[hook.name] = t

    with model.hooks([(names, keep)]):
        grads = torch.autograd.grad(lm_loss(model(toks), toks), [captured[n] for n in names])
    for name, grad in zip(names, grads):
        torch.testing.assert_close(cache[name + "_grad"], grad, rtol=0, atol=1e-7)
        torch.testing.assert_close(cache[name], captured[name].detach(), rtol=0, atol=0)
    # a custom metric
    metric = lambda out: out[:, -1, 7].sum()  # noqa: E731
    _, cache = model.run_with_cache(toks, names_filter="hook_embed", incl_bwd=True, backward_metric=metric)
    with model.hooks([("hook_embed", keep)]):
        (grad,) = torch.autograd.grad(metric(model(toks)), captured["hook_embed"])
    torch.testing.assert_close(cache["hook_embed_grad"], grad, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="scalar"):
        model.run_with_cache(toks, names_filter="hook_embed", incl_bwd=True, backward_metric=lambda out: out.sum(-1))
    model.zero_grad()
    assert_no_hooks(model)


@pytest.mark.parametrize(
    "names_filter",
    [None, "blocks.1.attn.hook_pattern", ["hook_embed", "ln_final.hook_scale"], lambda name: "mlp" in name],
)
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float64])
def test_estimate_cache_bytes_is_exact(model, names_filter, dtype):
    for batch, pos in ((1, 1), (3, 7)):
        estimate = model.estimate_cache_bytes(batch, pos, names_filter=names_filter, dtype=dtype)
        _, cache = model.run_with_cache(random_tokens(model.cfg, batch, pos), names_filter=names_filter, dtype=dtype)
        assert estimate == cache.nbytes()
        assert cache.nbytes() == distinct_buffer_bytes(cache)
    assert_no_hooks(model)


def distinct_buffer_bytes(cache) -> int:
    """Bytes of the cache's buffers counted by address, each once; every buffer is exactly its tensor."""
    buffers = {}
    for name, t in cache.items():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), f"{name} keeps a larger buffer alive"
        buffers[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
    return sum(buffers.values())


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_buffer_seen_under_two_names_is_stored_once(model, toks, dtype):
    _, cache = model.run_with_cache(toks, dtype=dtype)
    for layer in range(model.cfg.n_layers - 1):
        post, pre = cache["resid_post", layer], cache["resid_pre", layer + 1]
        assert post.data_ptr() == pre.data_ptr() and post.dtype == (dtype or torch.float32)
    per_name = sum(t.numel() * t.element_size() for t in cache.values())
    resid_bytes = cache["resid_pre", 1].numel() * cache["resid_pre", 1].element_size()
    assert cache.nbytes() == per_name - (model.cfg.n_layers - 1) * resid_bytes


def test_a_view_of_a_larger_buffer_is_copied_not_kept_whole(model, toks):
    """A cached view must not keep its whole buffer alive (a hook may hand on a slice)."""
    d_model = model.cfg.d_model
    big = torch.randn(*toks.shape, 10 * d_model)
    model.add_hook("hook_embed", lambda t, hook: big[..., :d_model])
    try:
        _, cache = model.run_with_cache(toks, names_filter="hook_embed")
    finally:
        model.reset_hooks()
    kept = cache["embed"]
    assert torch.equal(kept, big[..., :d_model])
    assert cache.nbytes() == kept.numel() * 4 == big.numel() * 4 // 10
    assert model.estimate_cache_bytes(*toks.shape, names_filter="hook_embed") == cache.nbytes()
    assert_no_hooks(model)


@pytest.mark.parametrize(
    "options", [dict(remove_batch_dim=True), dict(device="cpu"), dict(device="cpu", dtype=torch.bfloat16)]
)
def test_estimate_is_exact_with_every_storage_option(model, options):
    tokens = random_tokens(model.cfg, 1, 9)
    _, cache = model.run_with_cache(tokens, **options)
    assert model.estimate_cache_bytes(1, 9, **options) == cache.nbytes() == distinct_buffer_bytes(cache)


# --- short keys ------------------------------------------------------------------------------------
def test_short_keys(model, full):
    _, cache = full
    n = model.cfg.n_layers
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["resid_pre", -1] is cache[f"blocks.{n - 1}.hook_resid_pre"]
    assert cache["resid_post", -n] is cache["blocks.0.hook_resid_post"]
    assert cache["normalized", 0, "ln1"] is cache["blocks.0.ln1.hook_normalized"]
    assert cache["scale", 2, "ln2"] is cache["blocks.2.ln2.hook_scale"]
    assert cache["scale"] is cache["ln_final.hook_scale"]
    assert cache[("scale",)] is cache["ln_final.hook_scale"]
    assert cache["normalized"] is cache["ln_final.hook_normalized"]
    assert cache["embed"] is cache["hook_embed"] and cache["pos_embed"] is cache["hook_pos_embed"]
    # TransformerLens aliases
    assert cache["attn", 1] is cache["pattern", 1]
    assert cache["attn_logits", 1] is cache["attn_scores", 1]
    assert cache["mlp_pre", 1] is cache["blocks.1.mlp.hook_pre"]
    assert cache["mlp_post", 1] is cache["blocks.1.mlp.hook_post"]
    assert ("pattern", 0) in cache and "blocks.0.attn.hook_z" in cache and ("patern", 0) not in cache
    assert len(cache) == len(model.hook_dict) and list(cache) == list(model.hook_dict)


def test_get_act_name_uses_transformer_lens_names():
    assert get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern"
    assert get_act_name("attn_scores", 3) == "blocks.3.attn.hook_attn_scores"
    assert get_act_name("resid_mid", 2) == "blocks.2.hook_resid_mid"
    assert get_act_name("post", 1) == "blocks.1.mlp.hook_post"
    assert get_act_name("normalized", 0, "ln2") == "blocks.0.ln2.hook_normalized"
    assert get_act_name("scale") == "ln_final.hook_scale"
    assert get_act_name("resid_pre", -1, n_layers=12) == "blocks.11.hook_resid_pre"


@pytest.mark.parametrize(
    "key, message",
    [
        (("patern", 0), "pattern"),
        (("resid_pr", 0), "resid_pre"),
        ("blocks.0.attn.hook_patern", "blocks.0.attn.hook_pattern"),
        (("pattern", 3), "out of range"),
        (("pattern", -4), "out of range"),
        (("scale", 0), "ln1"),
        (("pattern", 0, "ln1"), "no sub-layer"),
        (("scale", 0, "ln3"), "ln2"),
        (("pattern",), "needs a layer"),
        (("pattern", "0"), "int"),
        (("a", 1, 2, 3), "short_name"),
        (3, "hook name"),
    ],
)
def test_bad_cache_keys_raise_key_error_with_suggestions(full, key, message):
    _, cache = full
    with pytest.raises(KeyError, match=message):
        cache[key]


# --- residual-stream stacks ---------------------------------------------------------------------
def test_decompose_and_accumulate(model, full):
    _, cache = full
    close = dict(rtol=0, atol=1e-5)
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == [
        "embed",
        "pos_embed",
        "0_attn_out",
        "0_mlp_out",
        "1_attn_out",
        "1_mlp_out",
        "2_attn_out",
        "2_mlp_out",
    ]
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(cache.decompose_resid(layer).sum(0), cache["resid_pre", layer], **close)
    attn_only = cache.decompose_resid(mode="attn", incl_embeds=False)
    torch.testing.assert_close(attn_only, torch.stack([cache["attn_out", l] for l in range(3)]), rtol=0, atol=0)
    acc, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre", "2_mid", "final_post"]
    torch.testing.assert_close(acc[1], cache["resid_mid", 0], rtol=0, atol=0)
    torch.testing.assert_close(cache.accumulated_resid(1)[-1], cache["resid_pre", 1], rtol=0, atol=0)
    last = cache.accumulated_resid(pos_slice=-1)
    torch.testing.assert_close(last, cache.accumulated_resid()[:, :, -1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="mode"):
        cache.decompose_resid(mode="heads")
    with pytest.raises(ValueError, match="layer"):
        cache.accumulated_resid(7)
    with pytest.raises(ValueError, match="-1"):
        cache.accumulated_resid(-2)


def test_layer_minus_one_means_every_layer_through_the_final_one(model, full):
    """As in TransformerLens: -1 (and None) is n_layers, the final residual stream, not "the last block"."""
    _, cache = full
    n = model.cfg.n_layers
    for call in (cache.accumulated_resid, cache.decompose_resid, cache.stack_head_results, cache.stack_neuron_results):
        torch.testing.assert_close(call(-1), call(n), rtol=0, atol=0)
        torch.testing.assert_close(call(None), call(n), rtol=0, atol=0)
    stack, labels = cache.accumulated_resid(-1, return_labels=True)
    assert labels[-1] == "final_post" and len(labels) == n + 1
    torch.testing.assert_close(cache.decompose_resid(-1).sum(0), cache["resid_post", n - 1], rtol=0, atol=1e-5)
    assert cache.stack_head_results(-1).shape[0] == n * model.cfg.n_heads
    # apply_ln at -1 is the final norm, with its cached scale
    parts = cache.decompose_resid(-1)
    ln = model.ln_final
    by_hand = (parts - parts.mean(-1, keepdim=True)) / cache["scale"] * ln.w
    torch.testing.assert_close(cache.apply_ln_to_stack(parts, -1), by_hand, rtol=0, atol=0)
    torch.testing.assert_close(cache.decompose_resid(-1, apply_ln=True), by_hand, rtol=0, atol=0)


def test_stack_neuron_results_sum_to_mlp_out(model, full):
    _, cache = full
    for layer in range(model.cfg.n_layers):
        neurons = cache.stack_neuron_results(layer + 1)[layer * model.cfg.d_mlp :]
        torch.testing.assert_close(
            neurons.sum(0) + model.blocks[layer].mlp.b_out, cache["mlp_out", layer], rtol=0, atol=1e-5
        )
    some, labels = cache.stack_neuron_results(1, neuron_slice=[3, 5], return_labels=True)
    assert labels == ["L0N3", "L0N5"]
    torch.testing.assert_close(some[1], cache["post", 0][..., 5:6] * model.blocks[0].mlp.W_out[5], rtol=0, atol=1e-7)


def test_logit_lens_at_the_end_is_the_final_layer_norm(model, full):
    logits, cache = full
    resid = cache["resid_post", -1]
    ln = model.ln_final
    # at the final layer each entry is read by the whole final norm, its scale recomputed (the logit lens)
    lens = cache.accumulated_resid(apply_ln=True)
    torch.testing.assert_close(
        lens[-1], F.layer_norm(resid, (model.cfg.d_model,), ln.w, ln.b, model.cfg.layer_norm_eps), rtol=0, atol=1e-5
    )
    torch.testing.assert_close(lens[-1] @ model.W_U + model.b_U, logits, rtol=0, atol=1e-4)
    first = cache["resid_pre", 0]
    torch.testing.assert_close(
        lens[0], F.layer_norm(first, (model.cfg.d_model,), ln.w, ln.b, model.cfg.layer_norm_eps), rtol=0, atol=1e-5
    )
    # inside the model: the LayerNorm reading the residual at that layer (block 1's ln1)
    ln1 = model.blocks[1].ln1
    by_hand = F.layer_norm(cache["resid_pre", 1], (model.cfg.d_model,), ln1.w, ln1.b, model.cfg.layer_norm_eps) - ln1.b
    torch.testing.assert_close(cache.accumulated_resid(1, apply_ln=True)[-1], by_hand, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pos_slice", [None, -1])
def test_direct_logit_attribution_sums_to_the_logit(model, toks, full, pos_slice):
    logits, cache = full
    stack = cache.decompose_resid(pos_slice=pos_slice)  # logit_attrs reads it through the final norm itself
    target = toks[:, -1] if pos_slice == -1 else toks  # any token per (batch, pos)
    attrs = cache.logit_attrs(stack, target, pos_slice=pos_slice)
    W_U, b_U, b = model.W_U, model.b_U, model.ln_final.b
    rebuilt = attrs.sum(0) + (b @ W_U)[target] + b_U[target]
    chosen = logits[:, -1] if pos_slice == -1 else logits
    expected = chosen.gather(-1, target[..., None])[..., 0]
    torch.testing.assert_close(rebuilt, expected, rtol=0, atol=1e-4)
    # a logit difference: the constant parts cancel
    diff = cache.logit_attrs(stack, target, incorrect_tokens=torch.zeros_like(target), pos_slice=pos_slice).sum(0)
    expected_diff = expected - chosen[..., 0] - ((b @ W_U)[target] - (b @ W_U)[0]) - (b_U[target] - b_U[0])
    torch.testing.assert_close(diff, expected_diff, rtol=0, atol=1e-4)
    # per-head results through the same frozen LayerNorm, for a single token
    heads = cache.stack_head_results(pos_slice=-1)
    assert cache.logit_attrs(heads, 3, pos_slice=-1).shape == (model.cfg.n_layers * model.cfg.n_heads, toks.shape[0])
    # the same number as reading the stack through apply_ln_to_stack and dotting by hand
    normalized = cache.apply_ln_to_stack(heads, -1, pos_slice=-1)
    torch.testing.assert_close(
        cache.logit_attrs(heads, 3, pos_slice=-1), normalized @ model.W_U[:, 3], rtol=0, atol=1e-6
    )
    # one batch row, with and without the stack's batch axis
    one = cache.logit_attrs(heads[:, 1], 3, pos_slice=-1, batch_slice=1, has_batch_dim=False)
    torch.testing.assert_close(one, (normalized @ model.W_U[:, 3])[:, 1], rtol=0, atol=1e-6)


def test_apply_ln_to_stack_is_additive(model, full):
    _, cache = full
    parts = cache.decompose_resid(layer=2)
    total = cache.apply_ln_to_stack(parts, layer=2, mlp_input=False).sum(0)
    ln1 = model.blocks[2].ln1
    by_hand = F.layer_norm(cache["resid_pre", 2], (model.cfg.d_model,), ln1.w, ln1.b, model.cfg.layer_norm_eps) - ln1.b
    torch.testing.assert_close(total, by_hand, rtol=0, atol=1e-5)
    mid_parts = torch.cat([parts, cache["attn_out", 2][None]])
    total = cache.apply_ln_to_stack(mid_parts, layer=2, mlp_input=True).sum(0)
    torch.testing.assert_close(total + model.blocks[2].ln2.b, cache["normalized", 2, "ln2"], rtol=0, atol=1e-5)


def test_names_filter_keeps_nothing_else_alive(model, toks):
    """After a filtered run, the memory of every activation outside the filter has been freed."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    seen: dict[str, StorageWeakRef] = {}

    def watch(tensor, hook):
        seen[hook.name] = StorageWeakRef(tensor.untyped_storage())  # expires when the buffer is freed

    kept_names = ["blocks.1.attn.hook_pattern", "blocks.2.hook_resid_post"]
    with model.hooks([(lambda name: True, watch)]):
        logits, cache = model.run_with_cache(toks, names_filter=kept_names)
    del logits  # its autograd graph holds what backward would need, as any PyTorch output does
    gc.collect()
    alive = sorted(name for name, ref in seen.items() if not ref.expired())
    assert len(seen) == len(model.hook_dict)
    # hook_pos_embed is a tensor of its own (not a view of W_pos), freed like every other activation
    assert alive == sorted(kept_names), alive
    assert list(cache.keys()) == kept_names

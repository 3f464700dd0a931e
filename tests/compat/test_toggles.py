"""TransformerLens' toggles add hook points and change no value: bit for bit while nothing edits them, and edits flow
on."""

import einops
import pytest
import torch

from interp_transformer import HookedTransformer, HookedTransformerConfig

TOGGLES = ("set_use_attn_result", "set_use_split_qkv_input", "set_use_attn_in", "set_use_hook_mlp_in")
ADDED = {
    "set_use_attn_result": ["attn.hook_result"],
    "set_use_split_qkv_input": ["hook_q_input", "hook_k_input", "hook_v_input"],
    "set_use_attn_in": ["hook_attn_in"],
    "set_use_hook_mlp_in": ["hook_mlp_in"],
}


def make_model(seed: int = 0, **overrides) -> HookedTransformer:
    settings = dict(n_layers=2, d_model=32, d_head=8, n_ctx=16, d_vocab=40, act_fn="gelu_new", seed=seed)
    settings.update(overrides)
    model = HookedTransformer(HookedTransformerConfig(**settings))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # biases and norm weights too
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("toggle", TOGGLES)
def test_a_toggle_adds_its_hooks_and_changes_no_value(toggle, tokens):
    model = make_model()
    logits, before = model.run_with_cache(tokens)
    getattr(model, toggle)(True)
    after_logits, after = model.run_with_cache(tokens)
    assert torch.equal(after_logits, logits)
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    added = [name for name in after if name not in before]
    assert added == [f"blocks.{layer}.{hook}" for layer in range(2) for hook in ADDED[toggle]]
    for name in added:
        value = after[name]
        if "result" in name:
            layer = int(name.split(".")[1])
            expected = einops.einsum(before["z", layer], model.W_O[layer], "b p h d, h d m -> b p h m")
            torch.testing.assert_close(value, expected, rtol=0, atol=1e-6)
            torch.testing.assert_close(value.sum(2) + model.b_O[layer], before["attn_out", layer], rtol=0, atol=1e-5)
        elif "mlp_in" in name:
            assert torch.equal(value, before["resid_mid", int(name.split(".")[1])])
        else:  # the residual stream entering the block, once per head: the same stream seen by every hook
            stream = before["resid_pre", int(name.split(".")[1])]
            assert torch.equal(value, einops.repeat(stream, "b p m -> b p h m", h=model.cfg.n_heads))
    getattr(model, toggle)(False)
    assert all(not any(hook in name for hook in ADDED[toggle]) for name in model.hook_dict)
    assert torch.equal(model(tokens), logits)


def test_toggles_keep_the_parameters_and_the_hooks_already_attached(tokens):
    model = make_model()
    params = dict(model.named_parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    model.add_hook("blocks.0.attn.hook_z", lambda z, hook: seen.append(hook.name), is_permanent=True)
    model.add_hook("blocks.1.hook_resid_pre", lambda x, hook: seen.append(hook.name))
    for toggle in TOGGLES:
        getattr(model, toggle)(True)
    assert {name: p for name, p in model.named_parameters()} == params  # the same Parameter objects
    model(tokens)
    assert seen == ["blocks.0.attn.hook_z", "blocks.1.hook_resid_pre"]
    model(tokens).sum().backward()  # the optimizer still trains the model's weights
    before = model.W_Q.detach().clone()
    optimizer.step()
    assert not torch.equal(model.W_Q, before)
    for toggle in TOGGLES:
        getattr(model, toggle)(False)
    model.reset_hooks(including_permanent=True)
    assert model.cfg.use_attn_result is False and model.cfg.use_split_qkv_input is False


def test_editing_one_heads_query_input_changes_only_that_heads_query(tokens):
    model = make_model()
    model.set_use_split_qkv_input(True)
    _, clean = model.run_with_cache(tokens)
    noise = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(0))

    def edit(q_input, hook):
        q_input[:, :, 2] += noise  # in place, on head 2's copy only
        return q_input

    with model.hooks([("blocks.1.hook_q_input", edit)]):
        _, edited = model.run_with_cache(tokens)
    q_clean, q_edited = clean["q", 1], edited["q", 1]
    others = [h for h in range(model.cfg.n_heads) if h != 2]
    torch.testing.assert_close(q_edited[:, :, others], q_clean[:, :, others], rtol=0, atol=1e-5)
    assert not torch.allclose(q_edited[:, :, 2], q_clean[:, :, 2], atol=1e-3)
    # head 2's query is the normalized edited stream through its own W_Q
    ln1 = model.blocks[1].ln1
    expected = ln1.normalize(clean["resid_pre", 1] + noise) @ model.W_Q[1, 2] + model.b_Q[1, 2]
    torch.testing.assert_close(q_edited[:, :, 2], expected, rtol=0, atol=1e-5)
    # keys and values read their own inputs
    torch.testing.assert_close(edited["k", 1], clean["k", 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(edited["v", 1], clean["v", 1], rtol=0, atol=1e-5)
    assert not torch.allclose(edited["attn_out", 1], clean["attn_out", 1], atol=1e-4)


def test_an_edited_result_flows_into_attn_out_and_gradients_reach_it(tokens):
    model = make_model()
    model.set_use_attn_result(True)
    _, clean = model.run_with_cache(tokens)

    def zero_head(result, hook):
        result[:, :, 1] = 0.0
        return result

    with model.hooks([("blocks.0.attn.hook_result", zero_head)]):
        _, ablated = model.run_with_cache(tokens)
    kept = [h for h in range(model.cfg.n_heads) if h != 1]
    expected = clean["result", 0][:, :, kept].sum(2) + model.b_O[0]
    torch.testing.assert_close(ablated["attn_out", 0], expected, rtol=0, atol=1e-5)
    # a backward hook on the results fires (the results then feed attn_out)
    grads = []
    out = model.run_with_hooks(tokens, bwd_hooks=[("blocks.0.attn.hook_result", lambda g, hook: grads.append(g.shape))])
    out.sum().backward()
    assert grads == [torch.Size([2, 9, model.cfg.n_heads, model.cfg.d_model])]


def test_the_mlp_input_hook_edits_the_mlp_input_only(tokens):
    model = make_model()
    model.set_use_hook_mlp_in(True)
    _, clean = model.run_with_cache(tokens)

    def shift(mlp_in, hook):
        mlp_in += 1.0  # in place: the residual stream itself must not move
        return mlp_in

    with model.hooks([("blocks.0.hook_mlp_in", shift)]):
        _, shifted = model.run_with_cache(tokens)
    assert torch.equal(shifted["resid_mid", 0], clean["resid_mid", 0])
    expected_post = clean["resid_mid", 0] + model.blocks[0].mlp(
        model.blocks[0].ln2.normalize(clean["resid_mid", 0] + 1.0)
    )
    torch.testing.assert_close(shifted["resid_post", 0], expected_post, rtol=0, atol=1e-5)


def test_toggles_in_the_config_build_the_same_model(tokens):
    toggled = make_model(use_attn_result=True, use_split_qkv_input=True, use_attn_in=True, use_hook_mlp_in=True)
    plain = make_model()
    assert torch.equal(toggled(tokens), plain(tokens))
    assert {name for name in toggled.hook_dict} - set(plain.hook_dict) == {
        f"blocks.{layer}.{hook}" for layer in range(2) for hooks in ADDED.values() for hook in hooks
    }
    with pytest.raises(ValueError, match="attention-only"):
        make_model(attn_only=True).set_use_hook_mlp_in(True)

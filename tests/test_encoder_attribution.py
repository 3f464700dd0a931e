"""Attribution to a chosen output direction on encoders, the cache's residual tools, and MLM directions.

References: each component's write carried *forward* to the output through the frozen
LayerNorms (the module sweeps directions *backward*), the model's own output and its
mean-pooled embedding, and Hugging Face's MLM decoder weight.
"""

import pytest
import torch

from analysis.readouts import attribution
from analysis.readouts.post_norm import (
    encoder_attribution_hook_names,
    encoder_direct_attribution,
    sentence_embedding_direction,
)

from .encoder_helpers import SENTENCES, minilm, random_mlm


@pytest.fixture(scope="module")
def minilm64():
    """Real MiniLM in float64 on a padded batch, with its full cache and output."""
    model, _ = minilm(torch.float64)
    batch = model.to_tokens_and_mask(SENTENCES)
    hidden, cache = model.run_with_cache(batch)
    return model, batch, hidden, cache


def frozen_ln(x, layer_norm, scale):
    """The linear part of a LayerNorm with its scale frozen: ``(x - mean(x)) / scale * w``."""
    return (x - x.mean(dim=-1, keepdim=True)) / scale * layer_norm.w


def carried_to_output(x, model, cache, enters: str, layer: int, direction):
    """``x`` written into the stream at ``enters`` ("embed", "resid_mid", "resid_post", "resid_pre") of ``layer``,
    carried forward through every later LayerNorm with frozen scales, read along ``direction``: ``[batch, pos]``."""
    x = x.expand_as(cache["hook_embed"])
    if enters == "embed":
        x, enters, layer = frozen_ln(x, model.embed_ln, cache["embed_ln.hook_scale"]), "resid_pre", 0
    for block_index in range(layer, model.cfg.n_layers):
        block = model.blocks[block_index]
        if enters in ("resid_pre", "resid_mid"):
            x = frozen_ln(x, block.ln1, cache["scale", block_index, "ln1"])
        x = frozen_ln(x, block.ln2, cache["scale", block_index, "ln2"])
        enters = "resid_pre"
    return (x * direction).sum(dim=-1)


def test_every_term_is_its_write_carried_forward_through_frozen_layer_norms(minilm64):
    model, batch, hidden, cache = minilm64
    direction = torch.randn(
        len(SENTENCES), model.cfg.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    attr = encoder_direct_attribution(cache, direction)  # every position: [..., batch, pos]
    d = direction[:, None, :]
    close = lambda got, expected: torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-9)  # noqa: E731
    close(attr.embed, carried_to_output(cache["hook_embed"], model, cache, "embed", 0, d))
    close(attr.token_type_embed, carried_to_output(cache["hook_token_type_embed"], model, cache, "embed", 0, d))
    close(attr.pos_embed, carried_to_output(cache["hook_pos_embed"], model, cache, "embed", 0, d))
    close(attr.embed_ln_bias, carried_to_output(model.embed_ln.b, model, cache, "resid_pre", 0, d))
    for layer, block in enumerate(model.blocks):
        for head in range(model.cfg.n_heads):
            write = cache["z", layer][:, :, head] @ block.attn.W_O[head]
            close(attr.heads[layer, head], carried_to_output(write, model, cache, "resid_mid", layer, d))
        close(attr.attn_bias[layer], carried_to_output(block.attn.b_O, model, cache, "resid_mid", layer, d))
        close(attr.ln1_bias[layer], carried_to_output(block.ln1.b, model, cache, "resid_post", layer, d))
        close(attr.mlp[layer], carried_to_output(cache["mlp_out", layer], model, cache, "resid_post", layer, d))
        close(attr.mlp_bias[layer], carried_to_output(block.mlp.b_out, model, cache, "resid_post", layer, d))
        close(attr.ln2_bias[layer], carried_to_output(block.ln2.b, model, cache, "resid_pre", layer + 1, d))
    # and the parts add up to the output read along the direction: the identity of the split
    close(attr.value, (hidden * d).sum(dim=-1))
    close(attr.total(), attr.value)


def test_the_sentence_embedding_norm_splits_exactly(minilm64):
    model, batch, _, cache = minilm64
    embedding = model.mean_pooled_embedding(batch).detach()  # the model's own pooling, masked
    direction = sentence_embedding_direction(cache, batch.attention_mask)
    torch.testing.assert_close(direction, torch.nn.functional.normalize(embedding, dim=-1))
    attr = encoder_direct_attribution(cache, direction, pos="mean", attention_mask=batch.attention_mask, neurons=True)
    torch.testing.assert_close(attr.value, embedding.norm(dim=-1), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(attr.total(), attr.value, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(attr.neurons.sum(dim=1) + attr.mlp_bias, attr.mlp, atol=1e-10, rtol=1e-10)
    assert attr.heads.shape == (model.cfg.n_layers, model.cfg.n_heads, len(SENTENCES))
    # padding must not enter the mean: the unmasked mean differs
    unmasked = encoder_direct_attribution(cache, direction, pos="mean")
    assert (unmasked.value - attr.value).abs().max() > 1e-3


@pytest.mark.parametrize("pos", [0, -1, "last_real"])
def test_one_position_per_sentence(minilm64, pos):
    model, batch, hidden, cache = minilm64
    if pos == "last_real":
        pos = batch.attention_mask.sum(dim=1) - 1  # each sentence's [SEP]
    positions = torch.as_tensor(pos).expand(len(SENTENCES)) % hidden.shape[1]
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    attr = encoder_direct_attribution(cache, direction, pos=pos)
    expected = hidden[torch.arange(len(SENTENCES)), positions] @ direction
    torch.testing.assert_close(attr.value, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(attr.total(), expected, atol=1e-10, rtol=1e-10)


def test_an_mlm_model_splits_exactly_too():
    model, _ = random_mlm()
    tokens = torch.tensor([[2, 9, 14, 9, 40, 3], [2, 17, 5, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    _, cache = model.run_with_cache(tokens, mask, names_filter=encoder_attribution_hook_names(model))
    direction = torch.randn(2, 6, model.cfg.d_model, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    attr = encoder_direct_attribution(cache, direction)
    hidden = model(tokens, mask, return_type="hidden")
    torch.testing.assert_close(attr.total(), (hidden * direction).sum(dim=-1), atol=1e-10, rtol=1e-10)


def test_attribution_refuses_bad_input(minilm64, small_model):
    model, batch, _, cache = minilm64
    d_model = model.cfg.d_model
    with pytest.raises(ValueError, match=r"direction has shape \(5,\)"):
        encoder_direct_attribution(cache, torch.ones(5, dtype=torch.float64))
    with pytest.raises(TypeError, match="float tensor"):
        encoder_direct_attribution(cache, torch.ones(d_model, dtype=torch.long))
    with pytest.raises(ValueError, match="pos must be"):
        encoder_direct_attribution(cache, torch.ones(d_model, dtype=torch.float64), pos="max")
    with pytest.raises(ValueError, match="pos='mean' only"):
        encoder_direct_attribution(cache, torch.ones(d_model, dtype=torch.float64), attention_mask=batch.attention_mask)
    _, partial = model.run_with_cache(batch, names_filter=["hook_embed"])
    with pytest.raises(KeyError, match="names_filter"):
        encoder_direct_attribution(partial, torch.ones(d_model, dtype=torch.float64))
    _, decoder_cache = small_model.run_with_cache(torch.tensor([[1, 2, 3]]))
    with pytest.raises(TypeError, match="direct_logit_attribution"):
        encoder_direct_attribution(decoder_cache, torch.ones(small_model.cfg.d_model))


@pytest.mark.parametrize("tool", ["direct_logit_attribution", "logit_lens", "neuron_logit_attribution"])
def test_decoder_attribution_tools_point_an_encoder_to_its_own(minilm64, tool):
    _, _, _, cache = minilm64
    call = {
        "direct_logit_attribution": lambda: attribution.direct_logit_attribution(cache, 5),
        "logit_lens": lambda: attribution.logit_lens(cache),
        "neuron_logit_attribution": lambda: attribution.neuron_logit_attribution(cache, 5),
    }[tool]
    with pytest.raises(TypeError, match="encoder_direct_attribution"):
        call()


# --- the cache's residual-stream tools on a post-norm model ---------------------------------------
def test_accumulated_resid_is_the_hidden_state_entering_each_block(minilm64):
    model, _, hidden, cache = minilm64
    stack, labels = cache.accumulated_resid(return_labels=True)
    n_layers = model.cfg.n_layers
    assert labels == [f"{layer}_pre" for layer in range(n_layers)] + ["final_post"]
    for layer in range(n_layers):
        assert torch.equal(stack[layer], cache["resid_pre", layer])
    assert torch.equal(stack[-1], hidden)  # the model's output, not the last resid_post (before ln2)
    with_mid, mid_labels = cache.accumulated_resid(layer=2, incl_mid=True, return_labels=True)
    assert mid_labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre"]
    assert torch.equal(with_mid[3], cache["resid_mid", 1])


def test_head_and_neuron_stacks_keep_their_meaning(minilm64):
    model, _, _, cache = minilm64
    heads = cache.stack_head_results(layer=3)  # [layer * head_index, batch, pos, d_model]
    per_layer = heads.reshape(3, model.cfg.n_heads, *heads.shape[1:]).sum(dim=1)
    for layer in range(3):
        torch.testing.assert_close(
            per_layer[layer] + model.blocks[layer].attn.b_O, cache["attn_out", layer], atol=1e-10, rtol=1e-10
        )
    mlm, _ = random_mlm()  # a small d_mlp: the full neuron stack is [d_mlp, batch, pos, d_model]
    _, mlm_cache = mlm.run_with_cache(torch.tensor([[2, 9, 14, 3]]))
    neurons = mlm_cache.stack_neuron_results(layer=1)
    torch.testing.assert_close(
        neurons.sum(dim=0) + mlm.blocks[0].mlp.b_out, mlm_cache["mlp_out", 0], atol=1e-10, rtol=1e-10
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda cache: cache.decompose_resid(),
        lambda cache: cache.accumulated_resid(apply_ln=True),
        lambda cache: cache.apply_ln_to_stack(cache.accumulated_resid(), layer=2),
        lambda cache: cache.stack_head_results(apply_ln=True),
        lambda cache: cache.logit_attrs(cache.accumulated_resid(), 5),
    ],
    ids=[
        "decompose_resid",
        "accumulated_resid-apply_ln",
        "apply_ln_to_stack",
        "stack_head_results-apply_ln",
        "logit_attrs",
    ],
)
def test_pre_norm_tools_explain_why_they_do_not_apply(minilm64, call):
    _, _, _, cache = minilm64
    with pytest.raises(ValueError, match="post-LayerNorm.*encoder_direct_attribution"):
        call(cache)


def test_the_final_scale_short_key_names_the_last_ln2(minilm64):
    model, _, _, cache = minilm64
    for key in ("scale", "normalized"):
        with pytest.raises(KeyError, match=f"no ln_final.*cache\\['{key}', 5, 'ln2'\\]"):
            cache[key]
        assert key not in cache
    assert torch.equal(cache["scale", -1, "ln2"], cache["blocks.5.ln2.hook_scale"])


# --- MLM directions -----------------------------------------------------------------------------
def test_residual_directions_are_the_mlm_decoder_columns():
    model, hf = random_mlm()
    decoder = hf.cls.predictions.decoder.weight  # [d_vocab, d_model]
    torch.testing.assert_close(model.tokens_to_residual_directions(7), decoder[7])
    ids = torch.tensor([[3, 60, 0], [11, 11, 42]])
    torch.testing.assert_close(model.tokens_to_residual_directions(ids), decoder[ids])
    # what the direction means: an MLM logit is the head's normalized output along it, plus b_U
    tokens = torch.tensor([[2, 9, 14, 3]])
    logits, cache = model.run_with_cache(tokens)
    normalized = cache["mlm_head.ln.hook_normalized"]
    torch.testing.assert_close(normalized @ model.tokens_to_residual_directions(9) + model.b_U[9], logits[..., 9])
    with pytest.raises(ValueError, match="d_vocab=61"):
        model.tokens_to_residual_directions(61)
    with pytest.raises(TypeError, match="integer"):
        model.tokens_to_residual_directions(torch.tensor([1.0]))


def test_residual_directions_need_an_mlm_head():
    model, _ = minilm(torch.float32)
    with pytest.raises(ValueError, match="needs an MLM head"):
        model.tokens_to_residual_directions(2023)

"""The builder's inputs (issue 40): nothing silent, nothing the allocator has to refuse.

- Sizes whose weights cannot fit in this machine's memory are refused by name before any weight exists.
- The three builders share one ``norm_eps`` default.
- An encoder-decoder can have no positions, T5's relative buckets only, one learned table for both stacks,
  and a source vocabulary of its own; each checked by shapes, a forward, and an identity.
- ``load_from_modules`` reads a whole mixture-of-experts module and a wrapper whose child holds the weights,
  and says exactly what to pass where a module cannot be read unambiguously.
"""

import pytest
import torch
from torch import nn

from interp_transformer.builder import (
    DecoderSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    build_decoder,
    build_encoder,
    build_encoder_decoder,
    weights_from_modules,
)

SHAPE = dict(d_model=16, n_layers=1, n_heads=4, d_mlp=32, d_vocab=23, n_ctx=12)
SEQ2SEQ = dict(SHAPE, n_decoder_layers=1, placement="pre")
SOURCE = torch.tensor([[3, 7, 4, 9, 5, 6], [8, 3, 3, 11, 4, 7]])
TARGET = torch.tensor([[2, 5, 9, 4], [2, 8, 8, 3]])


# --- sizes that cannot fit ---------------------------------------------------------------------------------------
TOO_BIG = [  # (builder, fields, the field the refusal names)
    (build_decoder, dict(n_ctx=10**12), "n_ctx"),
    (build_decoder, dict(d_vocab=10**12), "d_vocab"),
    (build_decoder, dict(d_model=2**36, n_heads=1), "d_model"),
    (build_decoder, dict(d_mlp=10**12), "d_mlp"),
    (build_encoder, dict(d_vocab=10**12), "d_vocab"),
    (build_encoder_decoder, dict(n_ctx=10**12, positions="learned"), "n_ctx"),
]
TOO_BIG_SLOWLY = [  # a pre-check-free build allocates these a block at a time, until memory runs out
    (build_decoder, dict(n_layers=10**9), "n_layers"),
    (build_decoder, dict(experts=dict(n_experts=10**9, top_k=1)), "n_experts"),
    (build_encoder_decoder, dict(n_decoder_layers=10**9), "n_decoder_layers"),
]


@pytest.mark.parametrize("build, fields, named", TOO_BIG, ids=[f"{b.__name__}-{next(iter(f))}" for b, f, _ in TOO_BIG])
def test_sizes_that_cannot_fit_are_refused_by_name_before_allocating(build, fields, named):
    with pytest.raises(ValueError, match=rf"cannot fit.*\b{named}\b") as error:
        build(**{**SHAPE, **fields})
    assert "GiB" in str(error.value) and "memory" in str(error.value)


@pytest.mark.parametrize(
    "build, fields, named", TOO_BIG_SLOWLY, ids=[f"{b.__name__}-{next(iter(f))}" for b, f, _ in TOO_BIG_SLOWLY]
)
def test_layer_and_expert_counts_that_cannot_fit_are_refused_at_once(build, fields, named):
    with pytest.raises(ValueError, match=rf"cannot fit.*\b{named}\b"):
        build(**{**SHAPE, **fields})


def test_a_spec_refuses_the_size_itself_and_a_size_that_fits_still_builds():
    with pytest.raises(ValueError, match="cannot fit"):
        DecoderSpec(**{**SHAPE, "n_ctx": 10**12})
    # positions computed or acting inside attention have no table of n_ctx rows: a long context costs nothing here
    assert build_decoder(**{**SHAPE, "n_ctx": 10**12, "positions": "rotary"}).cfg.n_ctx == 10**12


# --- one norm_eps default ----------------------------------------------------------------------------------------
def test_the_three_builders_share_one_norm_eps_default():
    defaults = {spec.__name__: spec().norm_eps for spec in (DecoderSpec, EncoderSpec, EncoderDecoderSpec)}
    assert set(defaults.values()) == {1e-5}, defaults
    encoder = build_encoder(**SHAPE, seed=0)
    eps = {module.eps for module in encoder.modules() if hasattr(module, "eps")}
    assert eps == {1e-5}
    assert build_encoder(**SHAPE, norm_eps=1e-12, seed=0).embed_ln.eps == 1e-12  # BERT's, given explicitly


# --- encoder-decoders: positions, vocabularies -------------------------------------------------------------------
def n_parameters(model) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def test_an_encoder_decoder_without_positions_is_blind_to_the_source_order():
    model = build_encoder_decoder(**SEQ2SEQ, positions="none", seed=0, dtype=torch.float64)
    assert not any("pos" in name for name, _ in model.named_parameters())
    assert not any("pos_embed" in name or "rel_pos" in name for name in model.hook_dict)
    permuted = SOURCE[:, torch.tensor([5, 2, 0, 4, 1, 3])]
    with torch.no_grad():
        logits = model(SOURCE, TARGET)
        assert logits.shape == (2, 4, 23)
        # cross-attention reads a set of keys: without positions, the order of the source changes nothing
        torch.testing.assert_close(model(permuted, TARGET), logits, rtol=0, atol=1e-12)


def test_t5_style_relative_buckets_only():
    fields = dict(SEQ2SEQ, norm="rms", positions="relative_bucketed", n_buckets=8, max_distance=16)
    model = build_encoder_decoder(**fields, attn_scale=1.0, seed=0, dtype=torch.float64)
    assert model.encoder.rel_pos_bias.W_rel_pos.shape == (8, 4) and model.decoder.rel_pos_bias.W_rel_pos.shape == (8, 4)
    assert model.encoder.pos_embed is None and not any("pos_embed" in name for name in model.hook_dict)
    assert "encoder.rel_pos_bias.hook_bias" in model.hook_dict and "decoder.rel_pos_bias.hook_bias" in model.hook_dict
    scales = {module.scale for name, module in model.named_modules() if name.endswith(("attn", "cross_attn"))}
    assert scales == {1.0}
    with torch.no_grad():
        for stack in (model.encoder, model.decoder):
            stack.rel_pos_bias.W_rel_pos.normal_()
        logits, cache = model.run_with_cache(SOURCE, decoder_input=TARGET)
        assert logits.shape == (2, 4, 23) and cache["encoder.rel_pos_bias.hook_bias"].shape == (1, 4, 6, 6)
        # the bias is the only position signal: zero tables give the model without positions, same weights
        blind = build_encoder_decoder(**{**SEQ2SEQ, "norm": "rms"}, positions="none", attn_scale=1.0)
        blind = blind.to(torch.float64)
        state = {k: v for k, v in model.state_dict().items() if "rel_pos_bias" not in k}
        blind.load_state_dict(state)
        assert not torch.allclose(blind(SOURCE, TARGET), logits)
        for stack in (model.encoder, model.decoder):
            stack.rel_pos_bias.W_rel_pos.zero_()
        torch.testing.assert_close(model(SOURCE, TARGET), blind(SOURCE, TARGET), rtol=0, atol=1e-12)


def test_relative_bucket_options_are_read_only_with_relative_buckets():
    with pytest.raises(ValueError, match="n_buckets is read only with positions='relative_bucketed'"):
        EncoderDecoderSpec(**SEQ2SEQ, positions="learned", n_buckets=8)
    with pytest.raises(ValueError, match="n_buckets=2 and max_distance=16 leave no room"):
        EncoderDecoderSpec(**SEQ2SEQ, positions="relative_bucketed", n_buckets=2, max_distance=16)


def test_one_learned_position_table_can_serve_both_stacks():
    separate = build_encoder_decoder(**SEQ2SEQ, positions="learned", seed=0, dtype=torch.float64)
    shared = build_encoder_decoder(**SEQ2SEQ, positions="learned", share_positions=True, seed=0, dtype=torch.float64)
    assert shared.encoder.pos_embed.W_pos is shared.decoder.pos_embed.W_pos
    assert n_parameters(separate) - n_parameters(shared) == 12 * 16  # one [n_ctx, d_model] table fewer
    state = dict(shared.state_dict())
    separate.load_state_dict(state)  # both tables set to the shared one: the same model
    with torch.no_grad():
        torch.testing.assert_close(shared(SOURCE, TARGET), separate(SOURCE, TARGET), rtol=0, atol=0)
        shared.encoder.pos_embed.W_pos[1] += 1.0  # one edit moves both stacks' positions
        assert bool((shared.decoder.pos_embed.W_pos[1] == separate.decoder.pos_embed.W_pos[1] + 1.0).all())
    table = torch.randn(12, 16, dtype=torch.float64)
    loaded = weights_from_modules(shared, {"encoder.pos_embed": table})  # one table named once fills both names
    assert all(torch.equal(loaded[f"{stack}.pos_embed.W_pos"], table) for stack in ("encoder", "decoder"))
    with pytest.raises(ValueError, match="share_positions=True shares a learned table.*positions='sinusoidal'"):
        EncoderDecoderSpec(**SEQ2SEQ, positions="sinusoidal", share_positions=True)


def test_source_and_target_vocabularies_of_their_own():
    model = build_encoder_decoder(**SEQ2SEQ, d_vocab_source=29, separate_embeddings=True, seed=0)
    assert model.embed.W_E.shape == (29, 16) and model.decoder_embed.W_E.shape == (23, 16)
    assert model.unembed.W_U.shape == (16, 23)
    source = SOURCE.clone()
    source[0, 0] = 28  # a source id past the target vocabulary
    with torch.no_grad():
        assert model(source, TARGET).shape == (2, 4, 23)
    with pytest.raises(ValueError, match="29"):
        model(source + 1, TARGET)  # 29 is past the source vocabulary
    with pytest.raises(ValueError, match="decoder_input.*23"):
        model(SOURCE, TARGET + 20)
    with pytest.raises(ValueError, match="d_vocab_source=29 differs from d_vocab=23.*separate_embeddings=True"):
        EncoderDecoderSpec(**SEQ2SEQ, d_vocab_source=29)


def test_an_encoder_decoder_can_hold_its_biases_at_zero():
    model = build_encoder_decoder(**SEQ2SEQ, attn_bias=False, mlp_bias=False, readout_bias=False, seed=0)
    assert model.decoder.blocks[0].cross_attn.held_at_zero == {"b_Q", "b_K", "b_V", "b_O"}
    assert model.encoder.blocks[0].mlp.held_at_zero == {"b_in", "b_out"}
    assert not model.unembed.b_U.requires_grad


# --- load_from_modules: whole modules -----------------------------------------------------------------------------
class RouterMoE(nn.Module):
    def __init__(self, n_experts=4):
        super().__init__()
        self.router = nn.Linear(16, n_experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(n_experts)
        )


def moe_model():
    return build_decoder(**SHAPE, experts=dict(n_experts=4, top_k=2, router_bias=True), seed=0)


def test_a_whole_mixture_of_experts_loads_as_its_router_and_experts():
    model, theirs = moe_model(), RouterMoE()
    per_part = {"blocks.0.mlp": theirs.router}
    per_part |= {f"blocks.0.mlp.experts.{e}": expert for e, expert in enumerate(theirs.experts)}
    expected = weights_from_modules(model, per_part)
    found = weights_from_modules(model, {"blocks.0.mlp": theirs})
    assert found.keys() == expected.keys() and len(found) == 2 + 4 * 4
    assert all(torch.equal(found[name], expected[name]) for name in expected)


def test_a_mixture_that_does_not_pair_up_says_what_to_pass():
    with pytest.raises(TypeError, match=r"blocks.0.mlp is a mixture of 4 experts.*'blocks.0.mlp.experts.3'") as error:
        weights_from_modules(moe_model(), {"blocks.0.mlp": RouterMoE(n_experts=3)})
    assert "RouterMoE" in str(error.value) and "experts" in str(error.value)


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.MultiheadAttention(16, 4, batch_first=True)
        self.dropout = nn.Dropout(0.0)


def test_a_module_whose_child_holds_the_weights_loads_as_that_child():
    model, theirs = build_decoder(**SHAPE, seed=0), Wrapped()
    found = weights_from_modules(model, {"blocks.0.attn": theirs})
    expected = weights_from_modules(model, {"blocks.0.attn": theirs.inner})
    assert found.keys() == expected.keys() and all(torch.equal(found[k], expected[k]) for k in expected)


class Projections(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(16, 16) for _ in range(4))


def test_a_module_of_several_weighted_children_is_refused_with_what_to_pass():
    model = build_decoder(**SHAPE, seed=0)
    with pytest.raises(TypeError, match=r"blocks.0.attn: .*Projections.*children with weights \['q', 'k', 'v', 'o'\]"):
        weights_from_modules(model, {"blocks.0.attn": Projections()})
    with pytest.raises(TypeError, match=r"in our order \['W_Q', 'W_K', 'W_V', 'W_O'\]"):
        weights_from_modules(model, {"blocks.0.attn": Projections()})

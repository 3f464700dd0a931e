"""The builder takes every part the shipped families use, and they are the families' own parts.

- Each new field of ``DecoderSpec`` (grouped keys and values, parallel blocks, q/k norms, sliding windows with
  per-layer types and their own rotary base, soft-caps, Gemma's post norms, OLMo's output norms, partial rotary)
  builds the part the family's own build uses; a value or combination no part makes is refused at the call by a
  message naming the field, the rule and the value.
- The family recipes: a builder spec written from a Hugging Face config of Llama (and Mistral, Qwen3), GPT-NeoX,
  Gemma 2 (and Gemma 3) and OLMo 2 (and OLMo 3), given that model's weights, gives Hugging Face's logits (float32,
  1e-4), with the same parts in the same places as the family's own model (``from_pretrained``).
"""

import pytest
import torch

from interp_transformer.builder import build_decoder
from interp_transformer.families.composed import DecoderSpec
from interp_transformer.loading import from_pretrained
from interp_transformer.parts import ParallelBlock, PreNormBlock
from interp_transformer.parts.all_heads_norm import AllHeadsRMSNorm
from interp_transformer.parts.gemma_norm import GemmaRMSNorm
from interp_transformer.parts.rms_norm import RMSNorm
from interp_transformer.parts.scaled_embed import ScaledEmbed

from .classic_helpers import tiny_hf_model as tiny_classic
from .gemma_helpers import tiny_gemma
from .llama_helpers import tiny_hf_model as tiny_llama
from .olmo_helpers import tiny_olmo

SHAPE = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=24, d_vocab=31, n_ctx=12)
ROTARY = dict(positions="rotary")
SLIDING = ("sliding_attention", "full_attention")

REFUSALS = [  # (fields, what the message says: the field, the rule, the value)
    (dict(n_key_value_heads=3), r"n_heads=4 must be a multiple of n_key_value_heads=3"),
    (dict(n_key_value_heads=0), "n_key_value_heads must be a positive int, got 0"),
    (dict(n_key_value_heads=2.0), "n_key_value_heads must be a positive int, got 2.0"),
    (dict(parallel_residual="yes"), "parallel_residual must be a bool, got 'yes'"),
    (
        dict(parallel_residual=True, placement="post"),
        r"parallel_residual=True .* placement='pre' .*got placement='post'",
    ),
    (dict(parallel_residual=True, post_norms=True), r"parallel_residual=True .* post_norms=False, .*post_norms=True"),
    (dict(parallel_residual=True, d_mlp=None), r"d_mlp=None .* got parallel_residual=True, which needs one"),
    (dict(qk_norm=True), r"qk_norm must be one of \('per_head', 'all_heads'\), got True"),
    (dict(qk_norm="per-head"), r"qk_norm must be one of .* got 'per-head'; closest: \['per_head'"),
    (dict(sliding_window=0), "sliding_window must be a positive int, got 0"),
    (dict(sliding_window=3, causal=False), r"sliding_window=3 .* needs causal=True, got causal=False"),
    (
        dict(layer_types=("full_attention",)),
        r"layer_types must be a tuple of n_layers=2 names .* \('full_attention',\)",
    ),
    (dict(layer_types="full_attention"), r"layer_types must be a tuple of n_layers=2 names .* got 'full_attention'"),
    (dict(layer_types=("full_attention", "local")), r"layer_types must be one of .*, got 'local'"),
    (dict(layer_types=SLIDING), "layer_types has sliding_attention layers: give their sliding_window"),
    (dict(sliding_window=3, layer_types=("full_attention",) * 2), "sliding_window=3 is read only by sliding_attention"),
    (dict(rotary_dim=2), "rotary_dim is read only with positions='rotary', got positions='learned'"),
    (dict(ROTARY, rotary_dim=3), r"rotary_dim .* must be an even int in \[2, d_head=4\], got 3"),
    (dict(ROTARY, rotary_dim=6), r"rotary_dim .* must be an even int in \[2, d_head=4\], got 6"),
    (dict(ROTARY, rotary_dim=True), r"rotary_dim .* must be an even int in \[2, d_head=4\], got True"),
    (dict(rotary_base_local=100.0), "rotary_base_local is read only with positions='rotary', got positions='learned'"),
    (dict(ROTARY, rotary_base_local=100.0), r"rotary_base_local=100.0 is the sliding layers' rotary base, and no"),
    (dict(ROTARY, sliding_window=2, rotary_base_local=1.0), r"rotary_base_local must be a finite number > 1, got 1.0"),
    (dict(attn_softcap=0.0), "attn_softcap must be a finite number > 0, got 0.0"),
    (dict(final_softcap=float("inf")), "final_softcap must be a finite number > 0, got inf"),
    (dict(final_softcap="30"), "final_softcap must be a finite number > 0, got '30'"),
    (dict(post_norms=1), "post_norms must be a bool, got 1"),
    (dict(post_norms=True, placement="post"), r"post_norms=True .* needs placement='pre', got placement='post'"),
    (dict(post_norms=True, placement="output"), r"post_norms=True .* got placement='output' \(.* only those norms"),
    (dict(post_norms=True, norm="none"), r"post_norms=True normalizes each sublayer's output: .* got norm='none'"),
    (dict(post_norms=True, d_mlp=None), r"d_mlp=None .* got post_norms=True, which needs one"),
    (dict(placement="output", norm="none"), r"placement='output' normalizes each sublayer's output: .*norm='none'"),
    (dict(placement="output", d_mlp=None), r"d_mlp=None .* got placement='output', which needs one"),
    (dict(placement="outputs"), r"placement must be one of \('pre', 'post', 'output'\), got 'outputs'; closest"),
]


@pytest.mark.parametrize("fields, message", REFUSALS, ids=[f"{'-'.join(f)}-{i}" for i, (f, _) in enumerate(REFUSALS)])
def test_a_family_part_that_cannot_be_built_is_refused_by_name(fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        DecoderSpec(**{**SHAPE, **fields})


def test_each_field_builds_the_part_the_family_uses():
    model = build_decoder(
        **{**SHAPE, "n_layers": 3},
        positions="rotary",
        rotary_base=1000.0,
        rotary_dim=2,
        n_key_value_heads=2,
        qk_norm="all_heads",
        sliding_window=2,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],  # a list, as Hugging Face's
        rotary_base_local=100.0,
        attn_softcap=2.0,
        final_softcap=3.0,
        post_norms=True,
        norm="rms",
        seed=0,
    )
    assert model.cfg.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    attn = [block.attn for block in model.blocks]
    assert all(isinstance(block, PreNormBlock) and "ln2_post" in block._modules for block in model.blocks)
    assert all(a.softcap == 2.0 and not a.uses_fused_path() for a in attn)
    assert [a.key_window() for a in attn] == [2, None, 2]
    assert [a.rotary.base for a in attn] == [100.0, 1000.0, 100.0] and attn[0].rotary.rotary_dim == 2
    assert attn[0].n_key_value_heads == 2 and tuple(attn[0].stored("W_K").shape) == (2, 16, 4)
    assert isinstance(attn[0].q_norm, AllHeadsRMSNorm) and attn[0].k_norm.n_heads == 2
    assert model.unembed.softcap == 3.0 and model.logit_softcap == 3.0
    assert model.act_name("attn_scores_uncapped", 1) == "blocks.1.attn.hook_attn_scores_uncapped"
    assert model.act_name("logits_uncapped") == "unembed.hook_logits_uncapped"
    assert model.act_name("scale", 0, "ln2_post") == "blocks.0.ln2_post.hook_scale"

    per_head = build_decoder(**SHAPE, qk_norm="per_head", sliding_window=3, seed=0).blocks[0].attn
    assert isinstance(per_head.q_norm, RMSNorm) and per_head.q_norm.w.shape == (4,) and per_head.key_window() == 3
    parallel = build_decoder(**SHAPE, parallel_residual=True, seed=0)
    assert isinstance(parallel.blocks[0], ParallelBlock) and "blocks.0.hook_resid_mid" not in parallel.hook_dict
    with pytest.raises(KeyError, match="resid_mid"):
        parallel.act_name("resid_mid", 0)
    output = build_decoder(**SHAPE, placement="output", seed=0)
    assert isinstance(output.blocks[0], PreNormBlock) and "ln1" not in output.blocks[0]._modules
    assert output.capabilities.additive_residual
    assert output.capabilities.final_norm == "ln_final" and output.act_name("scale", 1, "ln1_post") in output.hook_dict
    with pytest.raises(KeyError, match="ln1"):
        output.act_name("scale", 0, "ln1")


@pytest.mark.parametrize(
    "fields",
    [
        dict(positions="rotary", rotary_dim=2, parallel_residual=True),
        dict(post_norms=True, attn_softcap=1.0, final_softcap=2.0, n_key_value_heads=1),
        dict(placement="output", qk_norm="all_heads", sliding_window=2),
        dict(d_mlp=None, qk_norm="per_head", sliding_window=2, layer_types=SLIDING, attn_softcap=1.5),
    ],
    ids=["parallel", "post-norms-capped", "output", "attn-only"],
)
def test_every_hook_name_in_the_table_is_a_hook_of_the_model(fields):
    model = build_decoder(**{**SHAPE, **fields}, seed=0)
    names = model.hook_names
    for key, template in names.layer_keys.items():
        if key == "result":  # computed by the cache, hooked only by opt-in parts
            continue
        for sub in names.sublayers if "{sub}" in template else (None,):
            assert model.act_name(key, 0, sub) in model.hook_dict, (key, sub)
    assert all(template in model.hook_dict for template in names.global_keys.values())
    logits, cache = model.run_with_cache(torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(0)))
    assert logits.isfinite().all() and set(cache.keys()) <= set(model.hook_dict)


def test_grouped_keys_and_values_count_in_the_size_check():
    """``check_fits`` counts keys and values once per key/value head: a spec that fits only grouped is built."""
    from interp_transformer.families.composed_parts import weight_counts

    full, grouped = DecoderSpec(**SHAPE), DecoderSpec(**SHAPE, n_key_value_heads=1)
    label = "n_layers x (n_heads x d_head + d_mlp) x d_model (blocks)"
    assert weight_counts(full)[label] - weight_counts(grouped)[label] == 2 * 2 * 16 * 4 * 3


# --- the family recipes: a builder spec given the family's weights gives Hugging Face's logits ----------------------
def llama_recipe(cfg) -> dict:
    """Builder fields of a ``LlamaConfig`` (Llama, Mistral, Qwen3) with every attention bias or none, unscaled
    rotary."""
    assert cfg.rope_scaling is None and cfg.attn_biases in ((), ("q", "k", "v", "o")), "not a builder design"
    return dict(
        _shape(cfg),
        norm="rms",
        norm_eps=cfg.rms_norm_eps,
        positions="rotary",
        rotary_base=cfg.rotary_base,
        activation=cfg.act_fn,
        gated_mlp=True,
        attn_bias=bool(cfg.attn_biases),
        mlp_bias=False,
        readout_bias=False,
        n_key_value_heads=cfg.n_key_value_heads,
        sliding_window=cfg.sliding_window,
        qk_norm="per_head" if cfg.qk_norm else None,
    )


def neox_recipe(cfg) -> dict:
    """Builder fields of a ``GPTNeoXConfig``: LayerNorms, partial rotary, parallel (or sequential) blocks."""
    assert cfg.rope_scaling is None, "not a builder design"
    return dict(
        _shape(cfg),
        norm="layer",
        norm_eps=cfg.layer_norm_eps,
        positions="rotary",
        rotary_base=cfg.rotary_base,
        rotary_dim=cfg.rotary_dim,
        parallel_residual=cfg.parallel_residual,
        activation=cfg.act_fn,
        attn_bias=cfg.attn_bias,
        readout_bias=False,
    )


def gemma_recipe(cfg) -> dict:
    """Builder fields of a Gemma 2/3 ``GemmaConfig`` (unscaled rotary): its norms are RMSNorms of gain
    ``1 + w_offset`` (``gemma_weights``)."""
    assert cfg.rope_scaling is None and not cfg.attn_biases, "not a builder design"
    return dict(
        _shape(cfg),
        norm="rms",
        norm_eps=cfg.rms_norm_eps,
        positions="rotary",
        rotary_base=cfg.rotary_base,
        rotary_base_local=cfg.rotary_base_local,
        activation=cfg.act_fn,
        gated_mlp=True,
        attn_bias=False,
        mlp_bias=False,
        readout_bias=False,
        embed_scale="sqrt_d_model",
        attn_scale=cfg.attention_scale,
        n_key_value_heads=cfg.n_key_value_heads,
        qk_norm="per_head" if cfg.qk_norm else None,
        post_norms=cfg.post_norms,
        attn_softcap=cfg.attn_softcap,
        final_softcap=cfg.final_softcap,
        sliding_window=cfg.sliding_window,
        layer_types=cfg.layer_types if cfg.sliding_window is not None else None,
    )


def olmo_recipe(cfg) -> dict:
    """Builder fields of an ``Olmo2Config`` (OLMo 2, OLMo 3; unscaled rotary, every attention bias or none)."""
    assert cfg.rope_scaling is None and cfg.rope_scaling_local is None, "not a builder design"
    assert cfg.attn_biases in ((), ("q", "k", "v", "o")), "not a builder design"
    return dict(
        _shape(cfg),
        norm="rms",
        norm_eps=cfg.rms_norm_eps,
        placement="output",
        positions="rotary",
        rotary_base=cfg.rotary_base,
        rotary_base_local=cfg.rotary_base_local,
        activation=cfg.act_fn,
        gated_mlp=True,
        attn_bias=bool(cfg.attn_biases),
        mlp_bias=False,
        readout_bias=False,
        n_key_value_heads=cfg.n_key_value_heads,
        qk_norm="all_heads",
        sliding_window=cfg.sliding_window,
        layer_types=cfg.layer_types,
    )


def _shape(cfg) -> dict:
    return dict(
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        d_head=cfg.d_head,
        d_mlp=cfg.d_mlp,
        d_vocab=cfg.d_vocab,
        n_ctx=cfg.n_ctx,
    )


def gemma_weights(state_dict: dict) -> dict:
    """A Gemma model's weights for RMSNorms: each ``w_offset`` becomes the gain ``w = 1 + w_offset`` it stands for."""
    return {
        name.removesuffix("_offset"): 1 + tensor if name.endswith(".w_offset") else tensor
        for name, tensor in state_dict.items()
    }


DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 1000.0}
LOCAL_ROPE = {"full_attention": DEFAULT_ROPE, "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
# (tiny Hugging Face model, its label, overrides, recipe): each family of the issue, and one more of each showing the
# other value of a part (Mistral's window on every layer, Qwen3's per-head q/k norms, NeoX's sequential blocks, Gemma
# 3's local rotary base, OLMo 3's sliding layers)
RECIPES = {
    "llama-gqa": (tiny_llama, "llama-mha-biases", dict(num_key_value_heads=1), llama_recipe),
    "mistral-window": (tiny_llama, "mistral-gqa4-window", {}, llama_recipe),
    "qwen3-qk-norm": (tiny_llama, "qwen3-gqa3-qk-norm", {}, llama_recipe),
    "neox-parallel": (tiny_classic, "neox-parallel", {}, neox_recipe),
    "neox-sequential": (tiny_classic, "neox-sequential-tied", {}, neox_recipe),
    "gemma2": (tiny_gemma, "gemma2-capped-window", {}, gemma_recipe),
    "gemma3-local-rope": (tiny_gemma, "gemma3-local-rope-capped", dict(rope_parameters=LOCAL_ROPE), gemma_recipe),
    "olmo2": (tiny_olmo, "olmo2-mha-biases-tied", dict(num_key_value_heads=1), olmo_recipe),
    "olmo3-window": (tiny_olmo, "olmo3-gqa3-window-local-rope", dict(rope_parameters=LOCAL_ROPE), olmo_recipe),
}
# what each recipe must exercise, so that a family config drifting to defaults cannot leave a part untested
EXERCISED = {
    "llama-gqa": dict(n_key_value_heads=1),
    "mistral-window": dict(n_key_value_heads=1, sliding_window=3, layer_types=None),
    "qwen3-qk-norm": dict(n_key_value_heads=2, qk_norm="per_head"),
    "neox-parallel": dict(parallel_residual=True, rotary_dim=4),
    "neox-sequential": dict(parallel_residual=False, rotary_dim=8),
    "gemma2": dict(
        n_key_value_heads=1,
        post_norms=True,
        attn_softcap=0.8,
        final_softcap=1.5,
        sliding_window=3,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"),
    ),
    "gemma3-local-rope": dict(qk_norm="per_head", rotary_base_local=100.0, rotary_base=1000.0, sliding_window=4),
    "olmo2": dict(placement="output", qk_norm="all_heads", n_key_value_heads=1),
    "olmo3-window": dict(placement="output", qk_norm="all_heads", rotary_base_local=100.0, sliding_window=3),
}
TOKENS = torch.randint(2, 61, (2, 11), generator=torch.Generator().manual_seed(3))  # longer than every window


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_builder_spec_given_the_familys_weights_gives_hugging_faces_logits(recipe):
    tiny_model, label, overrides, to_fields = RECIPES[recipe]
    hf_model = tiny_model(label, **overrides)
    family = from_pretrained(hf_model)  # the family's own model, through its converter
    fields = to_fields(family.cfg)
    assert {key: fields.get(key) for key in EXERCISED[recipe]} == EXERCISED[recipe]
    built = build_decoder(**fields, seed=0)
    weights = family.state_dict()
    if isinstance(family.ln_final, GemmaRMSNorm):
        weights = gemma_weights(weights)
        assert isinstance(family.embed, ScaledEmbed) and isinstance(built.embed, ScaledEmbed)
    built.load_state_dict(weights, strict=True)  # every weight has its place, and every place a weight
    assert _parts(built) == _parts(family), "the builder's parts are the family's own"
    with torch.no_grad():
        expected = hf_model(TOKENS).logits
        torch.testing.assert_close(built(TOKENS), expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(built(TOKENS), family(TOKENS), atol=1e-5, rtol=0)


def _parts(model) -> list[tuple[str, str]]:
    """Every module by name and class, a Gemma norm read as the RMSNorm it equals (gain ``1 + w_offset``)."""
    return [
        (name, "RMSNorm" if isinstance(module, GemmaRMSNorm) else type(module).__name__)
        for name, module in model.named_modules()
        if type(module).__name__ != "HookPoint"
    ]

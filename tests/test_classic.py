"""GPT-NeoX, GPT-J, OPT and BLOOM against Hugging Face: every hook, the key/value cache, generation, saved directories.

References: random-weight Hugging Face ``GPTNeoXForCausalLM``, ``GPTJForCausalLM``,
``OPTForCausalLM`` (pre-norm, and the post-norm OPT-350m layout with its projections) and
``BloomForCausalLM`` (``classic_helpers.FAMILIES``, every parameter perturbed), compared hook by
hook with ``verify_against_hf`` in float32 (1e-4) and float64 (1e-10); Hugging Face's
``generate``. The identities, weight processing, the analysis tools and the report are in
``test_classic_tools.py``.
"""

import pytest
import torch

from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.loading import architecture_module, from_pretrained
from interp_transformer.verify import verify_against_hf, verify_pretrained

from .classic_helpers import FAMILIES, float64_copy, left_padded, random_tokens, tiny_hf_model
from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)

TOKENS = random_tokens(2, 9, seed=5)


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
    """Every hook the reference maps: all of ours but the scores and ALiBi's bias (see the converters), plus logits."""
    unmapped = ("hook_attn_scores", "score_bias.hook_bias")
    return {name for name in model.hook_dict if not name.endswith(unmapped)} | {"logits"}


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.float64, 1e-10)], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(family, family64, dtype, atol, padded):
    _, hf_model, model = family if dtype == torch.float32 else family64
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(TOKENS, (3, 0)))) if padded else {"tokens": TOKENS}
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=atol, rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    assert {row.hook for row in report.rows} == expected_hooks(model)


def test_the_architecture_is_the_one_hugging_face_runs(family):
    label, hf_model, model = family
    kinds = {
        "neox": "gpt_neox",
        "gptj": "gptj",
        "opt-pre": "opt",
        "opt-projected": "opt",
        "opt-350m": "opt-post-norm",
        "bloom": "bloom",
    }
    assert model.architecture.name == next(kind for prefix, kind in kinds.items() if label.startswith(prefix))
    assert model.capabilities.norm_placement == ("post" if label == "opt-350m-layout" else "pre")
    blocks = {type(block).__name__ for block in model.blocks}
    expected = {
        "neox-parallel": "ParallelBlock",
        "neox-sequential-tied": "PreNormBlock",
        "gptj": "ParallelBlock",
        "opt-350m": "PostNormBlock",
        "opt": "PreNormBlock",
        "bloom": "PreNormBlock",
    }
    assert blocks == {next(kind for prefix, kind in expected.items() if label.startswith(prefix))}
    assert ("blocks.0.hook_resid_mid" in model.hook_dict) == (blocks != {"ParallelBlock"})
    assert ("ln2" in model.blocks[0]._modules) == (not label.startswith("gptj"))  # GPT-J shares ln1


def test_a_broken_weight_is_found_at_its_hook(family64):
    label, hf64, model64 = family64
    W_K = model64.blocks[1].attn.W_K
    with torch.no_grad():
        W_K[0, 3, 5] += 0.5
    try:
        report = verify_against_hf(model64, hf64, TOKENS, float64_recheck=False)
        assert not report.within_tolerance and report.first_divergence == "blocks.1.attn.hook_k", label
    finally:
        with torch.no_grad():
            W_K[0, 3, 5] -= 0.5


def test_token_by_token_with_a_key_value_cache(family64):
    """A 4-token prompt, then one token at a time: each step's hooks are Hugging Face's at those positions."""
    label, hf64, model64 = family64
    reference = architecture_module(hf64.config.model_type).hf_reference_activations(hf64, TOKENS)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    for start, end in [(0, 4)] + [(p, p + 1) for p in range(4, TOKENS.shape[1])]:
        logits, cache = model64.run_with_cache(TOKENS[:, start:end], kv_cache=kv_cache)
        torch.testing.assert_close(logits, reference["logits"][:, start:end], atol=1e-10, rtol=0)
        for name, value in cache.items():
            if name not in reference:
                continue
            expected = (
                reference[name][:, :, start:end, :end]
                if name.endswith("hook_pattern")
                else reference[name][:, start:end]
            )
            torch.testing.assert_close(
                value, expected, atol=1e-10, rtol=0, msg=f"{label} {name} at positions {start}..{end - 1}"
            )


@pytest.mark.parametrize("label", ["neox-sequential-tied", "gptj-partial", "opt-350m-layout", "bloom-3-heads"])
def test_a_saved_directory_loads_and_verifies(label, tmp_path):
    """``save_pretrained`` writes safetensors (a tied read-out left out); the directory loads as the in-memory model
    does."""
    hf_model = tiny_hf_model(label)
    hf_model.save_pretrained(tmp_path)
    from_directory, in_memory = from_pretrained(tmp_path), from_pretrained(hf_model)
    assert all(torch.equal(a, b) for a, b in zip(from_directory.state_dict().values(), in_memory.state_dict().values()))
    report = verify_pretrained(tmp_path)
    assert report.ok and report.within_tolerance, str(report)


# --- generation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_greedy_generation_matches_hugging_face(label):
    hf_model = tiny_hf_model(label, seed=3)
    model = from_pretrained(hf_model)
    prompt = random_tokens(1, 5, seed=7)
    ours = model.generate(prompt, max_new_tokens=12, temperature=0, stop_at_eos=False)
    theirs = hf_model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(
        model.generate(prompt, max_new_tokens=12, temperature=0, use_kv_cache=False, stop_at_eos=False), ours
    )


@pytest.mark.parametrize("label", ["neox-parallel", "gptj-partial", "opt-350m-layout", "bloom-3-heads"])
def test_greedy_generation_of_a_left_padded_batch_matches_hugging_face(label):
    hf_model = tiny_hf_model(label, seed=4)
    model = from_pretrained(hf_model)
    tokens, mask = left_padded(random_tokens(3, 6, seed=8), (2, 0, 4), pad_id=1)
    theirs = hf_model.generate(tokens, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=1)
    ours = model.generate(tokens, attention_mask=mask, max_new_tokens=8, temperature=0, stop_at_eos=False)
    assert torch.equal(ours, theirs)
    for row in range(3):  # and each row continues exactly as it does alone
        alone = model.generate(
            tokens[row : row + 1, mask[row].bool()], max_new_tokens=8, temperature=0, stop_at_eos=False
        )
        assert torch.equal(alone[0, -8:], ours[row, -8:])

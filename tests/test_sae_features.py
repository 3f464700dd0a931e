"""Reading SAE features, against references: a full sort, numpy's histogram, dense products, DLA's own terms, finite
differences."""

import einops
import numpy as np
import pytest
import torch

from analysis.readouts.attribution import direct_logit_attribution
from analysis.sae_features import (
    StreamingHistogram,
    feature_attribution,
    feature_logit_effect,
    read_features,
    why_no_logit_effect,
)
from analysis.sae_features.examples import PAD
from interp_transformer.sae.data import token_batches

from .sae_helpers import gpt2_with_tokenizer, prose_files, random_sae

BOS = 50256
D = 32  # d_model of the test model: 4 heads of 8


@pytest.fixture(scope="module")
def model():
    return gpt2_with_tokenizer(n_embd=D, dtype=torch.float64)


def sae_at(architecture, hook_name, d_in=D, **fields):
    return random_sae(architecture, hook_name, d_in=d_in, d_sae=48, seed=len(hook_name), dtype="float64", **fields)


# --------------------------------------------------------------------------- top examples and histograms


@pytest.fixture(scope="module")
def corpus_acts(model):
    """Reference: every context at once, the SAE's features at every position, the BOS positions marked."""
    sae = sae_at("standard", "blocks.1.hook_resid_pre")
    tokens = torch.cat(list(token_batches(model, prose_files(), context_length=32)))
    _, cache = model.run_with_cache(tokens, names_filter=[sae.hook_name])
    return sae, tokens, sae.encode(cache[sae.hook_name]).detach(), tokens != BOS


FEATURES = [10, 11, 25, 42]  # firing on 0.5%, 2%, 84% and 35% of tokens


@pytest.fixture(scope="module")
def reading(model, corpus_acts):
    sae = corpus_acts[0]
    return read_features(
        model, sae, prose_files(), FEATURES, k=6, left=3, right=2, context_length=32, batch_size=5, progress=False
    )


def test_top_examples_equal_a_full_sort(reading, corpus_acts):
    _, tokens, acts, eligible = corpus_acts
    found = reading.examples
    assert found.features.tolist() == FEATURES and reading.n_texts == len(tokens)
    for row, feature in enumerate(FEATURES):
        values = acts[..., feature].masked_fill(~eligible, float("-inf"))
        assert torch.allclose(found.values[row].double(), values.flatten().sort(descending=True).values[:6], atol=1e-6)
        places = list(zip(found.text_index[row].tolist(), found.position[row].tolist()))
        assert len(set(places)) == 6
        for j, (text, pos) in enumerate(places):
            assert eligible[text, pos] and float(acts[text, pos, feature]) == pytest.approx(
                float(found.values[row, j]), abs=1e-6
            )
            for slot, p in enumerate(range(pos - 3, pos + 3)):
                inside = 0 <= p < tokens.shape[1]
                assert int(found.window_tokens[row, j, slot]) == (int(tokens[text, p]) if inside else PAD)
                assert float(found.window_acts[row, j, slot]) == pytest.approx(
                    float(acts[text, p, feature]) if inside else 0.0, abs=1e-6
                )


def test_histograms_equal_numpys_over_every_value(reading, corpus_acts):
    _, _, acts, eligible = corpus_acts
    histograms = reading.histograms
    assert histograms.n_total == reading.n_tokens == int(eligible.sum())
    for row, feature in enumerate(FEATURES):
        values = acts[..., feature][eligible].numpy()
        nonzero = values[values != 0]
        assert len(nonzero) > 10  # the chosen features fire
        edges = histograms.edges[row].double().numpy()
        assert edges[0] <= nonzero.min() and nonzero.max() < edges[-1]
        assert histograms.counts[row].tolist() == np.histogram(nonzero, bins=edges)[0].tolist()
        assert int(histograms.n_zero[row]) == int((values == 0).sum())
        assert float(histograms.firing_rate[row]) == pytest.approx(len(nonzero) / len(values))


def test_streaming_histogram_grows_and_turns_signed_exactly():
    generator = torch.Generator().manual_seed(0)
    batches = [torch.rand(50, 3, generator=generator) * scale for scale in (0.01, 1.0, 30.0)]
    # feature 0 stays >= 0
    batches.append(-5 * torch.rand(50, 3, generator=generator) * torch.tensor([0.0, 1.0, 100.0]))
    batches.append(torch.zeros(20, 3))
    histogram = StreamingHistogram(torch.arange(3), n_bins=16)
    for batch in batches:
        histogram.update(batch)
    result = histogram.result()
    everything = torch.cat(batches).double()
    for feature in range(3):
        values = everything[:, feature].numpy()
        nonzero = values[values != 0]
        edges = result.edges[feature].double().numpy()
        assert result.counts[feature].tolist() == np.histogram(nonzero, bins=edges)[0].tolist()
        assert (edges[0] < 0) == bool((nonzero < 0).any())
        assert np.allclose(np.diff(edges), np.diff(edges)[0]) and float(np.log2(np.diff(edges)[0])).is_integer()
    assert result.n_zero.tolist() == [70, 20, 20] and result.n_total == 220


# --------------------------------------------------------------------------- direct logit effect


def dense_effect(model, residual):
    """Reference: ``(r - mean(r)) * w_lnf @ W_U``, the final LayerNorm frozen at scale 1, written out."""
    centred = residual - residual.mean(dim=-1, keepdim=True)
    return (centred * model.ln_final.w) @ model.W_U


@pytest.mark.parametrize("kind", ["stream", "z", "post", "transcoder"])
def test_logit_effect_equals_a_dense_product(model, kind):
    W_O, W_out = model.W_O, model.W_out
    if kind == "stream":
        sae = sae_at("topk", "blocks.1.hook_resid_post")
        residual = sae.W_dec
    elif kind == "z":
        sae = sae_at("standard", "blocks.1.attn.hook_z", reshape_activations="hook_z")
        per_head = einops.rearrange(sae.W_dec, "d_sae (head_index d_head) -> d_sae head_index d_head", head_index=4)
        residual = einops.einsum(
            per_head, W_O[1], "d_sae head_index d_head, head_index d_head d_model -> d_sae d_model"
        )
    elif kind == "post":
        sae = sae_at("jumprelu", "blocks.0.mlp.hook_post", d_in=model.cfg.d_mlp)
        residual = sae.W_dec @ W_out[0]
    else:
        sae = sae_at(
            "transcoder", "blocks.1.hook_resid_mid", d_out=D, metadata={"hook_name_out": "blocks.1.hook_mlp_out"}
        )
        residual = sae.W_dec
    effect = feature_logit_effect(model, sae, [3, 0, 47], k=5)
    reference = dense_effect(model, residual[[3, 0, 47]]).detach()
    assert torch.allclose(effect.effect, reference, atol=1e-10)
    assert torch.equal(effect.top_tokens, reference.topk(5, dim=1).indices)
    assert torch.equal(effect.bottom_tokens, reference.topk(5, dim=1, largest=False).indices)
    assert torch.allclose(effect.top_values, reference.topk(5, dim=1).values)


def test_logit_effect_refuses_what_has_none(model):
    from .encoder_helpers import random_mlm

    with pytest.raises(TypeError, match="linear"):
        feature_logit_effect(random_mlm()[0], sae_at("standard", "blocks.0.hook_resid_pre"), 0)
    with pytest.raises(ValueError, match="statistic of its input"):
        feature_logit_effect(
            model, sae_at("standard", "blocks.0.hook_resid_pre", normalize_activations="layer_norm"), 0
        )
    with pytest.raises(ValueError, match="does not reach the residual stream linearly"):
        feature_logit_effect(
            model, sae_at("standard", "blocks.0.attn.hook_q", d_in=8, metadata={"hook_head_index": 1}), 0
        )
    with pytest.raises(ValueError, match=r"ints in \[0, d_sae=48\)"):
        feature_logit_effect(model, sae_at("standard", "blocks.0.hook_resid_pre"), [48])
    assert why_no_logit_effect(model, sae_at("standard", "blocks.0.hook_mlp_out")) is None


# --------------------------------------------------------------------------- attribution on one prompt

PROMPT = "The lighthouse on the northern point had not been lit for"


def write_reference(model, cache, sae, token, incorrect):
    """The DLA of the SAE's hook at the last position, from ``direct_logit_attribution``'s own terms (or written
    out)."""
    dla = direct_logit_attribution(cache, token, incorrect)
    hook, head = sae.hook_name_out or sae.hook_name, sae.cfg.hook_head_index
    for layer in range(model.cfg.n_layers):
        if hook == model.act_name("mlp_out", layer):
            return float(dla.mlp[layer, 0])
        if hook == model.act_name("attn_out", layer):
            return float(dla.attn[layer, 0])
        if hook == model.act_name("z", layer):
            return float(dla.heads[layer, head, 0] if head is not None else dla.heads[layer, :, 0].sum())
    with torch.no_grad():  # a residual-stream hook: the frozen final LayerNorm written out
        resid = cache[hook][0, -1]
        direction = model.W_U[:, token] - model.W_U[:, incorrect]
        return float(((resid - resid.mean()) * model.ln_final.w) @ direction / cache["scale"][0, -1, 0])


ATTRIBUTION_CASES = {
    "resid_pre": lambda: sae_at("standard", "blocks.1.hook_resid_pre"),
    "mlp_out topk": lambda: sae_at("topk", "blocks.0.hook_mlp_out"),
    "attn_out rescaled topk": lambda: sae_at("topk", "blocks.1.hook_attn_out", rescale_acts_by_decoder_norm=True),
    "hook_z": lambda: sae_at("jumprelu", "blocks.1.attn.hook_z", reshape_activations="hook_z"),
    "one head": lambda: sae_at("standard", "blocks.0.attn.hook_z", d_in=8, metadata={"hook_head_index": 2}),
    "skip transcoder": lambda: sae_at(
        "skip_transcoder", "blocks.1.hook_resid_mid", d_out=D, metadata={"hook_name_out": "blocks.1.hook_mlp_out"}
    ),
    "layer_norm input": lambda: sae_at("standard", "blocks.0.hook_resid_post", normalize_activations="layer_norm"),
    "constant_norm_rescale input": lambda: sae_at(
        "gated", "blocks.1.hook_resid_mid", normalize_activations="constant_norm_rescale"
    ),
}


@pytest.mark.parametrize("case", sorted(ATTRIBUTION_CASES))
def test_feature_dla_with_bias_and_error_sums_to_the_hooks_write(model, case):
    sae = ATTRIBUTION_CASES[case]()
    token, incorrect = model.to_tokens(" it", prepend_bos=False)[0, 0], model.to_tokens(" the", prepend_bos=False)[0, 0]
    attribution = feature_attribution(model, sae, PROMPT, int(token), int(incorrect))
    tokens = model.to_tokens(PROMPT)
    _, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        logits = model(tokens)[0, -1]
    assert attribution.metric == pytest.approx(float(logits[token] - logits[incorrect]), abs=1e-10)
    total = float(attribution.direct.sum()) + attribution.bias + attribution.skip + attribution.error
    assert total == pytest.approx(attribution.write, abs=1e-10)
    assert attribution.write == pytest.approx(write_reference(model, cache, sae, int(token), int(incorrect)), abs=1e-10)
    # a random SAE: every term matters
    assert abs(attribution.error) > 1e-3 and abs(float(attribution.direct.sum())) > 1e-4
    assert (attribution.skip != 0) == (case == "skip transcoder")


def test_activation_times_gradient_equals_finite_differences(model):
    sae = sae_at("standard", "blocks.0.hook_resid_post")
    token, incorrect = 1110, 262
    attribution = feature_attribution(model, sae, PROMPT, token, incorrect)
    tokens = model.to_tokens(PROMPT)

    def metric_with(pos, feature, eps):
        def nudge(acts, hook):
            acts = acts.clone()
            acts[0, pos, feature] += eps
            return acts

        with torch.no_grad(), model.saes([sae], use_error_term=True):
            logits = model.run_with_hooks(tokens, fwd_hooks=[(sae.hook_sae_acts_post.name, nudge)])[0, -1]
        return float(logits[token] - logits[incorrect])

    strongest = attribution.act_times_grad.abs().flatten().topk(4).indices
    for index in strongest.tolist():
        pos, feature = divmod(index, sae.d_sae)
        gradient = (metric_with(pos, feature, 1e-5) - metric_with(pos, feature, -1e-5)) / 2e-5
        expected = float(attribution.acts[pos, feature]) * gradient
        assert float(attribution.act_times_grad[pos, feature]) == pytest.approx(expected, rel=1e-5, abs=1e-9)
    assert attribution.top_features(3, by="act_times_grad")[0][0] == int(
        attribution.act_times_grad.sum(0).abs().argmax()
    )


def test_attribution_leaves_nothing_behind_and_checks_its_input(model):
    sae = sae_at("topk", "blocks.0.hook_mlp_out")
    feature_attribution(model, sae, PROMPT, 1110, metric=lambda logits: logits[0, -1].logsumexp(-1))
    assert all(p.grad is None for p in [*model.parameters(), *sae.parameters()])
    assert not any(point.has_hooks() for point in [*model.hook_dict.values(), *sae.hook_dict.values()])
    assert "blocks.0.hook_mlp_out.hook_sae_acts_post" not in model.hook_dict
    with pytest.raises(ValueError, match="one prompt"):
        feature_attribution(model, sae, torch.zeros(2, 5, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="d_vocab"):
        feature_attribution(model, sae, PROMPT, 50257)
    with pytest.raises(ValueError, match="scalar"):
        feature_attribution(model, sae, PROMPT, 1, metric=lambda logits: logits[0, -1])

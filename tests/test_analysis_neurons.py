"""Neuron activations, streaming top-k and direct logit effects against full-tensor references."""

import pytest
import torch

from analysis.readouts import neurons
from interp_transformer import DemoTransformer, TransformerConfig


@pytest.fixture(scope="module")
def model64() -> DemoTransformer:
    cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=48, d_vocab=53, n_ctx=16, init_range=0.2)
    return DemoTransformer(cfg, dtype=torch.float64, seed=2).eval()


def full_topk(activations: torch.Tensor, k: int):
    """Reference: top-k of each neuron over the whole [text, pos, neuron] tensor."""
    n_pos = activations.shape[1]
    flat = activations.permute(2, 0, 1).flatten(1)  # [neuron, text * pos]
    top = flat.topk(k, dim=1)
    return top.values, top.indices // n_pos, top.indices % n_pos


def test_streaming_topk_equals_full_topk():
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(size, 9, 6, generator=generator) for size in (3, 1, 5, 2, 4)]
    tracker = neurons.StreamingTopK(k=7, neurons=6)
    for batch in batches:
        tracker.update(batch)
        assert tracker.values.shape == (6, min(7, tracker.n_texts * 9))  # state never grows past k
    result = tracker.result()
    values, text_index, position = full_topk(torch.cat(batches), 7)
    assert torch.equal(result.values, values)
    assert torch.equal(result.text_index, text_index)
    assert torch.equal(result.position, position)


def test_top_activations_equal_full_cache(model64):
    tokens = torch.randint(0, 53, (11, 10), generator=torch.Generator().manual_seed(1))
    _, cache = model64.run_with_cache(tokens)
    for layer in (0, 1):
        chosen = [0, 17, 47]
        result = neurons.top_activations(model64, tokens, layer, chosen, k=5, batch_size=4)
        values, text_index, position = full_topk(cache["post", layer][..., chosen], 5)
        assert torch.equal(result.neurons, torch.tensor(chosen))
        assert torch.allclose(result.values, values, atol=1e-12)
        assert torch.equal(result.text_index, text_index)
        assert torch.equal(result.position, position)


def test_top_activations_from_an_iterable_of_batches(model64):
    """Batches of different lengths, fed lazily: text indices count across batches."""
    generator = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 53, (2, n_pos), generator=generator) for n_pos in (6, 12, 9)]
    result = neurons.top_activations(model64, iter(batches), layer=1, neurons=5, k=3)
    candidates = []
    for batch_index, batch in enumerate(batches):
        _, cache = model64.run_with_cache(batch)
        post = cache["post", 1][..., 5]
        candidates += [(float(post[b, p]), 2 * batch_index + b, p) for b in range(2) for p in range(batch.shape[1])]
    best = sorted(candidates, reverse=True)[:3]
    assert result.values[0].tolist() == pytest.approx([v for v, _, _ in best], abs=1e-12)
    assert result.text_index[0].tolist() == [t for _, t, _ in best]
    assert result.position[0].tolist() == [p for _, _, p in best]


def test_neuron_activations_and_summary(model64):
    tokens = torch.randint(0, 53, (3, 8), generator=torch.Generator().manual_seed(4))
    _, cache = model64.run_with_cache(tokens)
    assert torch.equal(neurons.neuron_activations(cache, 1), cache["post", 1])
    assert torch.equal(neurons.neuron_activations(cache, -2, neuron=7), cache["post", 0][..., 7])
    summary = neurons.neuron_summary(cache, "max")
    assert summary.shape == (2, 48)
    assert float(summary[1, 3]) == float(cache["post", 1][..., 3].max())
    assert torch.allclose(neurons.neuron_summary(cache, "mean")[0], cache["post", 0].mean(dim=(0, 1)))


def test_neuron_logit_effect_equals_unembedding_of_w_out(model64):
    effect = neurons.neuron_logit_effect(model64, layer=1, neuron=9, k=4)
    with torch.no_grad():
        # reference through the model's own Unembed module: unembed(W_out[n]) - unembed(0)
        direction = model64.blocks[1].mlp.W_out[9].reshape(1, 1, -1)
        reference = (model64.unembed(direction) - model64.unembed(torch.zeros_like(direction)))[0, 0]
    assert torch.allclose(effect.effect, reference)
    order = reference.argsort(descending=True)
    assert torch.equal(effect.top_tokens, order[:4])
    assert torch.equal(effect.bottom_tokens, order.flip(0)[:4])
    assert torch.allclose(effect.top_values, reference[order[:4]])


def test_bad_input(model64, attn_only_model):
    tokens = torch.randint(0, 53, (2, 5), generator=torch.Generator().manual_seed(5))
    _, cache = model64.run_with_cache(tokens, names_filter=["blocks.0.mlp.hook_post"])
    with pytest.raises(KeyError, match=r"blocks\.1\.mlp\.hook_post.*names_filter"):
        neurons.neuron_activations(cache, 1)
    with pytest.raises(ValueError, match="layer=2 is out of range"):
        neurons.neuron_activations(cache, 2)
    with pytest.raises(ValueError, match="neuron=48 is out of range"):
        neurons.neuron_logit_effect(model64, 0, 48)
    with pytest.raises(ValueError, match="attention-only"):
        neurons.top_activations(attn_only_model, tokens, 0)
    with pytest.raises(ValueError, match="statistic"):
        neurons.neuron_summary(cache, "median")
    with pytest.raises(ValueError, match="k must be"):
        neurons.StreamingTopK(0, 3)
    tracker = neurons.StreamingTopK(2, 3)
    with pytest.raises(ValueError, match="this tracker follows 3"):
        tracker.update(torch.randn(1, 2, 4))
    with pytest.raises(ValueError, match="no activations"):
        tracker.result()

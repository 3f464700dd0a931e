"""Attribution patching is the derivative of activation patching: checked against central finite differences.

Patching site ``s`` along ``corrupt + t (clean - corrupt)`` gives a metric ``m(t)``; AtP must equal
``m'(0)``, which ``(m(h) - m(-h)) / 2h`` gives to ``O(h^2)`` in float64.
"""

import pytest
import torch

from analysis.discovery import attribution_patching, logit_diff_per_row, sites
from interp_transformer import TransformerConfig
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.llama.recipe import LlamaConfig

from .perturbed import SMALL_SHAPE as SHAPE
from .perturbed import perturbed_decoder as perturbed

CLEAN = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])
CORRUPTED = torch.tensor([[1, 6, 9, 2, 8, 3], [4, 5, 8, 1, 2, 6]])
METRIC = logit_diff_per_row(torch.tensor([3, 6]), torch.tensor([8, 2]))
STEP = 1e-4


CONFIGS = {
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "llama_gqa": lambda: LlamaConfig(**SHAPE, n_key_value_heads=2),
    "gemma2": lambda: GemmaConfig(**SHAPE, n_key_value_heads=2, post_norms=True, final_softcap=5.0),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return perturbed(CONFIGS[request.param]())


def chosen_sites(model):
    return (
        sites(model, "heads", positions=[1, 4])
        + sites(model, "mlp_out", positions=None)
        + sites(model, "resid_pre", layers=[1], positions=[1])
        + sites(model, "neurons", layers=[0], units=[2, 9], positions=[4])
    )


def moved(model, site, t: float) -> torch.Tensor:
    """The metric with ``site`` set to ``corrupt + t (clean - corrupt)``."""
    _, clean = model.run_with_cache(CLEAN, names_filter=[site.hook])

    def hook(activation, hook):
        where = (slice(None), slice(None) if site.pos is None else site.pos) + site.index
        patched = activation.clone()
        patched[where] = activation[where] + t * (clean[site.hook][where] - activation[where])
        return patched

    with torch.no_grad():
        logits = model.run_with_hooks(CORRUPTED, fwd_hooks=[(site.hook, hook)])
    return METRIC(logits, torch.arange(2))


def test_atp_is_the_derivative_of_patching(model):
    chosen = chosen_sites(model)
    atp = attribution_patching(model, CLEAN, CORRUPTED, METRIC, chosen)
    derivative = torch.stack([(moved(model, s, STEP) - moved(model, s, -STEP)) / (2 * STEP) for s in chosen])
    torch.testing.assert_close(atp, derivative.double(), rtol=1e-6, atol=1e-7)
    # a known answer: a last-layer head at a position other than the metric's last one cannot reach it
    last_layer_early = [i for i, s in enumerate(chosen) if s.layer == 1 and s.pos in (1, 4) and s.index]
    assert bool((atp[last_layer_early] == 0).all())
    assert int((atp.abs() > 1e-6).any(dim=1).sum()) == len(chosen) - len(last_layer_early)  # no vacuous zeros


def test_gradients_flow_through_soft_caps():
    """Gemma 2's capped scores and logits back-propagate: the gradient equals finite differences of the input."""
    model = perturbed(CONFIGS["gemma2"]())
    embed = model.embed(CLEAN).detach().requires_grad_(True)
    direction = torch.randn(embed.shape, generator=torch.Generator().manual_seed(3), dtype=embed.dtype)

    def logit(residual):
        return model.run_with_hooks(CLEAN, fwd_hooks=[("hook_embed", lambda act, hook: residual)])[:, -1, 3].sum()

    (grad,) = torch.autograd.grad(logit(embed), [embed])
    with torch.no_grad():
        step = STEP / 10
        numeric = (logit(embed + step * direction) - logit(embed - step * direction)) / (2 * step)
    torch.testing.assert_close((grad * direction).sum(), numeric, rtol=1e-6, atol=1e-8)


def test_a_metric_that_ignores_the_logits_is_refused():
    model = perturbed(TransformerConfig(**SHAPE))
    clean, corrupted = torch.tensor([[1, 5, 9, 2]]), torch.tensor([[1, 6, 9, 2]])
    with pytest.raises(ValueError, match="do not depend on the logits"):
        attribution_patching(
            model, clean, corrupted, lambda logits, prompt: torch.ones(prompt.shape), sites(model, "heads")
        )


def test_grad_drop_known_answers_on_two_layers():
    """Attention only, 2 blocks: a last-block head's only nonzero term drops block 0, leaving its AtP; a block-0
    head's drops block 1, leaving its direct path to the logits, which is its EAP edge into the logits."""
    from analysis.discovery import edge_attribution_patching

    model = perturbed(TransformerConfig(**dict(SHAPE, d_mlp=None)))
    clean, corrupted = (
        torch.tensor([[1, 5, 9, 2, 7], [3, 3, 8, 1, 0]]),
        torch.tensor([[1, 6, 9, 2, 8], [3, 4, 8, 1, 2]]),
    )
    metric = logit_diff_per_row(torch.tensor([3, 6]), torch.tensor([8, 2]))
    heads = sites(model, "heads")
    drop = attribution_patching(model, clean, corrupted, metric, heads, grad_drop=True)
    atp = attribution_patching(model, clean, corrupted, metric, heads)
    edges = edge_attribution_patching(model, clean, corrupted, metric)
    logits = edges.readers.index("logits")
    for index, site in enumerate(heads):
        if site.layer == 1:
            torch.testing.assert_close(drop[index], atp[index].abs(), rtol=0, atol=1e-10)
        else:
            direct = edges.scores[edges.upstream.index(site.label), logits].abs()
            torch.testing.assert_close(drop[index], direct, rtol=0, atol=1e-10)
    block0 = [i for i, site in enumerate(heads) if site.layer == 0]
    assert not torch.allclose(drop[block0], atp[block0].abs())  # dropping block 1 changes what block 0 reads

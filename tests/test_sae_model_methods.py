"""The splice verbs as model methods: the same results as the functions, and nothing left behind."""

import contextlib

import pytest
import torch

from interp_transformer import DemoTransformer
from interp_transformer.sae import run_with_cache_with_saes, run_with_saes

from .sae_helpers import SPLICE_CFG, random_sae

TOKENS = torch.tensor([[0, 3, 7, 1, 9, 4, 4, 12]])


@pytest.fixture(scope="module")
def model():
    return DemoTransformer(SPLICE_CFG, seed=0).eval()


def _state(model, saes):
    """Everything a splice touches: the hook table, module names, hooks anywhere on the model or the SAEs."""
    hooked = [
        name
        for name, point in model.hook_dict.items()
        if point.has_hooks() or point._forward_hooks or point._forward_pre_hooks
    ]
    sae_hooks = [point.has_hooks() for sae in saes for point in sae.hook_dict.values()]
    return (
        dict(model.hook_dict),
        [name for name, _ in model.named_modules()],
        hooked,
        len(model._forward_hooks) + len(model._forward_pre_hooks),
        sae_hooks,
        [p.grad for p in model.parameters()],
    )


def test_methods_equal_the_functions(model):
    saes = [random_sae("topk", d_in=SPLICE_CFG.d_model, seed=1)]
    with torch.no_grad():
        assert torch.equal(model.run_with_saes(TOKENS, saes=saes), run_with_saes(model, TOKENS, saes=saes))
        logits, cache = model.run_with_cache_with_saes(TOKENS, saes=saes, names_filter=lambda name: "hook_sae" in name)
        reference_logits, reference = run_with_cache_with_saes(
            model, TOKENS, saes=saes, names_filter=lambda name: "hook_sae" in name
        )
        with model.saes(saes, use_error_term=True) as spliced:
            assert spliced is model
            with_error = model(TOKENS)
    assert torch.equal(logits, reference_logits)
    assert list(cache) == list(reference) and all(torch.equal(cache[name], reference[name]) for name in cache)
    assert "blocks.1.hook_resid_pre.hook_sae_acts_post" in cache
    assert torch.allclose(with_error, model(TOKENS), atol=1e-5)  # the error term makes the splice exact
    assert not torch.allclose(logits, model(TOKENS), atol=1e-3)  # the reconstruction alone is not


@pytest.mark.parametrize("raises", [False, True])
def test_methods_leave_nothing_behind(model, raises):
    saes = [
        random_sae("standard", d_in=SPLICE_CFG.d_model, seed=2),
        random_sae("jumprelu", "blocks.0.hook_mlp_out", d_in=16, seed=3),
    ]
    before = _state(model, saes)

    def boom(acts, hook):
        raise RuntimeError("a hook failed")

    hooks = [("blocks.1.hook_resid_pre.hook_sae_acts_post", boom)] if raises else []
    tokens = TOKENS.float() if raises else TOKENS  # float tokens: the forward raises inside the splice
    with (
        pytest.raises(RuntimeError) if raises else contextlib.nullcontext(),
        torch.no_grad(),
        model.saes(saes, exclude_special_tokens=[0]),
    ):
        model.run_with_hooks(TOKENS, fwd_hooks=hooks)
    with pytest.raises(TypeError) if raises else torch.no_grad():
        model.run_with_saes(tokens, saes=saes)
    with pytest.raises(TypeError) if raises else torch.no_grad():
        model.run_with_cache_with_saes(tokens, saes=saes, names_filter=lambda name: "hook_sae" in name)
    after = _state(model, saes)
    assert after == before
    assert after[2] == [] and not any(after[4])
    assert saes[0].hook_sae_acts_post.name == "hook_sae_acts_post"


def test_methods_refuse_what_the_functions_refuse(model):
    with pytest.raises(KeyError, match="closest"):
        model.run_with_saes(TOKENS, saes=[random_sae(hook_name="blocks.1.hook_resid_prex", d_in=SPLICE_CFG.d_model)])
    with pytest.raises(TypeError, match="SAE objects"):
        model.run_with_cache_with_saes(TOKENS, saes=["not an SAE"])
    assert not any(point.has_hooks() for point in model.hook_dict.values())

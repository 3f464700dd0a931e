"""Every weight-processing step of ``HookedTransformer`` leaves the log-probs unchanged, or is refused by name.

Each family is a tiny random model in float64: built from a ``HookedTransformerConfig`` (one
family per kind of part: positions, norms, grouped-query attention, q/k norms, parallel
blocks), or loaded from a tiny Hugging Face model with ``from_pretrained_no_processing``.
Each step of ``process_weights_`` runs alone, then all together; a step that is not refused
must leave the log-probs within 1e-9. ``refactor_factored_attn_matrices`` is refused exactly
where it would change them (``REFUSED``): without the refusal it does change them there.
"""

import pytest
import torch

from interp_transformer import HookedTransformer, HookedTransformerConfig
from interp_transformer.compat import pretrained

from ..classic_helpers import tiny_hf_model as tiny_classic
from ..gpt2_helpers import one_thread, tiny_gpt2  # noqa: F401 (autouse fixture)
from ..llama_helpers import tiny_hf_model as tiny_llama

VOCAB = 30
TOKENS = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
HF_TOKENS = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(2))
GATED = dict(normalization_type="RMS", gated_mlp=True, act_fn="silu")
CONFIG_FAMILIES = {
    "layer-norm": {},
    "shortformer": dict(positional_embedding_type="shortformer"),
    "alibi": dict(positional_embedding_type="alibi"),
    "attn-only": dict(attn_only=True),
    "no-norm": dict(normalization_type=None),
    "rms-gated": GATED,
    "rotary": dict(positional_embedding_type="rotary"),
    "grouped-query": dict(n_key_value_heads=2),
    "qk-norm": dict(use_qk_norm=True),
    "llama-like": dict(GATED, positional_embedding_type="rotary", n_key_value_heads=2),
    "neox-like": dict(positional_embedding_type="rotary", rotary_dim=4, parallel_attn_mlp=True),
}
HF_FAMILIES = {
    "gpt2": lambda: tiny_gpt2(seed=1),
    "llama-mha-biases": lambda: tiny_llama("llama-mha-biases", seed=1),
    "qwen3-gqa3-qk-norm": lambda: tiny_llama("qwen3-gqa3-qk-norm", seed=1),
    "neox-parallel": lambda: tiny_classic("neox-parallel", seed=1),
    "neox-sequential-tied": lambda: tiny_classic("neox-sequential-tied", seed=1),
    "opt-pre-norm": lambda: tiny_classic("opt-pre-norm", seed=1),
}
# the families where refactor_factored_attn_matrices would change the outputs, and the reasons its refusal names
REFUSED = {
    "rotary": ["rotary"],
    "grouped-query": ["grouped-query"],
    "qk-norm": ["q/k norms"],
    "llama-like": ["rotary", "grouped-query"],
    "neox-like": ["rotary"],
    "llama-mha-biases": ["rotary"],
    "qwen3-gqa3-qk-norm": ["rotary", "grouped-query", "q/k norms"],
    "neox-parallel": ["rotary"],
    "neox-sequential-tied": ["rotary"],
}
STEPS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases", "refactor_factored_attn_matrices")


def build(family: str) -> tuple[HookedTransformer, torch.Tensor]:
    """A fresh float64 model of ``family`` with every parameter away from its init, and tokens it reads."""
    if family in HF_FAMILIES:
        return HookedTransformer.from_pretrained_no_processing(HF_FAMILIES[family](), dtype="float64"), HF_TOKENS
    settings = dict(n_layers=2, d_model=24, d_head=6, n_ctx=12, d_vocab=VOCAB, act_fn="gelu", seed=0)
    model = HookedTransformer(HookedTransformerConfig(**{**settings, **CONFIG_FAMILIES[family]}, dtype=torch.float64))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model.eval(), TOKENS


FAMILIES = [*CONFIG_FAMILIES, *HF_FAMILIES]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_step_keeps_the_log_probs_or_is_refused_by_name(family, step):
    model, tokens = build(family)
    with torch.no_grad():
        before = model(tokens)
        flags = {name: name == step for name in STEPS}
        if step == "refactor_factored_attn_matrices" and family in REFUSED:
            with pytest.raises(ValueError, match="would change this model's outputs") as refusal:
                model.process_weights_(**flags)
            assert all(reason in str(refusal.value) for reason in REFUSED[family]), str(refusal.value)
            assert model.processing == [] and torch.equal(model(tokens), before)  # refused before anything changed
            return
        model.process_weights_(**flags)
        torch.testing.assert_close(model(tokens).log_softmax(-1), before.log_softmax(-1), rtol=0, atol=1e-9)
    assert set(model.processing) <= {step}


@pytest.mark.parametrize("family", FAMILIES)
def test_all_steps_together_keep_the_log_probs_or_are_refused(family):
    model, tokens = build(family)
    with torch.no_grad():
        before = model(tokens).log_softmax(-1)
        if family in REFUSED:
            with pytest.raises(AssertionError, match=REFUSED[family][0]):  # also TransformerLens' exception
                model.process_weights_(refactor_factored_attn_matrices=True)
            model.process_weights_()
        else:
            model.process_weights_(refactor_factored_attn_matrices=True)
            assert model.processing[-1] == "refactor_factored_attn_matrices"
        torch.testing.assert_close(model(tokens).log_softmax(-1), before, rtol=0, atol=1e-9)


@pytest.mark.parametrize("family", ["rotary", "grouped-query", "qk-norm"])
def test_without_its_refusal_refactoring_would_change_the_outputs(family, monkeypatch):
    """What the refusal prevents: the balanced factors no longer give the same scores."""
    model, tokens = build(family)
    monkeypatch.setattr(pretrained, "check_refactorable", lambda cfg: None)
    with torch.no_grad():
        before = model(tokens).log_softmax(-1)
        model.refactor_factored_attn_matrices()
        assert (model(tokens).log_softmax(-1) - before).abs().max() > 1e-2


def test_from_pretrained_refuses_it_by_name():
    with pytest.raises(ValueError, match="rotary"):
        HookedTransformer.from_pretrained(tiny_llama("llama-mha-biases", seed=1), refactor_factored_attn_matrices=True)

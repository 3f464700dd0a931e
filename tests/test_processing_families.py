"""Every weight-processing step, on a tiny model of every decoder family, keeps the log-probs or is refused.

The families are the tiny random Hugging Face models of ``tests/*_helpers.py`` (GPT-2,
Llama and its grouped-query, biased, q/k-normed and windowed relatives, GPT-NeoX, GPT-J,
OPT in both layouts, BLOOM, Gemma 1-3, mixtures of experts), loaded in float64 with
``interp_transformer.from_pretrained``. Each step of ``models.processing`` runs alone on a
fresh model: it raises ``ValueError`` (and leaves the model as it was) or the log-probs stay
within 1e-9 of the unprocessed model's. ``REFUSALS`` lists where a step is refused, so that a
refusal that goes missing, or one that appears, fails here too.
"""

import pytest
import torch

from interp_transformer.loading import from_pretrained
from interp_transformer.models import processing

from . import classic_helpers, gemma_helpers, llama_helpers, moe_helpers
from .gpt2_helpers import one_thread, tiny_gpt2  # noqa: F401 (autouse fixture)

TOKENS = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(3))
BUILDERS = {
    "gpt2": lambda seed: tiny_gpt2(seed=seed),
    **{label: (lambda seed, label=label: llama_helpers.tiny_hf_model(label, seed)) for label in llama_helpers.FAMILIES},
    **{
        label: (lambda seed, label=label: classic_helpers.tiny_hf_model(label, seed))
        for label in classic_helpers.FAMILIES
    },
    **{label: (lambda seed, label=label: gemma_helpers.tiny_gemma(label, seed)) for label in gemma_helpers.FAMILIES},
    **{label: (lambda seed, label=label: moe_helpers.tiny_moe(label, seed)) for label in moe_helpers.FAMILIES},
}
RMS = ("center_writing_weights",)  # RMSNorm keeps the mean of the residual stream: centring it would reach the readers
POST_NORM = processing.STEPS  # processing rests on pre-norm algebra
REFUSALS = {
    **{label: RMS for label in llama_helpers.FAMILIES},
    **{label: RMS for label in moe_helpers.FAMILIES},
    "gemma1-gqa2-biases": RMS,
    "gemma2-capped-window": (*RMS, "center_unembed"),  # soft-capped logits do not pass a shift through
    "gemma3-local-rope-capped": (*RMS, "center_unembed"),
    "opt-350m-layout": POST_NORM,
}


@pytest.mark.parametrize("step", processing.STEPS)
@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_each_step_keeps_the_log_probs_or_is_refused(family, step):
    model = from_pretrained(BUILDERS[family](seed=1), dtype=torch.float64)
    with torch.no_grad():
        before = model(TOKENS)
        if step in REFUSALS.get(family, ()):
            with pytest.raises(ValueError, match=step):
                processing.STEP_FUNCTIONS[step](model)
            assert model.processing == [] and torch.equal(model(TOKENS), before)
            return
        processing.STEP_FUNCTIONS[step](model)
        assert model.processing == [step]
        torch.testing.assert_close(model(TOKENS).log_softmax(-1), before.log_softmax(-1), rtol=0, atol=1e-9)

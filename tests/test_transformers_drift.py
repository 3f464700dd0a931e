"""Hugging Face drift: the supported range is stated once, and each change 5.24 brought is answered by name.

transformers 5.24.0 moved GPT-J's rotary table into a module of its own (our reference read
the old attribute and crashed) and changed which field picks Gemma's activation (a config
whose two fields disagreed loaded and computed the other activation). The other cases here
were found by drawing random configs against Hugging Face: each loaded and computed
something else, with no error. Each now matches Hugging Face or is refused by name.
"""

import re
import warnings
from pathlib import Path

import pytest
import tomllib
import torch
import transformers

from interp_transformer.families import versions
from interp_transformer.families.versions import SUPPORTED_TRANSFORMERS, transformers_version_problem
from interp_transformer.loading import CheckpointError, from_pretrained
from interp_transformer.verify import verify_against_hf

from .classic_helpers import tiny_hf_model as tiny_classic
from .encoder_decoder_helpers import hf_config

pytestmark = pytest.mark.hf_parity
ROOT = Path(__file__).resolve().parents[1]


def test_the_supported_range_is_the_one_pyproject_states():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    stated = [re.sub(r"\s", "", d)[len("transformers") :] for d in dependencies if d.startswith("transformers")]
    assert stated == [SUPPORTED_TRANSFORMERS]


def test_the_installed_transformers_is_supported_and_others_are_named():
    assert transformers_version_problem() is None, transformers_version_problem()
    problem = transformers_version_problem("5.25.0")
    assert "5.25.0" in problem and SUPPORTED_TRANSFORMERS in problem
    assert transformers_version_problem("4.57.6") is not None


def test_verify_warns_outside_the_supported_range(monkeypatch):
    model = tiny_classic("gptj-partial")
    ours = from_pretrained(model)
    monkeypatch.setattr(versions, "installed_transformers", lambda: "9.0.0")
    with pytest.warns(UserWarning, match=re.escape(SUPPORTED_TRANSFORMERS)):
        verify_against_hf(ours, model, torch.tensor([[1, 2, 3]]), float64_recheck=False)


@pytest.mark.parametrize("label", ["gptj-partial", "gptj-whole-heads"])
def test_gptj_verifies_hook_by_hook_with_its_rotation(label):
    """5.24 removed GPTJAttention.embed_positions: the reference reads the rotation the model's rotary_emb gives."""
    model = tiny_classic(label).double()
    report = verify_against_hf(from_pretrained(model, dtype=torch.float64), model, torch.tensor([[5, 6, 7, 8, 9]]))
    assert report.ok, report
    assert {"blocks.0.attn.hook_rot_q", "blocks.1.attn.hook_rot_k"} <= {row.hook for row in report.rows}


def test_gptj_without_its_rotary_module_is_refused_naming_the_versions():
    model = tiny_classic("gptj-partial")
    ours = from_pretrained(model)
    del model.transformer.rotary_emb
    with warnings.catch_warnings(), pytest.raises(ValueError, match=re.escape(SUPPORTED_TRANSFORMERS)):
        verify_against_hf(ours, model, torch.tensor([[1, 2, 3]]))


def test_gemma_with_two_activation_fields_that_disagree_is_refused():
    config = transformers.GemmaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=61,
        hidden_act="gelu_pytorch_tanh",
    )
    config.hidden_activation = "relu"
    with pytest.raises(ValueError, match="hidden_act='gelu_pytorch_tanh' and hidden_activation='relu' differ"):
        from_pretrained(transformers.GemmaForCausalLM(config))
    config.hidden_activation = "gelu_pytorch_tanh"  # agreeing fields load
    from_pretrained(transformers.GemmaForCausalLM(config))


def test_bloom_slow_but_exact_with_pretraining_tp_is_refused():
    """Hugging Face's slow path leaves out two biases; its logits were 0.19-0.48 off ours, relative."""
    config = transformers.BloomConfig(hidden_size=16, n_layer=1, n_head=2, pretraining_tp=2, slow_but_exact=True)
    with pytest.raises(ValueError, match="slow_but_exact=True with pretraining_tp=2"):
        from_pretrained(transformers.BloomForCausalLM(config))
    config.slow_but_exact = False  # the fast path computes the same sums with the biases: it loads
    from_pretrained(transformers.BloomForCausalLM(config))


def test_bart_with_separate_token_embeddings_is_refused():
    hf = transformers.BartForConditionalGeneration(hf_config("bart", tie_word_embeddings=False)).eval()
    with torch.no_grad():
        hf.model.decoder.embed_tokens.weight.add_(1.0)
    with pytest.raises(CheckpointError, match="embed_tokens.weight differs from shared.weight"):
        from_pretrained(hf)


def test_marian_with_a_positional_table_of_its_own_is_refused():
    """Hugging Face uses a saved embed_positions.weight as it is; ours computes the sinusoid: another is refused."""
    hf = transformers.MarianMTModel(hf_config("marian")).eval()
    from_pretrained(hf)  # Marian's own sinusoid: it loads
    with torch.no_grad():
        hf.model.encoder.embed_positions.weight.mul_(1.01)
    with pytest.raises(CheckpointError, match="encoder.embed_positions.weight differs from the sinusoidal table"):
        from_pretrained(hf)

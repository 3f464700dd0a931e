"""Every checkpoint tensor is loaded or checked, every config field Hugging Face reads is honoured or refused.

For one tiny float64 model of every family we load, each checkpoint tensor and each config
field is changed in turn (``checkpoint_walk``): our model loaded from the changed Hugging
Face model must still compute its logits, or refuse it by name. This is how BART's
separate token embeddings, Marian's saved positional table and Gemma's two activation
fields were found: each loaded and computed something else, with no error.
"""

import pytest
import torch
import transformers

from . import classic_helpers, gemma_helpers, llama_helpers, moe_helpers
from .checkpoint_walk import Family, config_findings, perturb_all_, tensor_findings
from .encoder_decoder_helpers import hf_class, hf_config
from .encoder_helpers import TINY_BERT

pytestmark = [pytest.mark.hf_parity, pytest.mark.slow]

DECODER_TOKENS = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(0))
SOURCE = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 13, 2, 1, 1, 1]])
DECODER_INPUT = torch.tensor([[3, 20, 21, 22, 23], [3, 24, 25, 26, 27]])


def builder(model_class):
    def build(config):
        torch.manual_seed(0)
        model = perturb_all_(model_class(config), seed=0).double().eval()
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        return model

    return build


def decoder(label: str, model_class, config) -> Family:
    return Family(
        label,
        builder(model_class),
        config,
        dict(input_ids=DECODER_TOKENS),
        lambda ours, inputs: ours(inputs["input_ids"]),
    )


def encoder_decoder(family: str) -> Family:
    config = hf_config(family)
    config._attn_implementation = "eager"
    inputs = dict(input_ids=SOURCE, attention_mask=(SOURCE != 1).long(), decoder_input_ids=DECODER_INPUT)
    return Family(
        family,
        builder(hf_class(family)),
        config,
        inputs,
        lambda ours, x: ours(x["input_ids"], x["decoder_input_ids"], attention_mask=x["attention_mask"]),
    )


def families() -> dict[str, Family]:
    found = {
        "gpt2": decoder(
            "gpt2",
            transformers.GPT2LMHeadModel,
            transformers.GPT2Config(
                n_layer=2, n_embd=32, n_head=4, n_positions=24, vocab_size=61, attn_implementation="eager"
            ),
        )
    }
    for helpers, common in (
        (llama_helpers, llama_helpers.COMMON),
        (gemma_helpers, gemma_helpers.COMMON),
        (moe_helpers, moe_helpers.COMMON),
        (classic_helpers, {}),
    ):
        for label, (model_class, config_class, settings) in helpers.FAMILIES.items():
            found[label] = decoder(label, model_class, config_class(**{**common, **settings}))
    bert = transformers.BertConfig(**TINY_BERT, attn_implementation="eager")
    found["bert-mlm"] = Family(
        "bert-mlm",
        builder(transformers.BertForMaskedLM),
        bert,
        dict(input_ids=DECODER_TOKENS),
        lambda ours, inputs: ours(inputs["input_ids"]),
    )
    for family in ("bart", "marian", "t5-v1.0", "t5-v1.1"):
        found[family] = encoder_decoder(family)
    return found


FAMILIES = families()


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_every_checkpoint_tensor_is_loaded_or_refused(label):
    assert tensor_findings(FAMILIES[label]) == []


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_every_config_field_is_honoured_or_refused(label):
    assert config_findings(FAMILIES[label]) == []


def test_the_walk_finds_a_tensor_that_is_ignored(monkeypatch):
    """The walk itself can fail: a converter that drops the final norm's bias is caught at that tensor."""
    from interp_transformer.families.gpt2 import hf as gpt2_loading

    convert = gpt2_loading.convert_state_dict

    def dropping_ln_f_bias(hf_state_dict, *args, **kwargs):
        ours = convert(hf_state_dict, *args, **kwargs)
        ours["ln_final.b"] = torch.zeros_like(ours["ln_final.b"])
        return ours

    monkeypatch.setattr(gpt2_loading, "convert_state_dict", dropping_ln_f_bias)
    findings = tensor_findings(FAMILIES["gpt2"])
    assert any("ln_f.bias" in finding for finding in findings), findings


def test_the_walk_finds_a_config_field_that_is_ignored(monkeypatch):
    """A converter that reads a fixed epsilon instead of the config's is caught at ``layer_norm_epsilon``."""
    from interp_transformer.families.gpt2 import hf as gpt2_loading

    config_from_hf = gpt2_loading.config_from_hf

    def fixed_eps(hf_config, *args, **kwargs):
        import dataclasses

        return dataclasses.replace(config_from_hf(hf_config, *args, **kwargs), layer_norm_eps=1e-5)

    monkeypatch.setattr(gpt2_loading, "config_from_hf", fixed_eps)
    findings = config_findings(FAMILIES["gpt2"])
    assert any("layer_norm_epsilon" in finding for finding in findings), findings

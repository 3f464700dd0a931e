"""Generation: greedy and beam search give Hugging Face's ``generate`` ids, with a padded source and EOS mid-sequence.

The models are random with wider weights than Hugging Face's init (``init_std``) so that
what they generate depends on the source. The EOS token is chosen as one a row emits at
its second step, so rows finish at different steps and beam search has finished
hypotheses to rank.
"""

import functools

import pytest
import torch

from interp_transformer.loading import from_pretrained

from .encoder_decoder_helpers import EOS, SOURCE, SOURCE_MASK, hf_class, hf_config

# Hugging Face's T5 cannot generate with fewer encoder than decoder layers (its cache counts the encoder's): equal here
WIDER_INIT = {
    "bart": dict(init_std=0.3, scale_embedding=False),
    "marian": dict(init_std=0.6, scale_embedding=True),
    "t5-v1.0": dict(initializer_factor=3.0, num_decoder_layers=2),
    "t5-v1.1": dict(initializer_factor=3.0, num_decoder_layers=2),
}
MAX_NEW = 10


@functools.cache
def generation_models(family: str):
    """``(ours, hf, eos, row)`` in float64 (no near-ties between candidates): greedy ends ``row`` with ``eos`` at step
    2."""
    torch.manual_seed(0)
    hf = hf_class(family)(hf_config(family, **WIDER_INIT[family])).eval().to(torch.float64)
    pilot = hf.generate(SOURCE, attention_mask=SOURCE_MASK, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=EOS)
    start = hf.config.decoder_start_token_id
    row = next(r for r in range(len(pilot)) if int(pilot[r, 2]) not in (start, int(pilot[r, 1])))
    return from_pretrained(hf, dtype=torch.float64), hf, int(pilot[row, 2]), row


def hf_generate(hf, eos, **settings):
    return hf.generate(
        SOURCE, attention_mask=SOURCE_MASK, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, **settings
    )


@pytest.mark.parametrize("family", list(WIDER_INIT))
@pytest.mark.parametrize(
    "settings",
    [
        dict(num_beams=1),
        dict(num_beams=1, forced_eos_token_id="eos"),
        dict(num_beams=4),
        dict(num_beams=4, length_penalty=0.5, early_stopping=True),
        dict(num_beams=4, forced_eos_token_id="eos"),
    ],
    ids=["greedy", "greedy-forced-eos", "beam4", "beam4-early-stopping", "beam4-forced-eos"],
)
def test_generated_ids_equal_hugging_faces(family, settings):
    ours, hf, eos, row = generation_models(family)
    settings = {name: eos if value == "eos" else value for name, value in settings.items()}
    expected = hf_generate(hf, eos, **settings)
    got = ours.generate(SOURCE, SOURCE_MASK, max_new_tokens=MAX_NEW, eos_token_id=eos, **settings)
    assert torch.equal(got, expected), (got, expected)
    if settings["num_beams"] == 1:
        assert got[row, 2] == eos and (got[:, 2] != eos).any()  # rows end at different steps


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_key_value_cache_changes_nothing(num_beams):
    ours, _, eos, _ = generation_models("bart")
    with_cache = ours.generate(SOURCE, SOURCE_MASK, max_new_tokens=MAX_NEW, num_beams=num_beams, eos_token_id=eos)
    without = ours.generate(
        SOURCE, SOURCE_MASK, max_new_tokens=MAX_NEW, num_beams=num_beams, eos_token_id=eos, use_kv_cache=False
    )
    assert torch.equal(with_cache, without)


def test_cross_attention_keys_are_computed_once():
    ours, _, eos, _ = generation_models("marian")
    fired = []
    with ours.hooks(
        fwd_hooks=[
            ("decoder.blocks.0.cross_attn.hook_k", lambda k, hook: fired.append(k.shape)),
            ("decoder.blocks.0.attn.hook_k", lambda k, hook: fired.append(("self", k.shape[1]))),
        ]
    ):
        ids = ours.generate(SOURCE, SOURCE_MASK, max_new_tokens=4, eos_token_id=eos)
    cross = [shape for shape in fired if shape[0] != "self"]
    assert cross == [torch.Size([3, SOURCE.shape[1], 4, 8])]  # the whole source, once
    assert [entry[1] for entry in fired if entry[0] == "self"] == [1] * (ids.shape[1] - 1)  # one new position per step


def test_decoder_start_and_padding_ids_are_the_configs_or_given():
    ours, hf, eos, _ = generation_models("bart")
    ids = ours.generate(SOURCE, SOURCE_MASK, max_new_tokens=3, eos_token_id=eos, decoder_start_token_id=7)
    assert ids[:, 0].tolist() == [7, 7, 7]
    expected = hf_generate(hf, eos, num_beams=1, decoder_start_token_id=7, max_length=None)[:, :4]
    assert torch.equal(ids, expected)

"""The report of an encoder-decoder: which sections it gets, in which order, and what the decoder reads.

The prompt is the source; the decoder reads its own greedy translation (``<s>`` and the
generated tokens, the final EOS left out, so that the last position predicts it) unless
``build_report`` is given ``decoder_input``. Direct logit attribution needs a pre-norm
decoder with a final norm (``capabilities.linear_logits``); a post-norm model (BART,
Marian) gets the other sections and the reason in "Not in this report".
"""

import torch
from torch import Tensor

from .context import ReportContext
from .sections.cross_attention import cross_attention_section
from .sections.decoder_attribution import decoder_attribution_section
from .sections.interpretation import interpretation_section
from .sections.model_card import model_section
from .sections.omitted import omitted_section
from .sections.source_alignment import alignment_section
from .sections.source_patching import source_patching_section
from .sections.translation import translation_section

ENCODER_DECODER_PAGE_ORDER = (
    "model",
    "translation",
    "interpretation",
    "omitted",
    "cross_attention",
    "alignment",
    "attribution",
    "patching",
)
MAX_REPORT_TARGET = 64  # longest translation the report generates


def encoder_decoder_inputs(model, tokens: Tensor, decoder_input: Tensor | None) -> dict:
    """The forward's extra inputs: ``{"decoder_input": ...}`` for an encoder-decoder, ``{}`` for any other model."""
    if not model.writers_that("reads_source"):
        if decoder_input is not None:
            raise ValueError("decoder_input is the target of an encoder-decoder; this model reads no target")
        return {}
    if decoder_input is None:
        generated = model.generate(tokens, max_new_tokens=min(model.cfg.n_ctx - 1, MAX_REPORT_TARGET))
        ends = bool(generated[0, -1] == model.cfg.eos_token_id) and generated.shape[1] > 2
        decoder_input = generated[:, :-1] if ends else generated
    decoder_input = torch.as_tensor(decoder_input)
    decoder_input = decoder_input[None] if decoder_input.ndim == 1 else decoder_input
    if decoder_input.shape[0] != 1:
        raise ValueError(
            f"the report reads one target: decoder_input [pos] or [1, pos], got {tuple(decoder_input.shape)}"
        )
    return {"decoder_input": decoder_input.to(tokens.device)}


def encoder_decoder_builders(ctx: ReportContext) -> list:
    """``(key, builder)`` of an encoder-decoder's sections, in build order (later ones read earlier ones)."""
    builders = [
        ("model", model_section),
        ("translation", translation_section),
        ("alignment", alignment_section),
        ("cross_attention", cross_attention_section),
    ]
    if ctx.model.capabilities.linear_logits:
        builders.append(("attribution", decoder_attribution_section))
    builders += [
        ("patching", source_patching_section),
        ("omitted", omitted_section),
        ("interpretation", interpretation_section),
    ]
    return builders


__all__ = ["ENCODER_DECODER_PAGE_ORDER", "encoder_decoder_builders", "encoder_decoder_inputs"]

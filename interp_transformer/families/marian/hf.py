"""Hugging Face Marian (``MarianMTModel``, the OPUS-MT models) -> ``EncoderDecoderTransformer``.

Marian's modules are BART's (``loading.bart`` gives the weight map), without the
embedding LayerNorms and with fixed sinusoidal positions: ``SinusoidalPosEmbed`` computes
the table. Hugging Face uses a checkpoint's ``embed_positions.weight`` when one is saved,
so a saved table is checked against the sinusoid (within the rounding of the dtype it is
stored in) and a checkpoint whose table differs is refused, naming it. The
token embedding must be shared by both stacks (``share_encoder_decoder_embeddings``, the
default); separate source and target vocabularies are refused.
"""

from collections.abc import Mapping

import torch
from torch import Tensor

from interp_transformer.core.strict import CheckpointError
from interp_transformer.families.bart.hf import (
    check_model_type,
    common_config_fields,
    convert_body,
    record_bart_family,
    run_seq2seq,
)
from interp_transformer.families.marian.recipe import MarianConfig
from interp_transformer.families.reference import Recorder
from interp_transformer.parts.sinusoidal import sinusoidal_table

SUPPORTED_MODEL_TYPES = ("marian",)
VERIFY_PADDED = True
POSITIONS = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")


def config_from_hf(hf_config) -> MarianConfig:
    """Our ``MarianConfig`` from a Hugging Face ``MarianConfig``; ``ValueError`` for variants we do not compute."""
    check_model_type(hf_config, SUPPORTED_MODEL_TYPES)
    if not getattr(hf_config, "share_encoder_decoder_embeddings", True):
        raise ValueError(
            "share_encoder_decoder_embeddings=False (separate source and target embeddings) is not supported"
        )
    decoder_vocab = getattr(hf_config, "decoder_vocab_size", None) or hf_config.vocab_size
    if decoder_vocab != hf_config.vocab_size:
        raise ValueError(
            f"decoder_vocab_size={decoder_vocab} differs from vocab_size={hf_config.vocab_size}: not supported"
        )
    return MarianConfig(**common_config_fields(hf_config))


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: MarianConfig) -> dict[str, Tensor]:
    """Hugging Face Marian state dict -> ours. Pure: the input is not changed."""
    if not isinstance(cfg, MarianConfig):
        raise TypeError(f"cfg must be a MarianConfig, got {type(cfg).__name__}")
    ours, names = convert_body(
        hf_state_dict, cfg, what="Marian checkpoint", positions=cfg.n_ctx, embed_ln=False, optional=POSITIONS
    )
    table = sinusoidal_table(torch.arange(cfg.n_ctx), cfg.d_model).double()
    for name in POSITIONS:
        if name in names:
            check_table(hf_state_dict[names[name]], table, name)
    return ours


def check_table(saved: Tensor, table: Tensor, name: str) -> None:
    """``CheckpointError`` unless a saved positional table is Marian's sinusoid, to the rounding of its dtype.

    Both tables are rounded from the same float64 angles, so they differ by at most one unit
    in the last place of the dtype the checkpoint stores (``finfo.eps`` for values in [-1, 1]).
    """
    tolerance = torch.finfo(saved.dtype).eps if saved.is_floating_point() else 0.0
    gap = (saved.double() - table).abs().max().item()
    if not gap <= tolerance:
        raise CheckpointError(
            f"Marian checkpoint: {name} differs from the sinusoidal table Marian computes by up to "
            f"{gap:.3g} (tolerance {tolerance:.3g}, the rounding of {saved.dtype}); Hugging Face "
            "would use the saved table, a learned or altered positional table is not supported"
        )


def load_hf_model(directory, *, dtype=torch.float32):
    """The Hugging Face reference of a Marian directory: ``MarianMTModel``, eager attention."""
    from transformers import MarianMTModel

    return MarianMTModel.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager").eval()


def hf_reference_activations(
    hf_model, tokens: Tensor, attention_mask: Tensor | None = None, decoder_input: Tensor | None = None
) -> dict[str, Tensor]:
    """Hugging Face Marian's value for each of our hooks (every one but the attention scores), and ``"logits"``."""
    body = getattr(hf_model, "model", hf_model)
    recorder = Recorder()
    record_bart_family(
        recorder, body, hf_model.config.encoder_attention_heads, tokens.shape[0], embed_scale=body.encoder.embed_scale
    )
    return run_seq2seq(hf_model, recorder, tokens, attention_mask, decoder_input)


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "hf_reference_activations",
    "load_hf_model",
]

"""Tiny random Hugging Face encoder-decoders with every parameter perturbed away from its init, and padded inputs.

A dropped bias, a LayerNorm weight read as 1 or a final-logits bias left out would all go
unnoticed with Hugging Face's init (zeros and ones); the perturbation makes each one show.
Marian's sinusoidal table is not a weight (it is recomputed, never learned) and stays as is.
"""

import functools

import torch

# vocabulary 50: padding 1, EOS 2, decoder start 3 (the same ids for every family, so inputs can be shared)
PAD, EOS, START = 1, 2, 3
# T5's relative buckets are exact below 4 (decoder: 8) positions and logarithmic up to 12: the 13-token source and
# 16-token target reach every kind of bucket, the last one included
T5_SOURCE = torch.tensor(
    [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 2], [11, 12, 13, 2] + [1] * 9, [14, 15, 16, 17, 18, 2] + [1] * 7]
)
T5_DECODER_INPUT = torch.stack([torch.tensor([3] + list(range(20 + row, 35 + row))) for row in range(3)])
SOURCE = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 13, 2, 1, 1, 1], [14, 15, 16, 17, 2, 1, 1]])
SOURCE_MASK = (SOURCE != PAD).long()
DECODER_INPUT = torch.tensor([[3, 20, 21, 22, 23], [3, 24, 25, 26, 27], [3, 28, 29, 30, 31]])
FAMILIES = ("bart", "marian", "t5-v1.0", "t5-v1.1")


def _perturb(hf, seed: int, scale: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "embed_positions" in name and hf.config.model_type == "marian":
                continue
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * scale)
        for name, buffer in hf.named_buffers():
            if name == "final_logits_bias":
                buffer.add_(torch.randn(buffer.shape, generator=generator, dtype=buffer.dtype) * scale)


def hf_config(family: str, **overrides):
    import transformers

    common = dict(
        vocab_size=50,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=24,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=START,
        forced_eos_token_id=None,
    )
    if family == "bart":
        return transformers.BartConfig(**{**common, "scale_embedding": True, **overrides})
    if family == "marian":
        return transformers.MarianConfig(
            **{**common, "activation_function": "swish", "scale_embedding": True, **overrides}
        )
    if family.startswith("t5"):
        v1_1 = family == "t5-v1.1"  # gated GELU and a read-out of its own, not rescaled
        t5 = dict(
            vocab_size=50,
            d_model=32,
            d_kv=8,
            d_ff=48,
            num_layers=2,
            num_decoder_layers=3,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=12,
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=START,
            feed_forward_proj="gated-gelu" if v1_1 else "relu",
            tie_word_embeddings=not v1_1,
        )
        return transformers.T5Config(**{**t5, **overrides})
    raise ValueError(family)


def inputs(family: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(source, source_mask, decoder_input)`` for a family: longer ones for T5, to reach its far buckets."""
    source, decoder_input = (T5_SOURCE, T5_DECODER_INPUT) if family.startswith("t5") else (SOURCE, DECODER_INPUT)
    return source, (source != PAD).long(), decoder_input


def hf_class(family: str):
    import transformers

    classes = {"bart": transformers.BartForConditionalGeneration, "marian": transformers.MarianMTModel}
    return classes.get(family, transformers.T5ForConditionalGeneration)


@functools.cache
def random_hf(family: str, dtype: torch.dtype = torch.float64, seed: int = 0, scale: float = 0.0):
    """A perturbed ``BartForConditionalGeneration``, ``MarianMTModel`` or ``T5ForConditionalGeneration`` (eval mode);
    tests must not change it. ``scale`` 0 means the family's default: 0.3, or 0.1 for T5, whose unscaled scores and
    unnormalized MLP outputs grow fast enough that float32 rounding alone would pass 1e-4 with wider weights."""
    scale = scale or (0.1 if family.startswith("t5") else 0.3)
    torch.manual_seed(seed)
    hf = hf_class(family)(hf_config(family)).eval()
    # Hugging Face ties the read-out to the embedding: give it its own, as v1.1 checkpoints have
    if family == "t5-v1.1":
        hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
    _perturb(hf, seed, scale)
    return hf.to(dtype)


@functools.cache
def converted(family: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    """``(ours, hf)`` for a random family model."""
    from interp_transformer.loading import from_pretrained

    hf = random_hf(family, dtype, seed)
    return from_pretrained(hf, dtype=dtype), hf

"""Tiny random Hugging Face encoder-decoders with every parameter perturbed away from its init, and padded inputs.

A dropped bias, a LayerNorm weight read as 1 or a final-logits bias left out would all go
unnoticed with Hugging Face's init (zeros and ones); the perturbation makes each one show.
Marian's sinusoidal table is not a weight (it is recomputed, never learned) and stays as is.
"""

import functools

import torch

# vocabulary 50: padding 1, EOS 2, decoder start 3 (the same ids for every family, so inputs can be shared)
PAD, EOS, START = 1, 2, 3
SOURCE = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 13, 2, 1, 1, 1], [14, 15, 16, 17, 2, 1, 1]])
SOURCE_MASK = (SOURCE != PAD).long()
DECODER_INPUT = torch.tensor([[3, 20, 21, 22, 23], [3, 24, 25, 26, 27], [3, 28, 29, 30, 31]])
FAMILIES = ("bart", "marian")


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

    common = dict(vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=24,
                  pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=START, forced_eos_token_id=None)
    if family == "bart":
        return transformers.BartConfig(**{**common, "scale_embedding": True, **overrides})
    if family == "marian":
        return transformers.MarianConfig(**{**common, "activation_function": "swish", "scale_embedding": True, **overrides})
    raise ValueError(family)


@functools.lru_cache(maxsize=None)
def random_hf(family: str, dtype: torch.dtype = torch.float64, seed: int = 0, scale: float = 0.3):
    """A perturbed ``BartForConditionalGeneration`` or ``MarianMTModel`` (eval mode); tests must not change it."""
    import transformers

    classes = {"bart": transformers.BartForConditionalGeneration, "marian": transformers.MarianMTModel}
    torch.manual_seed(seed)
    hf = classes[family](hf_config(family)).eval()
    _perturb(hf, seed, scale)
    return hf.to(dtype)


@functools.lru_cache(maxsize=None)
def converted(family: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    """``(ours, hf)`` for a random family model."""
    from interp_transformer.loading import from_pretrained

    hf = random_hf(family, dtype, seed)
    return from_pretrained(hf, dtype=dtype), hf

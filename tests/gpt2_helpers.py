"""Random-weight Hugging Face GPT-2 models for parity tests.

Hugging Face initialises LayerNorm to (w=1, b=0) and every bias to 0, which
would let a converter that drops or misplaces a bias or a LayerNorm weight pass.
``randomize_`` gives every tensor non-trivial values, so each one matters.
"""

import logging

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

# Small vocabularies make GPT2Config warn that GPT-2's bos/eos id 50256 is out of range.
logging.getLogger("transformers.configuration_utils").setLevel(logging.ERROR)


def randomize_(hf_model, seed: int, scale: float = 0.1):
    """Give every LayerNorm weight, LayerNorm bias and bias random values (in place)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype) * scale
            if name.endswith("bias") or (name.endswith("weight") and param.ndim == 1):
                param.add_(noise)
    return hf_model


def tiny_gpt2(seed: int = 0, **overrides) -> GPT2LMHeadModel:
    """A small random GPT-2 (eager attention, eval mode) with randomized biases and LayerNorms."""
    settings = dict(n_layer=2, n_embd=32, n_head=4, n_positions=24, vocab_size=61, attn_implementation="eager")
    settings.update(overrides)
    torch.manual_seed(seed)
    return randomize_(GPT2LMHeadModel(GPT2Config(**settings)), seed).eval()


def random_tokens(vocab_size: int, batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Run a module's tiny-model tests on one thread: for tensors this small, synchronising a thread
    pool costs more than it saves, and much more when other processes keep the cores busy."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

"""The MLP's activation functions, by name: each formula written once.

==============  ==========================================================  ===============================
name            ``post = act(pre)``                                         used by
==============  ==========================================================  ===============================
``relu``        ``max(0, x)``                                               OPT, the original Transformer
``gelu``        ``x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))`` (exact)         Pythia / GPT-NeoX, BERT, nanoGPT
``gelu_new``    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``         GPT-2, GPT-J
``gelu_fast``   ``0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))``     some GPT-NeoX configs
``bloom_gelu``  ``0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2)))``       BLOOM
``quick_gelu``  ``x sigmoid(1.702 x)``                                      some GPT-NeoX configs, CLIP
``silu``        ``x sigmoid(x)``                                            the Llama family's gate
==============  ==========================================================  ===============================

The three tanh forms approximate the exact GELU to about 1e-3 and differ from each other
by their rounded constant: ``gelu_fast`` and ``bloom_gelu`` keep the constant their
checkpoints were trained with (``sqrt(2/pi) = 0.7978845608028654``), so that a float64
model agrees with the original to float64 rounding. A model that mixes up the exact GELU
and a tanh form differs by up to ~1e-3 per neuron, which a test on real (not zero-bias)
weights sees at once.
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's GELU: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, by torch's fused tanh-approximate GELU."""
    return F.gelu(x, approximate="tanh")


def gelu_new_reference(x: Tensor) -> Tensor:
    """The formula of ``gelu_new`` written out, as the reference for tests."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: Tensor) -> Tensor:
    """``0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))``: ``gelu_new`` with its constant rounded to 10 digits."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def bloom_gelu(x: Tensor) -> Tensor:
    """BLOOM's GELU: ``0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2)))``, its constant rounded to 8 digits."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)))


def quick_gelu(x: Tensor) -> Tensor:
    """``x sigmoid(1.702 x)``."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_new": gelu_new,
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "gelu_fast": gelu_fast,
    "bloom_gelu": bloom_gelu,
    "quick_gelu": quick_gelu,
    "gelu_pytorch_tanh": gelu_new,  # Hugging Face's name of gelu_new
}

__all__ = ["ACTIVATIONS", "bloom_gelu", "gelu_fast", "gelu_new", "gelu_new_reference", "quick_gelu"]

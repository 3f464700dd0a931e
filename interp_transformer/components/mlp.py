import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from ..shape_checks import shape_checked
from .affine import affine


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's GELU: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Computed by torch's fused tanh-approximate GELU, which is this formula.
    """
    return F.gelu(x, approximate="tanh")


def gelu_new_reference(x: Tensor) -> Tensor:
    """The formula of ``gelu_new`` written out, as the reference for tests."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: Tensor) -> Tensor:
    """``0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))``: ``gelu_new`` arranged differently (TransformerLens' name)."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


# gelu_pytorch_tanh is Hugging Face's name of gelu_new
ACTIVATIONS = {"gelu_new": gelu_new, "gelu": F.gelu, "relu": F.relu, "silu": F.silu, "gelu_fast": gelu_fast,
               "gelu_pytorch_tanh": gelu_new}


class MLP(nn.Module):
    """Two-layer MLP: ``pre = x W_in + b_in``, ``post = act(pre)``, ``out = post W_out + b_out``."""

    def __init__(self, cfg):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def input_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W, b)`` pairs that read this part's input: what folding a norm into it rewrites."""
        return [(self.W_in, self.b_in)]

    def output_weights(self) -> list[Tensor]:
        """Weights whose last axis is ``d_model``: what this part writes to the residual stream."""
        return [self.W_out, self.b_out]

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        # affine(x, W, b) is einsum(x, W, "batch pos d_in, d_in d_out -> batch pos d_out") + b
        pre = self.hook_pre(affine(normalized, self.W_in, self.b_in))
        post = self.hook_post(self.act_fn(pre))
        return affine(post, self.W_out, self.b_out)

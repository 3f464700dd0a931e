import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint

# importable from here, as before
from interp_transformer.parts.activations import ACTIVATIONS, gelu_new, gelu_new_reference  # noqa: F401
from interp_transformer.parts.affine import affine
from interp_transformer.parts.writers import NeuronWrites


def mlp_weights(cfg) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter, nn.Parameter]:
    """``W_in [d_model, d_mlp]``, ``b_in [d_mlp]``, ``W_out [d_mlp, d_model]``, ``b_out [d_model]``, in that order: the
    weights every MLP part reads in and writes out with (the matrices uninitialized, the biases 0)."""
    return (
        nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp)),
        nn.Parameter(torch.zeros(cfg.d_mlp)),
        nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model)),
        nn.Parameter(torch.zeros(cfg.d_model)),
    )


class MLP(NeuronWrites, nn.Module):
    """Two-layer MLP: ``pre = x W_in + b_in``, ``post = act(pre)``, ``out = post W_out + b_out``."""

    def __init__(self, cfg):
        super().__init__()
        self.W_in, self.b_in, self.W_out, self.b_out = mlp_weights(cfg)
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def input_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W, b)`` pairs that read this part's input: what folding a norm into it rewrites."""
        return [(self.W_in, self.b_in)]

    def input_hooks(self) -> list[str]:
        """The hook holding ``x W + b`` for each pair of ``input_weights()``, in the same order."""
        return [self.hook_pre.name]

    def output_weights(self) -> list[Tensor]:
        """Weights whose last axis is ``d_model``: what this part writes to the residual stream."""
        return [self.W_out, self.b_out]

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        # affine(x, W, b) is einsum(x, W, "batch pos d_in, d_in d_out -> batch pos d_out") + b
        pre = self.hook_pre(affine(normalized, self.W_in, self.b_in))
        post = self.hook_post(self.act_fn(pre))
        return affine(post, self.W_out, self.b_out)

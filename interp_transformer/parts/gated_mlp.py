"""Gated MLP (SwiGLU and its relatives): the activation of one projection gates another.

::

    pre        = x W_gate                 (the gate's pre-activation; no bias)
    pre_linear = x W_in + b_in            (the "up" projection)
    post       = act(pre) * pre_linear
    out        = post W_out + b_out

Names follow TransformerLens' ``GatedMLP``: ``hook_pre`` is the gate (what ``act`` reads,
as ``hook_pre`` is in a plain MLP), ``hook_pre_linear`` the up projection, ``hook_post``
the gated product, one entry per neuron. Hugging Face calls the three matrices
``gate_proj``, ``up_proj`` and ``down_proj``.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.activations import ACTIVATIONS
from interp_transformer.parts.affine import affine
from interp_transformer.parts.mlp import mlp_weights
from interp_transformer.parts.writers import NeuronWrites


class GatedMLP(NeuronWrites, nn.Module):
    """``out = (act(x W_gate) * (x W_in + b_in)) W_out + b_out`` (see the module docstring)."""

    def __init__(self, cfg):
        super().__init__()
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_in, self.b_in, self.W_out, self.b_out = mlp_weights(cfg)
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def input_weights(self) -> list[tuple[Tensor, Tensor | None]]:
        """``(W, b)`` pairs that read this part's input: what folding a norm into it rewrites.

        The gate has no bias (``None``): a norm with a bias cannot be folded into it, and
        ``fold_ln`` refuses that; RMSNorm has no bias, so it folds.
        """
        return [(self.W_gate, None), (self.W_in, self.b_in)]

    def input_hooks(self) -> list[str]:
        """The hook holding ``x W (+ b)`` for each pair of ``input_weights()``, in the same order."""
        return [self.hook_pre.name, self.hook_pre_linear.name]

    def output_weights(self) -> list[Tensor]:
        """Weights whose last axis is ``d_model``: what this part writes to the residual stream."""
        return [self.W_out, self.b_out]

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        # x @ W is einsum(x, W, "batch pos d_model, d_model d_mlp -> batch pos d_mlp"); affine adds the bias
        pre = self.hook_pre(normalized @ self.W_gate)
        pre_linear = self.hook_pre_linear(affine(normalized, self.W_in, self.b_in))
        post = self.hook_post(self.act_fn(pre) * pre_linear)
        return affine(post, self.W_out, self.b_out)


__all__ = ["GatedMLP"]

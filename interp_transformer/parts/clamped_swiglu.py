"""Clamped SwiGLU (gpt-oss's experts): a gated MLP whose gate and up projection are clipped and biased.

::

    pre        = x W_gate + b_gate                         (the gate's pre-activation)
    pre_linear = x W_in + b_in                             (the "up" projection)
    gate       = min(pre, limit)
    up         = clamp(pre_linear, -limit, limit)
    post       = (up + 1) * gate * sigmoid(alpha * gate)
    out        = post W_out + b_out

``alpha`` (Hugging Face's ``swiglu_alpha``, 1.702) is the sigmoid's gain, so the gate's
activation is a SiLU with gain ``alpha``; ``limit`` (``swiglu_limit``, 7) clips the gate from
above and the up projection on both sides. Hooks as in ``GatedMLP``: ``hook_pre`` is the
gate before its clip, ``hook_pre_linear`` the up projection before its clip, ``hook_post``
the gated product, one entry per neuron.

How it differs from ``GatedMLP``: the gate has a bias, both inputs are clipped, and the up
projection enters as ``up + 1``. Hugging Face stores the gate and up projections of all
experts in one tensor, ``gate_up_proj [expert, d_model, 2 d_mlp]``, their columns interleaved
(gate, up, gate, up, ...); the converter splits them.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.affine import affine
from interp_transformer.parts.mlp import mlp_weights
from interp_transformer.parts.writers import NeuronWrites


class ClampedSwiGLU(NeuronWrites, nn.Module):
    """``out = ((clamp(x W_in + b_in) + 1) * g * sigmoid(alpha g)) W_out + b_out``, ``g = min(x W_gate + b_gate,
    limit)`` (see the module docstring).

    ``cfg`` gives ``d_model``, ``d_mlp``, ``swiglu_alpha`` and ``swiglu_limit``.
    """

    def __init__(self, cfg):
        super().__init__()
        alpha, limit = cfg.swiglu_alpha, cfg.swiglu_limit
        for name, value in (("swiglu_alpha", alpha), ("swiglu_limit", limit)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        self.alpha, self.limit = float(alpha), float(limit)
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_gate = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_in, self.b_in, self.W_out, self.b_out = mlp_weights(cfg)
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def input_weights(self) -> list[tuple[Tensor, Tensor | None]]:
        """``(W, b)`` pairs that read this part's input: what folding a norm into it rewrites."""
        return [(self.W_gate, self.b_gate), (self.W_in, self.b_in)]

    def input_hooks(self) -> list[str]:
        """The hook holding ``x W + b`` for each pair of ``input_weights()``, in the same order."""
        return [self.hook_pre.name, self.hook_pre_linear.name]

    def output_weights(self) -> list[Tensor]:
        """Weights whose last axis is ``d_model``: what this part writes to the residual stream."""
        return [self.W_out, self.b_out]

    def activation(
        self, pre: Float[Tensor, "... d_mlp"], pre_linear: Float[Tensor, "... d_mlp"]
    ) -> Float[Tensor, "... d_mlp"]:
        """``post`` from the two pre-activations: both clipped, then ``(up + 1) * gate * sigmoid(alpha * gate)``."""
        gate = pre.clamp(max=self.limit)
        up = pre_linear.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return (up + 1) * glu

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        # affine(x, W, b) is einsum(x, W, "batch pos d_model, d_model d_mlp -> batch pos d_mlp") + b
        pre = self.hook_pre(affine(normalized, self.W_gate, self.b_gate))
        pre_linear = self.hook_pre_linear(affine(normalized, self.W_in, self.b_in))
        post = self.hook_post(self.activation(pre, pre_linear))
        return affine(post, self.W_out, self.b_out)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, limit={self.limit}"


__all__ = ["ClampedSwiGLU"]

"""A tanh-gated bottleneck adapter, a writer a decoder block runs beside its MLP.

The adapter (LLaMA-Adapter's and Flamingo's zero-initialised gate on a bottleneck MLP)::

    pre  = x W_down + b_down          [..., d_adapter]     (hook_pre)
    post = act(pre)                                        (hook_post)
    out  = tanh(gate) * (post W_up + b_up)

``gate`` starts at 0, so a freshly added adapter writes nothing until it is trained.

It is a writer of the residual stream of its own kind (``parts.writers``): its units
are its ``d_adapter`` bottleneck units, each writing ``tanh(gate) * post_u W_up[u]``, and its
bias write is ``tanh(gate) * b_up``. It answers the writer questions itself
(``write_units``, ``bias_hooks``, ``bias_write``), with the gate folded in, so direct logit
attribution, ``decompose_resid`` and the report split it exactly without knowing it exists.

A ``PreNormBlock`` runs it beside the MLP (``beside_mlp={"adapter": adapter}``), reading the MLP's
normalized input::

    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid)) + adapter(ln2(resid_mid))
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.activations import ACTIVATIONS
from interp_transformer.parts.affine import affine
from interp_transformer.parts.writers import Reader, Units


class GatedAdapter(nn.Module):
    """``tanh(gate) * (act(x W_down + b_down) W_up + b_up)`` (see the module docstring)."""

    routes_tokens = False

    axis_sizes = {"d_model": "W_down[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(self, d_model: int, d_adapter: int, act_fn: str):
        super().__init__()
        if act_fn not in ACTIVATIONS:
            raise ValueError(f"act_fn must be one of {sorted(ACTIVATIONS)}, got {act_fn!r}")
        self.W_down = nn.Parameter(torch.empty(d_model, d_adapter))
        self.b_down = nn.Parameter(torch.zeros(d_adapter))
        self.W_up = nn.Parameter(torch.empty(d_adapter, d_model))
        self.b_up = nn.Parameter(torch.zeros(d_model))
        self.gate = nn.Parameter(torch.zeros(()))
        self.act_fn = ACTIVATIONS[act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def input_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W, b)`` pairs that read this part's input: what folding a norm into it rewrites."""
        return [(self.W_down, self.b_down)]

    def output_weights(self) -> list[Tensor]:
        """Weights whose last axis is ``d_model`` (the gate scales them all alike)."""
        return [self.W_up, self.b_up]

    # --- as a writer of the residual stream ---------------------------------------------------
    def write_units(self) -> Units:
        """The bottleneck units, each writing ``tanh(gate) * post_u W_up[u]``."""
        return Units("neuron", self.hook_post.name, torch.tanh(self.gate) * self.W_up, "A")

    def bias_hooks(self) -> list[str]:
        return []

    def bias_write(self, at: Reader) -> Tensor:
        return torch.tanh(self.gate) * self.b_up

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        # affine(x, W, b) is einsum(x, W, "batch pos d_in, d_in d_out -> batch pos d_out") + b
        pre = self.hook_pre(affine(normalized, self.W_down, self.b_down))
        post = self.hook_post(self.act_fn(pre))
        return torch.tanh(self.gate) * affine(post, self.W_up, self.b_up)

    def extra_repr(self) -> str:
        return f"d_adapter={self.W_down.shape[1]}"


__all__ = ["GatedAdapter"]

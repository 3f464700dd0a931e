"""A mixture of plain experts with a router bias, against the same mixture written from scratch in plain PyTorch.

The design: a router with a bias, softmax over every expert, the top k, their weights renormalized,
and experts that are two-layer MLPs with biases (Linear-GELU-Linear). Both of our paths (every
expert on every token, and each expert on its own tokens) equal the from-scratch mixture.
"""

import pytest
import torch
from torch import nn

from interp_transformer.parts import MLP
from interp_transformer.parts.moe import MixtureOfExperts


class ScratchMoE(nn.Module):
    """The design as one would write it: nn.Linear router with a bias, nn.Sequential experts."""

    def __init__(self, d_model: int, d_mlp: int, n_experts: int, top_k: int):
        super().__init__()
        self.router = nn.Linear(d_model, n_experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model)) for _ in range(n_experts)
        )
        self.top_k = top_k

    def forward(self, x):
        weights = self.router(x).softmax(dim=-1)
        top, index = weights.topk(self.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for slot in range(self.top_k):
            for number, expert in enumerate(self.experts):
                chosen = (index[..., slot] == number)[..., None]
                out = out + torch.where(chosen, top[..., slot, None] * expert(x), 0.0)
        return out


def mapped(scratch: ScratchMoE) -> MixtureOfExperts:
    d_model, n_experts = scratch.router.in_features, scratch.router.out_features
    d_mlp = scratch.experts[0][0].out_features
    ours = MixtureOfExperts(d_model, d_mlp, n_experts, scratch.top_k, "gelu", True, expert_part=MLP, router_bias=True)
    with torch.no_grad():
        ours.W_router.copy_(scratch.router.weight.T)
        ours.b_router.copy_(scratch.router.bias)
        for expert, (first, _, second) in zip(ours.experts, scratch.experts):
            expert.W_in.copy_(first.weight.T)
            expert.b_in.copy_(first.bias)
            expert.W_out.copy_(second.weight.T)
            expert.b_out.copy_(second.bias)
    return ours.double()


def test_plain_experts_with_a_router_bias_equal_the_design_written_from_scratch():
    torch.manual_seed(0)
    scratch = ScratchMoE(d_model=12, d_mlp=20, n_experts=5, top_k=2).double()
    ours = mapped(scratch)
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    expected = scratch(x)
    for sparse in (True, False):
        ours.use_sparse_experts = sparse
        torch.testing.assert_close(ours(x), expected, atol=1e-12, rtol=0)
    without_bias = mapped(scratch)
    with torch.no_grad():
        without_bias.b_router.zero_()
    assert (without_bias(x) - expected).abs().max() > 1e-3  # the router's bias matters: not a vacuous pass
    with pytest.raises(KeyError, match="these experts are MLPs, which have no W_gate"):
        ours.stacked("W_gate")
    assert ours.stacked("b_in").shape == (5, 20)


def test_bad_expert_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="experts_per_token=6 must be at most n_experts=5"):
        MixtureOfExperts(12, 20, 5, 6, "gelu", True, expert_part=MLP)
    with pytest.raises(ValueError, match="expert_part must be an MLP part class"):
        MixtureOfExperts(12, 20, 5, 2, "gelu", True, expert_part="mlp")
    with pytest.raises(ValueError, match="router_bias must be a bool"):
        MixtureOfExperts(12, 20, 5, 2, "gelu", True, router_bias=1)

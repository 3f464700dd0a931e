import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts.affine import affine


class Unembed(nn.Module):
    """Logits from the final normalized residual: ``logits = x W_U + b_U``."""

    softcap = None  # logits are not soft-capped (components.softcap.SoftCappedUnembed sets a cap)

    def __init__(self, cfg):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    def input_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W_U, b_U)``: what folding the final norm into the read-out rewrites."""
        return [(self.W_U, self.b_U)]

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        # einsum(normalized, W_U, "batch pos d_model, d_model d_vocab -> batch pos d_vocab") + b_U
        return affine(normalized, self.W_U, self.b_U)

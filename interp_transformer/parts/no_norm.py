"""``NoNorm``: the identity where an architecture has no norm, with the same small algebra as the norms.

A post-norm decoder has no final norm before its read-out, and TransformerLens'
``normalization_type=None`` models have none anywhere. ``NoNorm`` fills that place in a
block or model so that the forward stays the same formula; it has no parameters and no
hooks (there is no scale to observe), and its algebra is the identity's: frozen, it is
``x``; a direction pulls back to itself; nothing is folded.
"""

from jaxtyping import Float
from torch import Tensor, nn


class NoNorm(nn.Module):
    """``normalized = x``: no normalization (see the module docstring)."""

    removes_mean = False

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return x

    def apply_frozen(
        self, x: Float[Tensor, "... d_model"], scale: Tensor | None = None
    ) -> Float[Tensor, "... d_model"]:
        return x

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        return x

    def pull_back(
        self, direction: Float[Tensor, "... d_model"], scale: Tensor | None = None
    ) -> Float[Tensor, "... d_model"]:
        return direction

    def bias_term(self, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        return direction.new_zeros(direction.shape[:-1])

    def fold_into(self, W: Tensor, b_next: Tensor | None, center: bool = False) -> None:
        if center:
            raise ValueError("centring the weights that read an unnormalized stream would change the output")

    def reset(self) -> None:
        pass

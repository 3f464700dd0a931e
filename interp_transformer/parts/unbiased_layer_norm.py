"""The Annotated Transformer's LayerNorm: divide by the unbiased standard deviation plus eps.

::

    scale      = std_unbiased(x) + eps = sqrt(sum((x - mean(x))^2) / (d_model - 1)) + eps
    normalized = (x - mean(x)) / scale * w + b

Two differences from ``LayerNorm`` (PyTorch's ``nn.LayerNorm``, GPT-2's): the variance is
divided by ``d_model - 1`` (Bessel's correction, ``torch.std``'s default), and ``eps`` is
added to the standard deviation, not under the square root. Tutorials that write
LayerNorm by hand (``a_2 * (x - mean) / (std + eps) + b_2``) compute this one; loading
their weights into a ``LayerNorm`` would be wrong by a factor ``sqrt(d_model / (d_model - 1))``
and by where ``eps`` sits.

Once the scale is frozen the two norms are the same affine map, ``(x - mean(x)) / scale *
w + b``, so the algebra every tool reads through (``apply_frozen``, ``pull_back``,
``bias_term``, ``fold_into``, ``reset``, ``removes_mean``; see ``components.layer_norm``) is
``LayerNorm``'s, inherited; only the scale, ``forward`` and ``normalize`` are this norm's
own. There is no fused kernel for it: ``forward`` always runs the formula above and
always fires ``hook_scale``.
"""

from jaxtyping import Float
from torch import Tensor

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts.layer_norm import LayerNorm


def unbiased_scale(x: Float[Tensor, "... d_model"], eps: float) -> Float[Tensor, "... 1"]:
    """``std_unbiased(x) + eps`` over the last axis: ``sqrt(sum((x - mean)^2) / (d_model - 1)) + eps``."""
    return x.std(dim=-1, keepdim=True, unbiased=True) + eps


class UnbiasedLayerNorm(LayerNorm):
    """``normalized = (x - mean(x)) / (std_unbiased(x) + eps) * w + b`` (see the module docstring)."""

    def __init__(self, d_model: int, eps: float):
        if d_model < 2:
            raise ValueError(f"an unbiased standard deviation needs d_model >= 2, got {d_model}")
        super().__init__(d_model, eps)

    def uses_fused_path(self) -> bool:
        """Always False: ``forward`` runs the explicit formula."""
        return False

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        scale = self.hook_scale(unbiased_scale(x, self.eps))
        return self.hook_normalized((x - x.mean(dim=-1, keepdim=True)) / scale * self.w + self.b)

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole norm of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return (x - x.mean(dim=-1, keepdim=True)) / unbiased_scale(x, self.eps) * self.w + self.b

    def extra_repr(self) -> str:
        return f"d_model={self.w.shape[0]}, eps={self.eps}, std=unbiased (eps added to the std)"


__all__ = ["UnbiasedLayerNorm", "unbiased_scale"]

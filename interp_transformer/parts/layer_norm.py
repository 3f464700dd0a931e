"""LayerNorm, and the algebra every norm part provides for the tools that read through it.

A norm ``N`` with its scale frozen to a cached value is affine in its input, which is
what the cache's residual tools, direct logit attribution and weight processing rely
on. Each norm part answers, for itself (so no other file re-derives its formula):

=============================  =============================================================
``apply_frozen(x, scale)``     ``N(x)`` with the scale given instead of computed, bias left
                               out: a sum of components stays a sum of their images
``normalize(x)``               the whole ``N(x)``, scale recomputed, without firing hooks
``pull_back(d, scale)``        the direction ``g`` with ``(N(x) - b) . d = x . g`` (frozen scale)
``bias_term(d)``               ``b . d``: what the bias adds along ``d``
``fold_into(W, b_next, ...)``  fold ``w`` and ``b`` into weights ``W [..., d_model, d_out]``
                               that read ``N``'s output, then become the identity scaling
``removes_mean``               whether ``N`` subtracts the mean (what centring relies on)
=============================  =============================================================
"""

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint


class LayerNorm(nn.Module):
    """LayerNorm over ``d_model``: ``normalized = (x - mean(x)) / scale * w + b``.

    ``hook_scale`` is ``sqrt(mean((x - mean(x))^2) + eps)``, shape ``[batch, pos, 1]``;
    ``hook_normalized`` is the output, after ``w`` and ``b``. Freezing ``scale``
    (reading it from a cache) makes LayerNorm affine in ``x``, which is what
    direct logit attribution relies on.

    The explicit formula is the reference and the only path that produces ``scale``;
    while nothing hooks or caches ``hook_scale``, PyTorch's fused ``layer_norm``
    (the same formula in one pass) runs instead. ``uses_fused_path()`` decides.
    """

    removes_mean = True

    axis_sizes = {"d_model": "w[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.use_fused_layer_norm = True  # set False to always run the explicit path

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scale."""
        return self.use_fused_layer_norm and not self.hook_scale.has_hooks()

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.uses_fused_path():
            return self.hook_normalized(F.layer_norm(x, self.w.shape, self.w, self.b, self.eps))
        x = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)

    # --- the algebra (see the module docstring) ---------------------------------------------
    def apply_frozen(
        self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]
    ) -> Float[Tensor, "... d_model"]:
        """``(x - mean(x)) / scale * w``: the norm with ``scale`` frozen, bias left out."""
        return (x - x.mean(dim=-1, keepdim=True)) / scale * self.w

    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole LayerNorm of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return F.layer_norm(x, self.w.shape, self.w, self.b, self.eps)

    def pull_back(
        self, direction: Float[Tensor, "... d_model"], scale: Tensor | None = None
    ) -> Float[Tensor, "... d_model"]:
        """``g = (w * d - mean(w * d)) / scale``, so that ``apply_frozen(x, scale) . d = x . g``.

        The centring moves from ``x`` onto the direction; ``scale`` (broadcast against the
        result) may be left out to divide later.
        """
        weighted = direction * self.w
        pulled = weighted - weighted.mean(dim=-1, keepdim=True)
        return pulled if scale is None else pulled / scale

    def bias_term(self, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """``b . d``: what the bias adds along ``direction``."""
        return direction @ self.b

    @torch.no_grad()
    def fold_into(self, W: Tensor, b_next: Tensor, center: bool = True) -> None:
        """In place: ``b_next += b W`` and ``W <- diag(w) W`` for ``W [..., d_model, d_out]``, ``b_next [..., d_out]``.

        With ``center`` the folded ``W`` also loses its mean over ``d_model``, which changes
        nothing: it only ever reads ``x - mean(x)``. Call ``reset()`` once every reader is folded.
        """
        b_next.add_(einops.einsum(self.b, W, "d_model, ... d_model d_out -> ... d_out"))
        W.mul_(einops.rearrange(self.w, "d_model -> d_model 1"))
        if center:
            W.sub_(W.mean(dim=-2, keepdim=True))

    @torch.no_grad()
    def reset(self) -> None:
        """``w = 1``, ``b = 0``: what the norm holds once folded into its readers."""
        self.w.fill_(1.0)
        self.b.zero_()

    def extra_repr(self) -> str:
        return f"d_model={self.w.shape[0]}, eps={self.eps}"

"""RMSNorm: LayerNorm without the centring and without a bias, with the same algebra protocol.

``normalized = x / scale * w`` with ``scale = sqrt(mean(x^2) + eps)`` over ``d_model``
(Llama, Mistral, Qwen). It answers the questions tools ask of a norm exactly as
``LayerNorm`` does (see ``interp_transformer.parts.layer_norm``):

=============================  =============================================================
``apply_frozen(x, scale)``     ``x / scale * w``: linear in ``x`` once the scale is frozen
``normalize(x)``               the whole ``x / sqrt(mean(x^2) + eps) * w``, no hook fires
``pull_back(d, scale)``        ``w * d / scale``: ``apply_frozen(x, scale) . d = x . pull_back(d, scale)``
``bias_term(d)``               0: there is no bias
``fold_into(W, b_next, ...)``  ``W <- diag(w) W``; ``b_next`` is untouched (nothing to fold into it)
``removes_mean``               False: the mean of ``x`` reaches every reader, so centring the
                               weights that read or write the stream would change the output
=============================  =============================================================

How it differs from LayerNorm: no ``x - mean(x)`` and no ``b``. How it differs from
TransformerLens' ``RMSNorm``: ``hook_normalized`` is taken **after** ``w`` (as for our
LayerNorm, and as Hugging Face's norm outputs), not before it.
"""

from typing import TYPE_CHECKING, Any

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint


class RMSAlgebra:
    """The algebra an RMS norm answers through its gain ``w`` (``RMSNorm``'s parameter, Gemma's ``1 + w_offset``):
    no centring and no bias. The part holds ``w``, ``hook_scale`` and ``use_fused_rms_norm``."""

    if TYPE_CHECKING:  # a mixin of the part class: it reads that class's attributes

        def __getattr__(self, name: str) -> Any: ...

    removes_mean = False

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scale."""
        return self.use_fused_rms_norm and not self.hook_scale.has_hooks()

    def apply_frozen(
        self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]
    ) -> Float[Tensor, "... d_model"]:
        """``x / scale * w``: the norm with ``scale`` frozen (there is no bias to leave out)."""
        return x / scale * self.w

    def pull_back(
        self, direction: Float[Tensor, "... d_model"], scale: Tensor | None = None
    ) -> Float[Tensor, "... d_model"]:
        """``g = w * d / scale``, so that ``apply_frozen(x, scale) . d = x . g``; ``scale`` may be left out to divide
        later."""
        weighted = direction * self.w
        return weighted if scale is None else weighted / scale

    def bias_term(self, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """0 for every direction: the norm has no bias."""
        return direction.new_zeros(direction.shape[:-1])

    @torch.no_grad()
    def fold_into(self, W: Tensor, b_next: Tensor | None, center: bool = False) -> None:
        """In place: ``W <- diag(w) W`` for ``W [..., d_model, d_out]``; ``b_next`` is left as it is (no bias to fold).

        ``center`` is refused: the norm does not subtract the mean, so the mean over
        ``d_model`` of the folded weights does reach the output. Call ``reset()`` once
        every reader is folded.
        """
        if center:
            raise ValueError(
                f"{type(self).__name__} cannot fold with center=True: it does not subtract the mean of its input, so "
                "removing the mean of the weights that read it would change the output; fold with center=False"
            )
        W.mul_(einops.rearrange(self.w, "d_model -> d_model 1"))


class RMSNorm(RMSAlgebra, nn.Module):
    """RMSNorm over the last axis: ``normalized = x / sqrt(mean(x^2) + eps) * w``.

    ``hook_scale`` is ``sqrt(mean(x^2) + eps)``, shape ``[batch, pos, 1]`` (``[batch, pos,
    head_index, 1]`` for a norm over each head's ``d_head``, as Qwen3's q/k norms);
    ``hook_normalized`` is the output, after ``w``. The explicit formula is the reference
    and the only path that produces the scale; while nothing hooks or caches
    ``hook_scale``, PyTorch's fused ``rms_norm`` (the same formula) runs instead.
    ``uses_fused_path()`` decides.
    """

    axis_sizes = {"d_model": "w[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.use_fused_rms_norm = True  # set False to always run the explicit path

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        if self.uses_fused_path():
            return self.hook_normalized(F.rms_norm(x, self.w.shape, self.w, self.eps))
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w)

    # --- the algebra (see the module docstring; the rest is RMSAlgebra's) ------------------
    def normalize(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The whole RMSNorm of ``x``, its scale computed from ``x`` itself; no hook fires."""
        return F.rms_norm(x, self.w.shape, self.w, self.eps)

    @torch.no_grad()
    def reset(self) -> None:
        """``w = 1``: what the norm holds once folded into its readers."""
        self.w.fill_(1.0)

    def extra_repr(self) -> str:
        return f"d_model={self.w.shape[0]}, eps={self.eps}"


__all__ = ["RMSAlgebra", "RMSNorm"]

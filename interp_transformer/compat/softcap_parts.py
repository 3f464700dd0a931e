"""Soft-capped parts of TransformerLens-compatible models: ``attn_scores_soft_cap`` and ``output_logits_soft_cap``.

TransformerLens' Gemma 2 caps the attention scores before the mask and the softmax, and the
logits after the read-out, each as ``cap * tanh(x / cap)``. These parts are the compatibility
layer's attention and read-out with the core's soft-capping (``components.softcap``):

==================================  ==========================================================
``SoftCappedSplitInputAttention``   ``SplitInputAttention`` whose scores are capped:
                                    ``hook_attn_scores_uncapped`` holds ``q . k * scale``,
                                    ``hook_attn_scores`` the capped scores (masked keys
                                    ``-inf``), as TransformerLens' ``hook_attn_scores``
``SoftCappedResultAttention``       the same with ``hook_result`` (``use_attn_result``)
``SoftCappedHookedUnembed``         ``HookedUnembed`` whose logits are capped:
                                    ``unembed.hook_in`` (the final normalized residual),
                                    ``unembed.hook_logits_uncapped`` (``x W_U + b_U``),
                                    ``unembed.hook_out`` (the capped logits)
==================================  ==========================================================
"""

from jaxtyping import Float
from torch import Tensor

from interp_transformer.compat.parts import HookedUnembed, ResultAttention, SplitInputAttention
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts import Unembed
from interp_transformer.parts.softcap import SoftCappedAttention, check_softcap, soft_cap


class SoftCappedSplitInputAttention(SplitInputAttention, SoftCappedAttention):
    """``SplitInputAttention`` with ``SoftCappedAttention``'s scores: ``pattern = softmax(cap * tanh(scores / cap))``.

    Built as ``SoftCappedAttention`` is (its arguments, plus ``softcap``); called as
    ``SplitInputAttention`` is (one input, or TransformerLens' ``query_input=`` ...).
    """

    def with_result_hook(self) -> "SoftCappedResultAttention":
        return SoftCappedResultAttention.adopt(self)


class SoftCappedResultAttention(ResultAttention, SoftCappedSplitInputAttention):
    """``SoftCappedSplitInputAttention`` with ``hook_result``: each head's write ``z_h W_O[h]``."""

    plain_kind = SoftCappedSplitInputAttention


class SoftCappedHookedUnembed(HookedUnembed):
    """``logits = hook_out(cap * tanh(hook_logits_uncapped(hook_in(normalized) W_U + b_U) / cap))``."""

    def __init__(self, cfg, softcap: float):
        super().__init__(cfg)
        self.softcap = check_softcap(softcap)
        self.hook_logits_uncapped = HookPoint()
        self._modules["hook_out"] = self._modules.pop("hook_out")  # registered in the order they fire

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        uncapped = self.hook_logits_uncapped(Unembed.forward(self, self.hook_in(normalized)))
        return self.hook_out(soft_cap(uncapped, self.softcap))

    def extra_repr(self) -> str:
        return f"softcap={self.softcap}"


__all__ = ["SoftCappedHookedUnembed", "SoftCappedResultAttention", "SoftCappedSplitInputAttention"]

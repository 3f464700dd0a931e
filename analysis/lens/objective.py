"""KL(final distribution || lens distribution) per token, and its gradient, without keeping ``[token, d_vocab]``.

The read-out is ``logits = cap(z W_U + b_U)`` with ``z`` the final norm's output, so for a target ``p``::

    KL(p || softmax(logits)) = sum_v p_v log p_v - sum_v p_v logits_v + logsumexp(logits)
    d KL / d logits = softmax(logits) - p                 (times cap'(.) = 1 - tanh^2 under a soft-cap)
    d KL / d z      = (d KL / d logits) W_U^T

``ReadOutKL`` computes the value and ``d KL / d z`` in one pass over the vocabulary, so training holds one
``[chunk, d_vocab]`` block at a time and autograd only sees ``z`` (the final norm and the translator before it).
The two products with ``W_U`` may run in a cheaper ``matmul_dtype`` (bfloat16: several times faster on CPUs with
AMX); the softmax, the KL and the gradient's accumulation stay in float32. Evaluation does not use this path: it
reads the exact logits (``translators.read_out``).
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class FinalDistribution:
    """The model's own next-token distribution at ``N`` tokens: ``p [N, d_vocab]`` (float32), ``p_log_p [N]``
    (``sum_v p_v log p_v``, minus its entropy) and its ``top1 [N]``."""

    p: Tensor
    p_log_p: Tensor
    top1: Tensor

    @classmethod
    def from_logits(cls, logits: Tensor) -> "FinalDistribution":
        log_p = logits.to(_at_least_float32(logits.dtype)).log_softmax(dim=-1)
        p = log_p.exp()
        p_log_p = torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(-1)
        return cls(p, p_log_p, logits.argmax(dim=-1))

    def __getitem__(self, rows: slice) -> "FinalDistribution":
        return FinalDistribution(self.p[rows], self.p_log_p[rows], self.top1[rows])


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class ReadOutKL(torch.autograd.Function):
    """``kl [N]`` of the read-out of ``z [N, d_model]`` to ``target``; backward returns the saved ``d kl / d z``."""

    @staticmethod
    def forward(ctx, z: Tensor, W_U: Tensor, b_U: Tensor, cap: float | None, target: FinalDistribution):
        dtype = _at_least_float32(z.dtype)
        logits = (z.detach().to(W_U.dtype) @ W_U).to(dtype) + b_U.to(dtype)
        tanh = None
        if cap is not None:
            tanh = torch.tanh(logits / cap)
            logits = cap * tanh
        lse = torch.logsumexp(logits, dim=-1)
        kl = target.p_log_p - (target.p * logits).sum(-1) + lse
        if ctx.needs_input_grad[0]:
            grad = logits.sub_(lse[:, None]).exp_().sub_(target.p)
            if tanh is not None:
                grad.mul_(1 - tanh.square_())
            ctx.save_for_backward((grad.to(W_U.dtype) @ W_U.T).to(z.dtype))
        return kl.to(z.dtype)

    @staticmethod
    def backward(ctx, grad_kl: Tensor):
        (grad_z,) = ctx.saved_tensors
        return grad_kl[:, None] * grad_z, None, None, None, None


def read_out_kl(model, z: Tensor, target: FinalDistribution, W_U: Tensor | None = None) -> Tensor:
    """``KL(target || read-out of z)`` per row of ``z [N, d_model]`` (the final norm's output), differentiable in
    ``z``; ``W_U`` is the model's read-out matrix, or a copy of it in a cheaper dtype."""
    return ReadOutKL.apply(z, model.W_U if W_U is None else W_U, model.b_U, model.read_out.softcap, target)


__all__ = ["FinalDistribution", "ReadOutKL", "read_out_kl"]

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.affine import affine
from interp_transformer.parts.softcap import check_softcap, soft_cap


class Unembed(nn.Module):
    """Logits from the final normalized residual: ``logits = x W_U + b_U``.

    Options, each adding its hooks only when given, in the order they fire:

    - ``in_out_hooks`` (TransformerLens 3): ``hook_in`` holds the final normalized residual
      ``[batch, pos, d_model]``, ``hook_out`` the logits ``[batch, pos, d_vocab]``;
    - ``softcap`` (Gemma 2, a number > 0): ``logits = cap * tanh((x W_U + b_U) / cap)``, with
      ``hook_logits_uncapped`` holding ``x W_U + b_U`` (``parts.softcap``). ``softcap`` is None without a cap:
      what tools ask of the read-out.
    """

    axis_sizes = {"d_model": "W_U[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(self, cfg, softcap: float | None = None, *, in_out_hooks: bool = False):
        super().__init__()
        if not isinstance(in_out_hooks, bool):
            raise TypeError(f"in_out_hooks must be a bool, got {in_out_hooks!r}")
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))
        self.softcap = None if softcap is None else check_softcap(softcap)
        self.in_out_hooks = in_out_hooks
        if in_out_hooks:
            self.hook_in = HookPoint()
        if self.softcap is not None:
            self.hook_logits_uncapped = HookPoint()
        if in_out_hooks:
            self.hook_out = HookPoint()

    def input_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W_U, b_U)``: what folding the final norm into the read-out rewrites."""
        return [(self.W_U, self.b_U)]

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        if self.in_out_hooks:
            normalized = self.hook_in(normalized)
        # einsum(normalized, W_U, "batch pos d_model, d_model d_vocab -> batch pos d_vocab") + b_U
        logits = affine(normalized, self.W_U, self.b_U)
        if self.softcap is not None:
            logits = soft_cap(self.hook_logits_uncapped(logits), self.softcap)
        return self.hook_out(logits) if self.in_out_hooks else logits

    def extra_repr(self) -> str:
        return "" if self.softcap is None else f"softcap={self.softcap}"

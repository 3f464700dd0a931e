"""Parallel blocks: attention and MLP both read the block's input, and both write to the stream at once.

=============================  ===================================================================
``ParallelBlock``              GPT-NeoX, Pythia: ``resid_post = resid_pre + attn(ln1(resid_pre))
                               + mlp(ln2(resid_pre))``, two norms of the same input
``SharedNormParallelBlock``    GPT-J: ``normalized = ln1(resid_pre)``, ``resid_post = resid_pre
                               + attn(normalized) + mlp(normalized)``, one norm read by both
=============================  ===================================================================

Neither block has a residual mid-point: the MLP never sees ``resid_pre + attn_out``, so
there is no ``hook_resid_mid`` (an invented value would be a sum nothing computes). The
identities that hold instead: ``resid_post = resid_pre + attn_out + mlp_out``, and the
residual stream is still the sum of every component's write (the blocks are pre-norm).

``ln2`` of a ``ParallelBlock`` normalizes ``resid_pre``, not a mid-point. A
``SharedNormParallelBlock`` has no ``ln2`` at all; its ``norm_readers()`` lists ``ln1``
twice, once with each reader, so that folding the norm (``fold_ln``) folds it into both.
How this differs from TransformerLens: TransformerLens' GPT-J copies ``ln1``'s weights into
an ``ln2`` computed a second time; here the one norm is computed once and hooked once.
"""

from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.writers import Step, StreamBlock, Writer


class ParallelBlock(StreamBlock):
    """``resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln2(resid_pre))`` (GPT-NeoX; see the module docstring)."""

    def __init__(self, ln1: nn.Module, attn: nn.Module, ln2: nn.Module, mlp: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.ln2 = ln2
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(norm, part)``: each norm and the part that reads its output (what ``fold_ln`` folds into)."""
        return [(self.ln1, self.attn), (self.ln2, self.mlp)]

    def stream(self) -> list[Step]:
        """Attention's and the MLP's writes (both read the same block input)."""
        return [Writer("attn", self.attn, self.hook_attn_out.name), Writer("mlp", self.mlp, self.hook_mlp_out.name)]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre), layout, kv_cache))
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_pre)))
        return self.hook_resid_post(resid_pre + attn_out + mlp_out)


class SharedNormParallelBlock(StreamBlock):
    """``resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln1(resid_pre))``, ``ln1`` computed once (GPT-J)."""

    def __init__(self, ln1: nn.Module, attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(ln1, attn)`` and ``(ln1, mlp)``: the one norm has two readers, and folding it must reach both."""
        return [(self.ln1, self.attn), (self.ln1, self.mlp)]

    def stream(self) -> list[Step]:
        """Attention's and the MLP's writes (both read the same block input)."""
        return [Writer("attn", self.attn, self.hook_attn_out.name), Writer("mlp", self.mlp, self.hook_mlp_out.name)]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        normalized = self.ln1(resid_pre)
        attn_out = self.hook_attn_out(self.attn(normalized, layout, kv_cache))
        mlp_out = self.hook_mlp_out(self.mlp(normalized))
        return self.hook_resid_post(resid_pre + attn_out + mlp_out)


__all__ = ["ParallelBlock", "SharedNormParallelBlock"]

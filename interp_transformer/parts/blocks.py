"""Transformer blocks: each is built from its parts and its forward is the block's formula.

A block takes its norm, attention and MLP parts already built (an architecture module
picks them), registers them in forward order (so ``named_modules()`` lists hooks as
they fire) and adds the residual-stream hooks of DESIGN section 3 around them.

=====================  ============================================================
``TransformerBlock``   pre-norm: ``resid_mid = resid_pre + attn(ln1(resid_pre))``,
                       ``resid_post = resid_mid + mlp(ln2(resid_mid))``
``AttnOnlyBlock``      pre-norm, no MLP: ``resid_post = resid_pre + attn(ln1(resid_pre))``
``PostNormBlock``      post-norm (BERT): the norms act on the stream itself, after each sum
=====================  ============================================================
"""

from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.writers import Step, StreamBlock, StreamNorm, Writer


class TransformerBlock(StreamBlock):
    """Pre-norm block: ``resid_mid = resid_pre + attn(ln1(resid_pre))``, ``resid_post = resid_mid +
    mlp(ln2(resid_mid))``."""

    def __init__(self, ln1: nn.Module, attn: nn.Module, ln2: nn.Module, mlp: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln2 = ln2
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(norm, part)``: each norm and the part that reads its output (what ``fold_ln`` folds into)."""
        return [(self.ln1, self.attn), (self.ln2, self.mlp)]

    def stream(self) -> list[Step]:
        """The residual stream's steps: what is added to it, in forward order."""
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
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


class AttnOnlyBlock(StreamBlock):
    """Attention-only block (no MLP): ``resid_post = resid_pre + attn(ln1(resid_pre))``.

    There is no ``hook_resid_mid``: with no MLP it would equal ``hook_resid_post``.
    """

    def __init__(self, ln1: nn.Module, attn: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(norm, part)``: each norm and the part that reads its output (what ``fold_ln`` folds into)."""
        return [(self.ln1, self.attn)]

    def stream(self) -> list[Step]:
        """The residual stream's steps: what is added to it, in forward order."""
        return [Writer("attn", self.attn, self.hook_attn_out.name)]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre), layout, kv_cache))
        return self.hook_resid_post(resid_pre + attn_out)


class PostNormBlock(StreamBlock):
    """Post-norm block (BERT): the norms renormalize the residual stream itself.

    ``resid_mid = resid_pre + attn(resid_pre)``; ``ln1`` normalizes it, and that
    normalized stream is what the MLP reads *and* what the MLP's output is added to:
    ``resid_post = ln1(resid_mid) + mlp(ln1(resid_mid))``; the block's output is
    ``normalized_resid_post = ln2(resid_post)``, the next block's ``resid_pre``.
    Unlike a pre-norm block, the stream is renormalized twice per block, so
    ``resid_post != resid_mid + mlp_out`` (it is ``ln1.hook_normalized + mlp_out``).
    """

    def __init__(self, attn: nn.Module, ln1: nn.Module, mlp: nn.Module, ln2: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln1 = ln1
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()
        self.ln2 = ln2
        self.hook_normalized_resid_post = HookPoint()

    def stream(self) -> list[Step]:
        """Attention's write, ``ln1`` renormalizing the stream, the MLP's write, ``ln2`` renormalizing it."""
        return [
            Writer("attn", self.attn, self.hook_attn_out.name),
            StreamNorm("ln1", self.ln1, self.hook_resid_mid.name),
            Writer("mlp", self.mlp, self.hook_mlp_out.name),
            StreamNorm("ln2", self.ln2, self.hook_resid_post.name),
        ]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(resid_pre, layout, kv_cache))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        normalized_resid_mid = self.ln1(resid_mid)
        mlp_out = self.hook_mlp_out(self.mlp(normalized_resid_mid))
        resid_post = self.hook_resid_post(normalized_resid_mid + mlp_out)
        return self.hook_normalized_resid_post(self.ln2(resid_post))


__all__ = ["AttnOnlyBlock", "PostNormBlock", "TransformerBlock"]

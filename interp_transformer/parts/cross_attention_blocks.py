"""Decoder blocks of an encoder-decoder: self-attention, then cross-attention over the encoder's output, then the MLP.

Each sub-layer adds to the residual stream; what differs is where the norms sit.
Names follow TransformerLens' ``HookedEncoderDecoder``: ``ln1`` goes with self-attention,
``ln2`` with cross-attention, ``ln3`` with the MLP; ``hook_cross_attn_out`` and
``hook_resid_mid_cross`` are the cross-attention's write and the stream after it.

=====================================  ============================================================
``CrossAttentionBlock`` (pre-norm)     ``resid_mid = resid_pre + attn(ln1(resid_pre))``
(T5, the pre-LN Transformer)           ``resid_mid_cross = resid_mid + cross_attn(ln2(resid_mid), encoder_out)``
                                       ``resid_post = resid_mid_cross + mlp(ln3(resid_mid_cross))``
``PostNormCrossAttentionBlock``        ``resid_mid = resid_pre + attn(resid_pre)``
(BART, Marian, the original            ``resid_mid_cross = ln1(resid_mid) + cross_attn(ln1(resid_mid), encoder_out)``
Transformer)                           ``resid_post = ln2(resid_mid_cross) + mlp(ln2(resid_mid_cross))``
                                       ``normalized_resid_post = ln3(resid_post)``, the block's output
=====================================  ============================================================

In the pre-norm block the stream is the sum of every write (``resid_post = resid_pre +
attn_out + cross_attn_out + mlp_out``); in the post-norm block, as in ``PostNormBlock``, it
is renormalized after each sub-layer, so ``resid_mid_cross`` starts from ``ln1(resid_mid)``.
"""

from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.cross_attention import CrossAttentionSource, DecoderLayerKVCache
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.writers import Step, StreamBlock, StreamNorm, Writer


def _caches(kv_cache: DecoderLayerKVCache | None):
    return (None, None) if kv_cache is None else (kv_cache.self_attn, kv_cache.cross_attn)


def _check_source(source) -> CrossAttentionSource:
    if not isinstance(source, CrossAttentionSource):
        raise TypeError(
            f"a decoder block reads the encoder through a CrossAttentionSource, got {type(source).__name__}"
        )
    return source


class CrossAttentionBlock(StreamBlock):
    """Pre-norm decoder block with cross-attention (see the module docstring)."""

    def __init__(
        self, ln1: nn.Module, attn: nn.Module, ln2: nn.Module, cross_attn: nn.Module, ln3: nn.Module, mlp: nn.Module
    ):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln2 = ln2
        self.cross_attn = cross_attn
        self.hook_cross_attn_out = HookPoint()
        self.hook_resid_mid_cross = HookPoint()
        self.ln3 = ln3
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(norm, part)``: each norm and the part that reads its output (cross-attention reads it only through
        ``W_Q``)."""
        return [(self.ln1, self.attn), (self.ln2, self.cross_attn), (self.ln3, self.mlp)]

    def stream(self) -> list[Step]:
        """The residual stream's steps: what is added to it, in forward order."""
        return [
            Writer("attn", self.attn, self.hook_attn_out.name),
            Writer("cross_attn", self.cross_attn, self.hook_cross_attn_out.name, reads_source=True),
            Writer("mlp", self.mlp, self.hook_mlp_out.name),
        ]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout,
        source: CrossAttentionSource,
        kv_cache: DecoderLayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        self_cache, cross_cache = _caches(kv_cache)
        source = _check_source(source)
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre), layout, self_cache))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        cross_attn_out = self.hook_cross_attn_out(
            self.cross_attn(self.ln2(resid_mid), source.layout(layout), cross_cache, source.encoder_out)
        )
        resid_mid_cross = self.hook_resid_mid_cross(resid_mid + cross_attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln3(resid_mid_cross)))
        return self.hook_resid_post(resid_mid_cross + mlp_out)


class PostNormCrossAttentionBlock(StreamBlock):
    """Post-norm decoder block with cross-attention (see the module docstring); its output is ``ln3(resid_post)``."""

    def __init__(
        self, attn: nn.Module, ln1: nn.Module, cross_attn: nn.Module, ln2: nn.Module, mlp: nn.Module, ln3: nn.Module
    ):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln1 = ln1
        self.cross_attn = cross_attn
        self.hook_cross_attn_out = HookPoint()
        self.hook_resid_mid_cross = HookPoint()
        self.ln2 = ln2
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()
        self.ln3 = ln3
        self.hook_normalized_resid_post = HookPoint()

    def stream(self) -> list[Step]:
        """Each write followed by the norm that renormalizes the stream after it (``ln1``, ``ln2``, ``ln3``)."""
        return [
            Writer("attn", self.attn, self.hook_attn_out.name),
            StreamNorm("ln1", self.ln1, self.hook_resid_mid.name),
            Writer("cross_attn", self.cross_attn, self.hook_cross_attn_out.name, reads_source=True),
            StreamNorm("ln2", self.ln2, self.hook_resid_mid_cross.name),
            Writer("mlp", self.mlp, self.hook_mlp_out.name),
            StreamNorm("ln3", self.ln3, self.hook_resid_post.name),
        ]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout,
        source: CrossAttentionSource,
        kv_cache: DecoderLayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        self_cache, cross_cache = _caches(kv_cache)
        source = _check_source(source)
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(resid_pre, layout, self_cache))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        normalized_resid_mid = self.ln1(resid_mid)
        cross_attn_out = self.hook_cross_attn_out(
            self.cross_attn(normalized_resid_mid, source.layout(layout), cross_cache, source.encoder_out)
        )
        resid_mid_cross = self.hook_resid_mid_cross(normalized_resid_mid + cross_attn_out)
        normalized_resid_mid_cross = self.ln2(resid_mid_cross)
        mlp_out = self.hook_mlp_out(self.mlp(normalized_resid_mid_cross))
        resid_post = self.hook_resid_post(normalized_resid_mid_cross + mlp_out)
        return self.hook_normalized_resid_post(self.ln3(resid_post))


__all__ = ["CrossAttentionBlock", "PostNormCrossAttentionBlock"]

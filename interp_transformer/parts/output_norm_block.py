"""The block of OLMo 2 and OLMo 3: a norm after attention and after the MLP, and none before them.

::

    attn_out   = ln1_post(attn(resid_pre))
    resid_mid  = resid_pre + attn_out
    mlp_out    = ln2_post(mlp(resid_mid))
    resid_post = resid_mid + mlp_out

Attention and the MLP read the residual stream as it is; each one's output is normalized before
it is added. The stream stays a sum of writes, so ``resid_mid = resid_pre + attn_out`` and
``resid_post = resid_mid + mlp_out`` hold as in a pre-norm block, and a final norm reads the sum.

How it differs from ``PrePostNormBlock`` (Gemma 2/3): no ``ln1``/``ln2`` before the sublayers,
so ``norm_readers()`` is empty (no norm to fold into attention or the MLP) and tools that ask
which norm a sublayer reads learn that it reads the stream itself. How it differs from
``PostNormBlock`` (BERT): the norms act on the sublayers' outputs, never on the stream. As in
Gemma 2, ``attn_out = sum_h z_h W_O[h] + b_O`` does not hold; with ``ln1_post``'s scale frozen,
``attn_out = ln1_post.apply_frozen(sum_h z_h W_O[h] + b_O, scale)`` does (the writers' ``output_norm``).
Hugging Face calls the two norms ``post_attention_layernorm`` and ``post_feedforward_layernorm``.
"""

from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.writers import Step, StreamBlock, Writer


class OutputNormBlock(StreamBlock):
    """``resid_mid = resid_pre + ln1_post(attn(resid_pre))``, ``resid_post = resid_mid + ln2_post(mlp(resid_mid))``."""

    def __init__(self, attn: nn.Module, ln1_post: nn.Module, mlp: nn.Module, ln2_post: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = attn
        self.ln1_post = ln1_post
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.mlp = mlp
        self.ln2_post = ln2_post
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """None: attention and the MLP read the stream unnormalized, and the output norms have no reader to fold
        into."""
        return []

    def stream(self) -> list[Step]:
        """Attention's and the MLP's writes, each through its output norm (``ln1_post``, ``ln2_post``)."""
        return [
            Writer("attn", self.attn, self.hook_attn_out.name, output_norm=self.ln1_post),
            Writer("mlp", self.mlp, self.hook_mlp_out.name, output_norm=self.ln2_post),
        ]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.ln1_post(self.attn(resid_pre, layout, kv_cache)))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.ln2_post(self.mlp(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


__all__ = ["OutputNormBlock"]

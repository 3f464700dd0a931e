"""The block of Gemma 2 and 3: a norm before *and* after attention and the MLP.

::

    attn_out  = ln1_post(attn(ln1(resid_pre)))
    resid_mid = resid_pre + attn_out
    mlp_out   = ln2_post(mlp(ln2(resid_mid)))
    resid_post = resid_mid + mlp_out

Names follow TransformerLens (``ln1_post``, ``ln2_post``); Hugging Face calls the four
norms ``input_layernorm``, ``post_attention_layernorm``, ``pre_feedforward_layernorm`` and
``post_feedforward_layernorm``. ``hook_attn_out`` and ``hook_mlp_out`` hold what is added
to the residual stream, after the post norm, so ``resid_mid = resid_pre + attn_out`` and
``resid_post = resid_mid + mlp_out`` hold as in every pre-norm block. What does *not* hold
is ``attn_out = sum_h z_h W_O[h] + b_O``: the heads' sum passes through ``ln1_post`` first.
With ``ln1_post``'s scale frozen (``blocks.L.ln1_post.hook_scale``) it is linear again,
``attn_out = ln1_post.apply_frozen(sum_h z_h W_O[h] + b_O, scale)``, which is how direct
logit attribution splits it exactly (the writers' ``output_norm``, ``components.writers``).
"""

from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.writers import Step, StreamBlock, Writer


class PrePostNormBlock(StreamBlock):
    """``resid_mid = resid_pre + ln1_post(attn(ln1(resid_pre)))``, ``resid_post = resid_mid +
    ln2_post(mlp(ln2(resid_mid)))``."""

    def __init__(
        self, ln1: nn.Module, attn: nn.Module, ln1_post: nn.Module, ln2: nn.Module, mlp: nn.Module, ln2_post: nn.Module
    ):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        self.ln1_post = ln1_post
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln2 = ln2
        self.mlp = mlp
        self.ln2_post = ln2_post
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(norm, part)``: the pre norms and the parts reading them (what ``fold_ln`` folds into).

        The post norms have no reader to fold into: their output goes straight into the
        residual stream, and their scale depends on the weights before them.
        """
        return [(self.ln1, self.attn), (self.ln2, self.mlp)]

    def stream(self) -> list[Step]:
        """Attention's and the MLP's writes, each through its post norm (``ln1_post``, ``ln2_post``)."""
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
        attn_out = self.hook_attn_out(self.ln1_post(self.attn(self.ln1(resid_pre), layout, kv_cache)))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.ln2_post(self.mlp(self.ln2(resid_mid))))
        return self.hook_resid_post(resid_mid + mlp_out)


__all__ = ["PrePostNormBlock"]

from typing import Optional

from jaxtyping import Float
from torch import Tensor, nn

from ..config import TransformerConfig
from ..hooks import HookPoint
from ..kv_cache import LayerKVCache
from ..shape_checks import shape_checked
from .attention import Attention
from .layer_norm import LayerNorm
from .mlp import MLP


class TransformerBlock(nn.Module):
    """Pre-LayerNorm GPT-2 block: ``resid_mid = resid_pre + attn(ln1(resid_pre))``,
    ``resid_post = resid_mid + mlp(ln2(resid_mid))``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        # registered in forward order, so named_modules() lists hooks as they fire
        self.hook_resid_pre = HookPoint()
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    @shape_checked
    def forward(
        self, resid_pre: Float[Tensor, "batch pos d_model"], kv_cache: Optional[LayerKVCache] = None
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre), kv_cache))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


class AttnOnlyBlock(nn.Module):
    """Attention-only block (no MLP): ``resid_post = resid_pre + attn(ln1(resid_pre))``.

    There is no ``hook_resid_mid``: with no MLP it would equal ``hook_resid_post``.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()

    @shape_checked
    def forward(
        self, resid_pre: Float[Tensor, "batch pos d_model"], kv_cache: Optional[LayerKVCache] = None
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre), kv_cache))
        return self.hook_resid_post(resid_pre + attn_out)

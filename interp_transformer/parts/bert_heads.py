"""The two heads BERT checkpoints ship: the masked-language-model head and the pooler."""

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.activations import ACTIVATIONS
from interp_transformer.parts.layer_norm import LayerNorm
from interp_transformer.parts.unembed import Unembed


class MLMHead(nn.Module):
    """BERT's masked-language-model head, applied at every position.

    ``pre = x W_transform + b_transform``, ``post = act(pre)``,
    ``logits = ln(post) W_U + b_U`` (``ln`` a LayerNorm with its own weights).
    Hugging Face ties ``W_U`` to the token embedding; here it is its own copy.
    """

    axis_sizes = {"d_model": "W_transform[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(self, cfg):
        super().__init__()
        self.W_transform = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model))
        self.b_transform = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()
        self.ln = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.unembed = Unembed(cfg)

    @shape_checked
    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        pre = self.hook_pre(
            einops.einsum(
                resid, self.W_transform, "batch pos d_model_in, d_model_in d_model_out -> batch pos d_model_out"
            )
            + self.b_transform
        )
        post = self.hook_post(self.act_fn(pre))
        return self.unembed(self.ln(post))


class Pooler(nn.Module):
    """BERT's pooler: ``pooled = tanh(resid[:, 0] W_pool + b_pool)``, the ``[CLS]`` position only.

    Sentence-embedding models such as all-MiniLM-L6-v2 do not use it (they average
    over real tokens, see ``EncoderTransformer.mean_pooled_embedding``).
    """

    axis_sizes = {"d_model": "W_pool[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(self, cfg):
        super().__init__()
        self.W_pool = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model))
        self.b_pool = nn.Parameter(torch.zeros(cfg.d_model))

    @shape_checked
    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch d_model"]:
        cls_resid = resid[:, 0]
        return torch.tanh(
            einops.einsum(cls_resid, self.W_pool, "batch d_model_in, d_model_in d_model_out -> batch d_model_out")
            + self.b_pool
        )

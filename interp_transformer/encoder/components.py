"""The parts of a BERT-style encoder whose math differs from GPT-2's.

What is the same stays shared (``Embed``, ``PosEmbed``, ``LayerNorm``, ``MLP``,
``Unembed`` from ``interp_transformer.components``). What differs lives here:

* ``TokenTypeEmbed``: the segment embedding ``W_token_type[token_type_ids]``.
* ``EncoderAttention``: bidirectional attention (no causal mask) whose only mask
  hides padding keys. It inherits the per-head weights, hook points and
  projections of the shared ``Attention``; only the masking differs.
* ``EncoderBlock``: post-LayerNorm, ``ln1`` after attention and ``ln2`` after the MLP.
* ``MLMHead`` and ``Pooler``: the two heads BERT checkpoints ship.

``key_is_real`` masks are booleans ``[batch, pos]``: True where the position holds
a real token, False on padding. ``None`` means every position is real.
"""

import math
from typing import Optional

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from ..components.attention import Attention
from ..components.layer_norm import LayerNorm
from ..components.mlp import ACTIVATIONS, MLP
from ..components.unembed import Unembed
from ..hooks import HookPoint
from ..shape_checks import shape_checked
from .config import EncoderConfig


class TokenTypeEmbed(nn.Module):
    """Segment embedding: ``token_type_embed = W_token_type[token_type_ids]``."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.W_token_type = nn.Parameter(torch.empty(cfg.n_token_types, cfg.d_model))

    @shape_checked
    def forward(self, token_type_ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_token_type[token_type_ids]


class EncoderAttention(Attention):
    """Bidirectional multi-head self-attention with a key-padding mask.

    For each head ``h``: ``q = x W_Q[h] + b_Q[h]`` (likewise ``k``, ``v``),
    ``attn_scores = q k^T / sqrt(d_head)`` with padding *keys* set to ``-inf`` (every
    query sees every real key, earlier or later), ``pattern = softmax(attn_scores)``,
    ``z = pattern v`` and ``attn_out = sum_h z_h W_O[h] + b_O``.

    Padding *queries* are computed like any other position (as Hugging Face does):
    their outputs are meaningless but never reach a real token, because no real
    query attends to a padding key.

    As in ``Attention``, the explicit einsum path is the reference and the only one
    that fills ``hook_attn_scores``/``hook_pattern``; the fused kernel runs while
    nobody hooks either (``uses_fused_path()``).
    """

    @shape_checked
    def forward(
        self, x: Float[Tensor, "batch pos d_model"], key_is_real: Optional[Bool[Tensor, "batch pos"]] = None
    ) -> Float[Tensor, "batch pos d_model"]:
        q = self.hook_q(self._project(x, self.W_Q, self.b_Q))
        k = self.hook_k(self._project(x, self.W_K, self.b_K))
        v = self.hook_v(self._project(x, self.W_V, self.b_V))
        if self.uses_fused_path():
            z = self._fused_bidirectional_z(q, k, v, key_is_real)
        else:
            z = self._explicit_bidirectional_z(q, k, v, key_is_real)
        z = self.hook_z(z)
        return einops.einsum(z, self.W_O, "batch pos head_index d_head, head_index d_head d_model -> batch pos d_model") + self.b_O

    def _explicit_bidirectional_z(self, q: Tensor, k: Tensor, v: Tensor, key_is_real: Optional[Tensor]) -> Tensor:
        attn_scores = einops.einsum(
            q, k, "batch query_pos head_index d_head, batch key_pos head_index d_head -> batch head_index query_pos key_pos"
        ) / math.sqrt(self.cfg.d_head)
        if key_is_real is not None:
            is_padding = einops.rearrange(~key_is_real, "batch key_pos -> batch 1 1 key_pos")
            attn_scores = attn_scores.masked_fill(is_padding, float("-inf"))
        attn_scores = self.hook_attn_scores(attn_scores)
        pattern = self.hook_pattern(attn_scores.softmax(dim=-1))
        return einops.einsum(
            pattern, v, "batch head_index query_pos key_pos, batch key_pos head_index d_head -> batch query_pos head_index d_head"
        )

    def _fused_bidirectional_z(self, q: Tensor, k: Tensor, v: Tensor, key_is_real: Optional[Tensor]) -> Tensor:
        to_heads_first = "batch pos head_index d_head -> batch head_index pos d_head"
        q, k, v = (einops.rearrange(t, to_heads_first) for t in (q, k, v))
        # a boolean attn_mask is True where the key takes part in attention
        allowed = None if key_is_real is None else einops.rearrange(key_is_real, "batch key_pos -> batch 1 1 key_pos")
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return einops.rearrange(z, "batch head_index pos d_head -> batch pos head_index d_head")


class EncoderBlock(nn.Module):
    """Post-LayerNorm BERT block.

    ``resid_mid = resid_pre + attn(resid_pre)``; ``ln1`` normalizes it, and that
    normalized stream is what the MLP reads *and* what the MLP's output is added to:
    ``resid_post = ln1(resid_mid) + mlp(ln1(resid_mid))``; the block's output is
    ``normalized_resid_post = ln2(resid_post)``, the next block's ``resid_pre``.
    Unlike a pre-norm block, the residual stream is renormalized twice per block, so
    ``resid_post != resid_mid + mlp_out`` (it is ``ln1.hook_normalized + mlp_out``).
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        # registered in forward order, so named_modules() lists hooks as they fire
        self.hook_resid_pre = HookPoint()
        self.attn = EncoderAttention(cfg)
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.hook_normalized_resid_post = HookPoint()

    @shape_checked
    def forward(
        self, resid_pre: Float[Tensor, "batch pos d_model"], key_is_real: Optional[Bool[Tensor, "batch pos"]] = None
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(resid_pre, key_is_real))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        normalized_resid_mid = self.ln1(resid_mid)
        mlp_out = self.hook_mlp_out(self.mlp(normalized_resid_mid))
        resid_post = self.hook_resid_post(normalized_resid_mid + mlp_out)
        return self.hook_normalized_resid_post(self.ln2(resid_post))


class MLMHead(nn.Module):
    """BERT's masked-language-model head, applied at every position.

    ``pre = x W_transform + b_transform``, ``post = act(pre)``,
    ``logits = ln(post) W_U + b_U`` (``ln`` a LayerNorm with its own weights).
    Hugging Face ties ``W_U`` to the token embedding; here it is its own copy.
    """

    def __init__(self, cfg: EncoderConfig):
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
            einops.einsum(resid, self.W_transform, "batch pos d_model_in, d_model_in d_model_out -> batch pos d_model_out")
            + self.b_transform
        )
        post = self.hook_post(self.act_fn(pre))
        return self.unembed(self.ln(post))


class Pooler(nn.Module):
    """BERT's pooler: ``pooled = tanh(resid[:, 0] W_pool + b_pool)``, the ``[CLS]`` position only.

    Sentence-embedding models such as all-MiniLM-L6-v2 do not use it (they average
    over real tokens, see ``EncoderTransformer.mean_pooled_embedding``).
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.W_pool = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model))
        self.b_pool = nn.Parameter(torch.zeros(cfg.d_model))

    @shape_checked
    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch d_model"]:
        cls_resid = resid[:, 0]
        return torch.tanh(
            einops.einsum(cls_resid, self.W_pool, "batch d_model_in, d_model_in d_model_out -> batch d_model_out") + self.b_pool
        )

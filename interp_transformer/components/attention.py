import math
from typing import Optional

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..config import TransformerConfig
from ..hooks import HookPoint
from ..kv_cache import LayerKVCache
from ..shape_checks import shape_checked
from .affine import affine


class Attention(nn.Module):
    """Causal multi-head self-attention with explicit per-head weights.

    For each head ``h``: ``q = x W_Q[h] + b_Q[h]`` (likewise ``k``, ``v``),
    ``attn_scores = q k^T / sqrt(d_head)`` masked so a query never sees a later key,
    ``pattern = softmax(attn_scores)``, ``z = pattern v``, and
    ``attn_out = sum_h z_h W_O[h] + b_O``.

    Two paths compute ``z``: the explicit einsum path (the reference, and the only
    one that produces ``attn_scores`` and ``pattern``), and PyTorch's fused
    ``scaled_dot_product_attention``, used only while nothing hooks or caches the
    scores or the pattern of this layer. ``uses_fused_path()`` is the one place the
    choice is made.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        n_heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_K = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_V = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_O = nn.Parameter(torch.zeros(d_model))
        self.use_fused_attention = True  # set False to always run the explicit path
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scores or the pattern."""
        return self.use_fused_attention and not (self.hook_attn_scores.has_hooks() or self.hook_pattern.has_hooks())

    @shape_checked
    def forward(
        self, normalized: Float[Tensor, "batch pos d_model"], kv_cache: Optional[LayerKVCache] = None
    ) -> Float[Tensor, "batch pos d_model"]:
        q = self.hook_q(self._project(normalized, self.W_Q, self.b_Q))
        k = self.hook_k(self._project(normalized, self.W_K, self.b_K))
        v = self.hook_v(self._project(normalized, self.W_V, self.b_V))
        offset = 0
        if kv_cache is not None:
            offset = kv_cache.n_positions
            k, v = kv_cache.append(k, v)
        if self.uses_fused_path():
            z = self._fused_z(q, k, v, offset)
        else:
            z = self._explicit_z(q, k, v, offset)
        z = self.hook_z(z)
        return self._combine_heads(z)

    @staticmethod
    def _project(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
        """``x W[h] + b[h]`` for every head ``h``, as one product batched over heads.

        Same as ``einsum(x, W, "batch pos d_model, head_index d_model d_head -> batch pos head_index d_head") + b``.
        The batched product reads ``W`` where it lies; laying the heads side by side as one
        ``[d_model, head_index * d_head]`` matrix would copy ``W`` on every call, which
        costs more than the product itself when generating one token at a time.
        """
        x_per_head = einops.repeat(x, "batch pos d_model -> head_index (batch pos) d_model", head_index=W.shape[0])
        b_per_head = einops.rearrange(b, "head_index d_head -> head_index 1 d_head")
        projected = torch.baddbmm(b_per_head, x_per_head, W)
        return einops.rearrange(projected, "head_index (batch pos) d_head -> batch pos head_index d_head", batch=x.shape[0])

    def _combine_heads(self, z: Tensor) -> Tensor:
        """``sum_h z[h] W_O[h] + b_O``: one product over ``(head_index d_head)``.

        Same as ``einsum(z, W_O, "batch pos head_index d_head, head_index d_head d_model -> batch pos d_model") + b_O``.
        """
        z_heads = einops.rearrange(z, "batch pos head_index d_head -> batch pos (head_index d_head)")
        W_O_heads = einops.rearrange(self.W_O, "head_index d_head d_model -> (head_index d_head) d_model")
        return affine(z_heads, W_O_heads, self.b_O)

    def causal_mask(self, query_len: int, key_len: int, offset: int, device) -> Tensor:
        """``[query_pos, key_pos]`` booleans, True where the key lies in the query's future."""
        query_pos = torch.arange(offset, offset + query_len, device=device)[:, None]
        key_pos = torch.arange(key_len, device=device)[None, :]
        return key_pos > query_pos

    def _explicit_z(self, q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
        # attn_scores = q k^T / sqrt(d_head), -inf where the key lies in the query's future.
        # One product computes all of it: the mask enters as an additive bias (0 or -inf)
        # that baddbmm writes before accumulating alpha * q k^T onto it, where dividing and
        # masking afterwards would be two more passes over [batch, head_index, query_pos,
        # key_pos] (48 MB per layer at GPT-2 small's 1024 positions).
        future = self.causal_mask(q.shape[1], k.shape[1], offset, q.device)
        mask_bias = torch.zeros(future.shape, dtype=q.dtype, device=q.device).masked_fill_(future, float("-inf"))
        q_heads = einops.rearrange(q, "batch query_pos head_index d_head -> (batch head_index) query_pos d_head")
        k_heads = einops.rearrange(k, "batch key_pos head_index d_head -> (batch head_index) d_head key_pos")
        scores = torch.baddbmm(mask_bias, q_heads, k_heads, alpha=1 / math.sqrt(self.cfg.d_head))
        attn_scores = self.hook_attn_scores(
            einops.rearrange(scores, "(batch head_index) query_pos key_pos -> batch head_index query_pos key_pos", batch=q.shape[0])
        )
        pattern = self.hook_pattern(attn_scores.softmax(dim=-1))
        return einops.einsum(
            pattern, v, "batch head_index query_pos key_pos, batch key_pos head_index d_head -> batch query_pos head_index d_head"
        )

    def _fused_z(self, q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
        to_heads_first = "batch pos head_index d_head -> batch head_index pos d_head"
        q, k, v = (einops.rearrange(t, to_heads_first) for t in (q, k, v))
        if offset == 0 and q.shape[2] == k.shape[2]:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            allowed = ~self.causal_mask(q.shape[2], k.shape[2], offset, q.device)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return einops.rearrange(z, "batch head_index pos d_head -> batch pos head_index d_head")

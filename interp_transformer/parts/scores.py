"""The steps from queries and keys to the scores a softmax reads: one masked product, and the mask as a bias.

``Attention``'s fast kernels compute the scores with ``masked_scores``, its explicit path with
``explicit_scores`` (the same formula step by step); its fused path adds a score bias to the mask
with ``additive_mask``. The soft-cap on the scores (Gemma 2) is ``softcap.soft_cap``.
"""

import einops
import torch
from jaxtyping import Float
from torch import Tensor


def additive_mask(allowed: Tensor | None, bias: Tensor) -> Tensor:
    """``bias`` where ``allowed`` (None: everywhere), ``-inf`` elsewhere: one tensor to add to the scores."""
    return bias if allowed is None else bias.masked_fill(allowed.logical_not(), float("-inf"))


def explicit_scores(
    q: Float[Tensor, "batch query_pos head_index d_head"],
    k: Float[Tensor, "batch key_pos head_index d_head"],
    scale: float,
    allowed: Tensor | None,
    score_bias: Tensor | None = None,
) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """``masked_scores``' formula step by step (the reference path): the product, the bias, then the mask."""
    attn_scores = (
        einops.einsum(
            q,
            k,
            "batch query_pos head_index d_head, batch key_pos head_index d_head -> batch head_index query_pos key_pos",
        )
        * scale
    )
    if score_bias is not None:
        attn_scores = attn_scores + score_bias
    return attn_scores if allowed is None else attn_scores.masked_fill(allowed.logical_not(), float("-inf"))


def masked_scores(
    q: Float[Tensor, "batch query_pos head_index d_head"],
    k: Float[Tensor, "batch key_pos head_index d_head"],
    scale: float,
    allowed: Tensor | None,
    score_bias: Tensor | None = None,
) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """``attn_scores = einsum(q, k, "batch query_pos head_index d_head, batch key_pos head_index d_head ->
    batch head_index query_pos key_pos") * scale + score_bias``, set to ``-inf`` where ``allowed`` is False.

    ``allowed`` broadcasts to ``[batch, head_index, query_pos, key_pos]`` (None: every key);
    ``score_bias`` (None: no bias) is ``[batch or 1, head_index, query_pos, key_pos]``.
    Computed as one batched product that starts from the mask written as an additive bias
    (0 or -inf) and accumulates ``scale * q k^T`` onto it: scaling and masking afterwards
    would be two more passes over ``[batch, head_index, query_pos, key_pos]``, 48 MB per layer
    at GPT-2 small's 1024 positions, about 5% of a forward that keeps every activation.
    """
    batch, n_heads = q.shape[0], q.shape[2]
    q_heads = einops.rearrange(q, "batch query_pos head_index d_head -> (batch head_index) query_pos d_head")
    k_heads = einops.rearrange(k, "batch key_pos head_index d_head -> (batch head_index) d_head key_pos")
    if allowed is None and score_bias is None:
        scores = torch.baddbmm(q_heads.new_empty(1, 1, 1), q_heads, k_heads, beta=0, alpha=scale)
    else:
        if score_bias is not None:
            bias = additive_mask(allowed, score_bias.to(q.dtype))
        elif allowed is not None:  # here one of the two is set
            bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(
                allowed.logical_not(), float("-inf")
            )
        if bias.shape[0] == 1 and bias.shape[1] == 1:  # one mask for every row and head: broadcast it
            bias = bias[0]
        else:  # a mask per row (padding): one bias matrix per (row, head)
            bias = einops.rearrange(
                bias.expand(batch, n_heads, -1, -1), "batch head_index q k -> (batch head_index) q k"
            )
        scores = torch.baddbmm(bias, q_heads, k_heads, alpha=scale)
    return einops.rearrange(
        scores, "(batch head_index) query_pos key_pos -> batch head_index query_pos key_pos", batch=batch
    )

"""Helpers shared by every model class: weight init, token checks, layer-index checks and unembedding directions."""

from typing import Optional

import torch
from torch import Tensor, nn


def init_explicit_weights(model: nn.Module, init_range: float, seed: Optional[int] = None) -> None:
    """GPT-2/BERT init: weight matrices (``W_*``) ~ N(0, init_range^2), biases 0, LayerNorm ``w`` = 1."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("W_"):
                param.copy_(torch.randn(param.shape, generator=generator) * init_range)
            elif leaf == "w":
                param.fill_(1.0)
            else:
                param.zero_()


def check_stop_at_layer(stop_at_layer: Optional[int], n_layers: int) -> int:
    """How many blocks to run: ``n_layers`` for None, else ``stop_at_layer`` (negative counts from the end)."""
    if stop_at_layer is None:
        return n_layers
    if not isinstance(stop_at_layer, int) or isinstance(stop_at_layer, bool) or not -n_layers <= stop_at_layer <= n_layers:
        raise ValueError(f"stop_at_layer must be an int in [{-n_layers}, {n_layers}], got {stop_at_layer!r}")
    return stop_at_layer % n_layers if stop_at_layer < 0 else stop_at_layer


def check_token_ids(tokens, d_vocab: int, n_ctx: int, offset: int = 0) -> Tensor:
    """``tokens`` as int64 ``[batch, pos]`` (a ``[pos]`` tensor is a batch of one), ids in ``[0, d_vocab)``.

    ``offset`` counts positions already processed (a key/value cache); ``offset + pos``
    must not exceed ``n_ctx``.
    """
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens must be an integer Tensor [batch, pos] (or text), got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor (torch.long), got dtype {tokens.dtype}")
    if tokens.ndim == 1:
        tokens = tokens.unsqueeze(0)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape [batch, pos] (or [pos]), got shape {tuple(tokens.shape)}")
    batch, pos = tokens.shape
    if batch == 0 or pos == 0:
        raise ValueError(f"tokens must be non-empty, got shape {tuple(tokens.shape)}")
    if offset + pos > n_ctx:
        cached = f" after {offset} cached positions" if offset else ""
        raise ValueError(f"sequence of {pos} tokens{cached} exceeds n_ctx={n_ctx}")
    if not tokens.is_meta:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= d_vocab:
            raise ValueError(f"token ids must lie in [0, d_vocab={d_vocab}), got {low if low < 0 else high}")
    return tokens.long()


def unembedding_directions(W_U: Tensor, tokens) -> Tensor:
    """Columns ``W_U[:, token]`` of ``W_U [d_model, d_vocab]``: shape ``tokens.shape + (d_model,)``.

    ``tokens`` is an int or an integer tensor of ids in ``[0, d_vocab)``; anything else
    raises ``TypeError`` / ``ValueError`` naming what was received.
    """
    d_vocab = W_U.shape[1]
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an int or an integer tensor, got {tokens!r:.80}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab):
        raise ValueError(f"token ids must lie in [0, d_vocab={d_vocab}), got {tokens.tolist()}")
    return W_U[:, tokens.to(W_U.device)].movedim(0, -1)

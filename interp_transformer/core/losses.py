"""Loss functions, kept apart from the forward pass (which returns logits only)."""

import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

IGNORE_INDEX = -100  # the label of a position that predicts nothing: PyTorch's (cross_entropy's ignore_index default)


def lm_loss(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False
) -> Float[Tensor, "..."]:
    """Next-token cross-entropy: position ``p`` predicts ``tokens[:, p + 1]``.

    Returns the mean over ``batch`` and ``pos - 1`` positions, or ``[batch, pos - 1]``
    with ``per_token=True``.
    """
    if logits.shape[:2] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} must share [batch, pos]")
    if tokens.shape[1] < 2:
        raise ValueError(f"the loss needs at least 2 positions, got {tokens.shape[1]}")
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
    per_token_loss = -log_probs.gather(-1, tokens[:, 1:, None].to(logits.device))[..., 0]
    return per_token_loss if per_token else per_token_loss.mean()

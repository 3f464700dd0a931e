"""Train the shipped attention-only model in which an induction circuit forms.

Data: a BOS token, then ``n`` uniformly random tokens, then the same
tokens again, with ``n`` drawn afresh for every batch (so the distance to the
earlier copy cannot be read off the position: the model has to match tokens). The first half cannot be predicted; the
second half can, by a
two-head circuit: a *previous-token head* in layer 0 writes "the token before
me was A" into each position, and an *induction head* in layer 1 attends from
the current token A to the position after A's earlier occurrence and copies
that token. Loss on the repeated half falling far below the first half's
(which stays near ``ln(d_vocab)``) is the signature of the circuit.
"""

import math
from dataclasses import dataclass, field

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.core.losses import lm_loss
from interp_transformer.core.shape_checks import shape_checking
from interp_transformer.families.gpt2.recipe import TransformerConfig
from interp_transformer.models.decoder import DemoTransformer

BOS_TOKEN = 0  # reserved: random tokens are drawn from 1 .. d_vocab-1


def induction_config() -> TransformerConfig:
    """The shipped model's shape: 2 layers, 4 heads each, attention only."""
    return TransformerConfig(
        d_model=64, n_layers=2, n_heads=4, d_head=16, d_mlp=None, d_vocab=64, n_ctx=64, name="induction-2l"
    )


def repeated_tokens(
    batch: int, seq_len: int, d_vocab: int, generator: torch.Generator | None = None
) -> Int[Tensor, "batch pos"]:
    """``[BOS, x_1..x_n, x_1..x_n]`` with ``x`` uniform over ``1 .. d_vocab-1``; pos = 2n+1."""
    half = torch.randint(1, d_vocab, (batch, seq_len), generator=generator)
    bos = torch.full((batch, 1), BOS_TOKEN, dtype=torch.long)
    return torch.cat([bos, half, half], dim=1)


@dataclass
class TrainingCurve:
    """Per-step mean loss on the first half and on the repeated half of the sequences."""

    steps: list[int] = field(default_factory=list)
    first_half_loss: list[float] = field(default_factory=list)
    repeated_half_loss: list[float] = field(default_factory=list)


def half_losses(model: DemoTransformer, tokens: Int[Tensor, "batch pos"], seq_len: int) -> tuple[Tensor, Tensor]:
    """Mean next-token loss predicting tokens of the first half, and of the repeated half."""
    per_token = lm_loss(model(tokens), tokens, per_token=True)  # [batch, pos-1]; column p predicts p+1
    # predicting positions 2..seq_len (first half, after its first token) vs seq_len+1..2*seq_len
    return per_token[:, 1:seq_len].mean(), per_token[:, seq_len:].mean()


@dataclass
class InductionTraining:
    model: DemoTransformer
    curve: TrainingCurve
    settings: dict


def train_induction_model(
    steps: int = 3000,
    batch: int = 64,
    seq_len: int = 24,
    min_seq_len: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    cfg: TransformerConfig | None = None,
    progress: bool = True,
    log_every: int = 25,
) -> InductionTraining:
    """Train an attention-only model on repeated random tokens; deterministic for a seed.

    Each batch repeats a random half of length ``n`` in ``[min_seq_len, seq_len]``.
    Uses one CPU thread during training so the result does not depend on the
    machine's core count.
    """
    cfg = cfg or induction_config()
    if 2 * seq_len + 1 > cfg.n_ctx:
        raise ValueError(f"2*seq_len+1={2 * seq_len + 1} exceeds n_ctx={cfg.n_ctx}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = DemoTransformer(cfg, seed=seed)
        generator = torch.Generator().manual_seed(seed + 1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / steps))
        )
        curve = TrainingCurve()
        with shape_checking(False):
            for step in tqdm(range(steps), desc="training induction-2l", disable=not progress):
                n = int(torch.randint(min_seq_len, seq_len + 1, (1,), generator=generator))
                tokens = repeated_tokens(batch, n, cfg.d_vocab, generator)
                first, repeated = half_losses(model, tokens, n)
                loss = (first * (n - 1) + repeated * n) / (2 * n - 1)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
                if step % log_every == 0 or step == steps - 1:
                    curve.steps.append(step)
                    curve.first_half_loss.append(round(first.item(), 4))
                    curve.repeated_half_loss.append(round(repeated.item(), 4))
    finally:
        torch.set_num_threads(threads)
    model.eval()
    settings = dict(steps=steps, batch=batch, seq_len=seq_len, min_seq_len=min_seq_len, lr=lr, seed=seed)
    return InductionTraining(model, curve, settings)

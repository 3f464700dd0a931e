"""What a model is trained on: a task draws batches, says which models it fits, and measures the result.

A ``Batch`` holds the model's inputs (positional ``inputs`` and keyword ``options`` of its
forward) and ``labels``: for each logit position, the token it should predict, or ``IGNORE``
where it predicts nothing. The loss is the same for every task and model (``token_loss``):
cross-entropy, label-smoothed if asked, summed over the labelled positions. A decoder's
labels are its next tokens; an encoder-decoder's are the target tokens after each decoder
input.

Tasks (``TASKS``, by the name a config file gives):

``induction``
    ``[BOS, x_1 .. x_n, x_1 .. x_n]`` with ``x`` uniform over ``1 .. d_vocab - 1`` and ``n``
    drawn in ``[min_seq_len, seq_len]`` for every batch (``pretrained.induction``); next-token
    labels, except the first random token, which nothing predicts. Measured by the loss on
    each half of held-out sequences: an induction circuit brings the repeated half's far
    below the first half's (about ``ln(d_vocab - 1)``).
``translation``
    numbers spelled out in words, translated into their digits (``pretrained.translation``).
    Measured by the exact-match accuracy of greedy translations of held-out numbers.

A task asks the model what it is (``capabilities``, ``has_cross_attention``, its config's
sizes), never which class it is.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from ..pretrained import induction, translation
from .settings import unknown_key_message

IGNORE = -1  # the label of a position that predicts nothing


@dataclass
class Batch:
    """One batch: ``model(*inputs, **options)`` gives logits ``[batch, pos, d_vocab]``; ``labels`` ``[batch, pos]``."""

    inputs: tuple
    labels: Int[Tensor, "batch pos"]
    options: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.labels.shape[0]

    def rows(self, start: int, stop: int) -> "Batch":
        """The sequences ``start .. stop - 1``: every tensor cut along its batch axis."""
        cut = lambda value: value[start:stop] if isinstance(value, Tensor) else value
        return Batch(tuple(cut(v) for v in self.inputs), cut(self.labels), {k: cut(v) for k, v in self.options.items()})

    def to(self, device: torch.device) -> "Batch":
        move = lambda value: value.to(device) if isinstance(value, Tensor) else value
        return Batch(
            tuple(move(v) for v in self.inputs), move(self.labels), {k: move(v) for k, v in self.options.items()}
        )

    @property
    def n_targets(self) -> int:
        """How many positions predict a token (the loss is their mean)."""
        return int((self.labels != IGNORE).sum())

    @property
    def n_tokens(self) -> int:
        """How many token ids the model reads (what tokens per second counts)."""
        return sum(value.numel() for value in self.inputs if isinstance(value, Tensor))


def token_loss(
    logits: Float[Tensor, "batch pos d_vocab"], labels: Int[Tensor, "batch pos"], label_smoothing: float = 0.0
) -> Float[Tensor, ""]:
    """Cross-entropy summed over the labelled positions (``labels != IGNORE``), in float32 or wider.

    With ``label_smoothing = e`` the target of each position is ``1 - e`` on its label plus
    ``e / d_vocab`` on every token (as in the original Transformer). Summed, not averaged, so
    that micro-batches and processes add up to the whole batch: divide by its ``n_targets``.
    """
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} must share [batch, pos]")
    return F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1),
        labels.flatten().to(logits.device),
        ignore_index=IGNORE,
        reduction="sum",
        label_smoothing=label_smoothing,
    )


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class InductionTask:
    """Repeated random tokens (see the module docstring); ``n_eval`` held-out sequences measure it."""

    seq_len: int = 24  # the longest half
    min_seq_len: int = 8  # the shortest half
    n_eval: int = 64  # held-out sequences (of seq_len) the halves' losses are measured on
    name = "induction"

    def __post_init__(self) -> None:
        for name in ("seq_len", "min_seq_len", "n_eval"):
            _positive(name, getattr(self, name))
        if not 2 <= self.min_seq_len <= self.seq_len:
            raise ValueError(f"min_seq_len must be in [2, seq_len={self.seq_len}], got {self.min_seq_len}")

    def check_model(self, model) -> None:
        """Refuse a model that does not read tokens into next-token logits, or whose context is too short."""
        capabilities = model.capabilities
        if not (capabilities.next_token_logits and capabilities.causal) or model.has_cross_attention:
            raise ValueError(
                "task 'induction' trains a causal decoder of next-token logits; this model has "
                f"causal={capabilities.causal}, next_token_logits={capabilities.next_token_logits}, "
                f"cross-attention={model.has_cross_attention}"
            )
        if 2 * self.seq_len + 1 > model.cfg.n_ctx:
            raise ValueError(f"task 'induction': 2*seq_len+1 = {2 * self.seq_len + 1} exceeds n_ctx={model.cfg.n_ctx}")
        if model.cfg.d_vocab < 3:
            raise ValueError(f"task 'induction' needs d_vocab >= 3 (BOS and two tokens), got {model.cfg.d_vocab}")

    def batch(self, model, size: int, generator: torch.Generator) -> Batch:
        n = int(torch.randint(self.min_seq_len, self.seq_len + 1, (1,), generator=generator))
        tokens = induction.repeated_tokens(size, n, model.cfg.d_vocab, generator)
        labels = torch.cat([tokens[:, 1:], torch.full((size, 1), IGNORE)], dim=1)
        labels[:, 0] = IGNORE  # the first random token follows BOS: nothing predicts it
        return Batch((tokens,), labels)

    @torch.no_grad()
    def evaluate(self, model, seed: int) -> dict[str, float]:
        """Mean loss predicting the first half (after its first token) and the repeated half of held-out
        sequences."""
        generator = torch.Generator().manual_seed(seed)
        tokens = induction.repeated_tokens(self.n_eval, self.seq_len, model.cfg.d_vocab, generator)
        first, repeated = induction.half_losses(model, tokens.to(_device_of(model)), self.seq_len)
        return {"first_half_loss": round(first.item(), 4), "repeated_half_loss": round(repeated.item(), 4)}

    def tokenizer(self):
        return None


@dataclass(frozen=True)
class TranslationTask:
    """Spelled-out numbers into digits (see the module docstring); ``n_eval`` held-out numbers measure it."""

    n_eval: int = 256
    name = "translation"

    def __post_init__(self) -> None:
        _positive("n_eval", self.n_eval)

    def check_model(self, model) -> None:
        """Refuse a model without cross-attention, or whose vocabulary or special tokens are not the task's."""
        if not model.has_cross_attention:
            raise ValueError("task 'translation' trains an encoder-decoder (cross-attention); this model has none")
        expected = {
            "d_vocab": len(translation.VOCAB),
            "pad_token_id": translation.PAD,
            "eos_token_id": translation.EOS,
            "decoder_start_token_id": translation.START,
        }
        got = {name: getattr(model.cfg, name, None) for name in expected}
        if got != expected:
            raise ValueError(f"task 'translation' needs a model with {expected}, got {got}")
        longest = len(translation.spell(777_777)) + 1  # the longest number in words, and </s>
        if model.cfg.n_ctx < longest:
            raise ValueError(f"task 'translation' reads sources of up to {longest} tokens; n_ctx={model.cfg.n_ctx}")

    def batch(self, model, size: int, generator: torch.Generator) -> Batch:
        data = translation.encode_numbers(translation.sample_numbers(size, generator))
        return Batch((data.source, data.decoder_input), data.labels, {"attention_mask": data.attention_mask})

    @torch.no_grad()
    def evaluate(self, model, seed: int) -> dict[str, float]:
        """Exact-match accuracy of greedy translations of ``n_eval`` held-out numbers (digits and ``</s>``)."""
        numbers = translation.sample_numbers(self.n_eval, torch.Generator().manual_seed(seed), held_out=True)
        data = translation.encode_numbers(numbers)
        device = _device_of(model)
        output = model.generate(data.source.to(device), data.attention_mask.to(device), max_new_tokens=8).cpu()
        width = 1 + data.labels.shape[1]  # <s>, then the digits and </s> the labels hold
        output = F.pad(output, (0, max(0, width - output.shape[1])), value=IGNORE)  # a row that stopped early
        matches = (output[:, 1:width] == data.labels) | (data.labels == IGNORE)
        return {"held_out_accuracy": round(matches.all(dim=1).float().mean().item(), 4)}

    def tokenizer(self):
        return translation.NumberTokenizer.create()


TASKS = {task.name: task for task in (InductionTask, TranslationTask)}


def make_task(name: str, options: Optional[dict] = None, where: str = "data"):
    """The task ``name`` with ``options`` (a config file's ``[data]`` table); unknown names and keys are refused."""
    if name not in TASKS:
        raise ValueError(f"{where}: task must be one of {list(TASKS)}, got {name!r}")
    task_class = TASKS[name]
    known = [f.name for f in dataclasses.fields(task_class)]
    unknown = sorted(set(options or {}) - set(known))
    if unknown:
        raise KeyError(unknown_key_message(f"{where} (task {name!r})", unknown, ["task", *known]))
    return task_class(**(options or {}))


def task_settings(task) -> dict:
    """What a model card records of the task: its name and options."""
    return {"task": task.name, **dataclasses.asdict(task)}


__all__ = ["Batch", "IGNORE", "InductionTask", "TASKS", "TranslationTask", "make_task", "task_settings", "token_loss"]

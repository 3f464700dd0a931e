"""What a model is trained on: a task draws batches, says which models it fits, and measures the result.

A ``Batch`` holds the model's inputs (positional ``inputs`` and keyword ``options`` of its
forward) and ``labels``: for each logit position, the token it should predict, or
``IGNORE_INDEX`` (PyTorch's -100) where it predicts nothing. The loss is the same for every
task and model (``token_loss``): cross-entropy, label-smoothed if asked (the two conventions
in ``settings``), summed over the labelled positions. A decoder's labels are its next tokens;
an encoder-decoder's are the target tokens after each decoder input.

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

**The task protocol.** ``train`` accepts any object (a class of one's own, no base class and no
dataclass needed) that has:

- ``name``: a ``str``, recorded in checkpoints and model cards;
- ``check_model(model)``: raise ``ValueError`` for a model the task cannot train, else return;
- ``batch(model, size, generator) -> Batch``: ``size`` sequences drawn with the
  ``torch.Generator`` given (the same generator state gives the same batch: resuming relies on it);
- ``evaluate(model, seed) -> dict[str, float]``: the task's measures on held-out data
  (an empty dict measures nothing);
- its options, for checkpoints to compare and cards to record: the fields of a dataclass, or a
  ``settings() -> dict`` method of plain values (numbers, strings, lists).

A config file's tasks (``TASKS``) also give ``tokenizer()`` (or None). ``check_task`` names what
an object lacks, with a ``TypeError``.
"""

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.core.losses import IGNORE_INDEX
from interp_transformer.pretrained import induction, translation
from interp_transformer.training.settings import SMOOTHING_OVER, check_choice, unknown_key_message

IGNORE = IGNORE_INDEX  # the earlier name of IGNORE_INDEX
TASK_METHODS = ("check_model", "batch", "evaluate")


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
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def n_tokens(self) -> int:
        """How many token ids the model reads (what tokens per second counts)."""
        return sum(value.numel() for value in self.inputs if isinstance(value, Tensor))


def token_loss(
    logits: Float[Tensor, "batch pos d_vocab"],
    labels: Int[Tensor, "batch pos"],
    label_smoothing: float = 0.0,
    label_smoothing_over: str = "vocab",
) -> Float[Tensor, ""]:
    """Cross-entropy summed over the labelled positions (``labels != IGNORE_INDEX``), in float32 or wider.

    With ``label_smoothing = e`` and ``V = d_vocab`` the target of each labelled position is, with
    ``label_smoothing_over="vocab"`` (PyTorch's ``cross_entropy(label_smoothing=e)``), ``e / V`` on every
    token plus ``1 - e`` on its label; with ``"others"`` (the original Transformer's), ``1 - e`` on the
    label and ``e / (V - 1)`` on each other token: PyTorch's with ``e V / (V - 1)``. Labels must be in
    ``[0, V)`` or ``IGNORE_INDEX``. Summed, not averaged, so that micro-batches and processes add up to
    the whole batch: divide by its ``n_targets``.
    """
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} must share [batch, pos]")
    check_choice("label_smoothing_over", label_smoothing_over, SMOOTHING_OVER)
    vocab = logits.shape[-1]
    labels = labels.to(logits.device)
    bad = labels[(labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab))]
    if bad.numel():
        raise ValueError(
            f"labels must be in [0, {vocab}) or IGNORE_INDEX = {IGNORE_INDEX} (a position that predicts nothing), "
            f"got {bad[0].item()}"
        )
    smoothing = label_smoothing
    if label_smoothing_over == "others" and label_smoothing > 0:
        smoothing = label_smoothing * vocab / (vocab - 1) if vocab > 1 else float("inf")
        if smoothing > 1:
            raise ValueError(
                f"label_smoothing_over='others' spreads label_smoothing={label_smoothing} over d_vocab - 1 = "
                f"{vocab - 1} tokens, more than each gets under 'vocab': it must be at most (d_vocab - 1) / d_vocab = "
                f"{(vocab - 1) / vocab:.4g}"
            )
    return F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1),
        labels.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
        label_smoothing=smoothing,
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
        labels = torch.cat([tokens[:, 1:], torch.full((size, 1), IGNORE_INDEX)], dim=1)
        labels[:, 0] = IGNORE_INDEX  # the first random token follows BOS: nothing predicts it
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
        output = F.pad(output, (0, max(0, width - output.shape[1])), value=IGNORE_INDEX)  # a row that stopped early
        matches = (output[:, 1:width] == data.labels) | (data.labels == IGNORE_INDEX)
        return {"held_out_accuracy": round(matches.all(dim=1).float().mean().item(), 4)}

    def tokenizer(self):
        return translation.NumberTokenizer.create()


TASKS = {task.name: task for task in (InductionTask, TranslationTask)}


def make_task(name: str, options: dict | None = None, where: str = "data"):
    """The task ``name`` with ``options`` (a config file's ``[data]`` table); unknown names and keys are refused."""
    if name not in TASKS:
        raise ValueError(f"{where}: task must be one of {list(TASKS)}, got {name!r}")
    task_class = TASKS[name]
    known = [f.name for f in dataclasses.fields(task_class)]
    unknown = sorted(set(options or {}) - set(known))
    if unknown:
        raise KeyError(unknown_key_message(f"{where} (task {name!r})", unknown, ["task", *known]))
    return task_class(**(options or {}))


_PROTOCOL = (
    "a task needs name (a str), check_model(model), batch(model, size, generator) -> Batch, "
    "evaluate(model, seed) -> dict, and its options as dataclass fields or a settings() -> dict method"
)


def check_task(task) -> None:
    """Refuse an object that does not follow the task protocol (module docstring), naming what it lacks."""
    kind = type(task).__name__
    lacking = [name for name in TASK_METHODS if not callable(getattr(task, name, None))]
    if not isinstance(getattr(task, "name", None), str):
        lacking.insert(0, "name")
    if lacking:
        raise TypeError(f"task {kind} lacks {', '.join(lacking)}: {_PROTOCOL}")
    is_dataclass = dataclasses.is_dataclass(task) and not isinstance(task, type)
    if not is_dataclass and not callable(getattr(task, "settings", None)):
        raise TypeError(f"task {kind} is not a dataclass and has no settings() method: {_PROTOCOL}")


def task_settings(task) -> dict:
    """What a model card records of the task: its name and options (dataclass fields, or ``settings()``)."""
    check_task(task)
    if callable(getattr(task, "settings", None)):
        options = task.settings()
        if not isinstance(options, dict):
            raise TypeError(f"task {type(task).__name__}.settings() must return a dict, got {type(options).__name__}")
    else:
        options = dataclasses.asdict(task)
    return {"task": task.name, **options}


__all__ = [
    "Batch",
    "IGNORE",
    "IGNORE_INDEX",
    "InductionTask",
    "TASKS",
    "TASK_METHODS",
    "TranslationTask",
    "check_task",
    "make_task",
    "task_settings",
    "token_loss",
]

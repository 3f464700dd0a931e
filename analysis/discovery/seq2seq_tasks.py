"""Encoder-decoder tasks: clean/corrupted (source, target) pairs, the answer each clean pair calls for, and a metric.

A ``Seq2SeqTask`` is ``Task``'s counterpart for an encoder-decoder. Each prompt is a source and
the decoder's input (the target so far, from the decoder's start token); clean and corrupted
differ in the source, the target or both, with the same token lengths, so that positions line up
in both streams. ``pos`` is the target position read (its last real token), ``answer`` and
``wrong`` the tokens compared there::

    metric(logits, prompt)[r] = logits[r, pos_p, answer_p] - logits[r, pos_p, wrong_p],  p = prompt[r]

``task.clean`` and ``task.corrupted`` are ``SourceTarget`` pairs and ``task.attention_mask`` the
sources' padding mask, so a task goes to ``edge_attribution_patching``, ``faithfulness_curve``
and ``circuit_report`` as a decoder's ``Task`` does. ``load_seq2seq_task`` reads one from a
``.csv``/``.json`` file or a list of dicts with the columns ``source,corrupted_source,target,
answer,wrong`` (and, where the target is corrupted too, ``corrupted_target``)::

    >>> from interp_transformer.pretrained import load_shipped
    >>> model = load_shipped("translate-tiny")
    >>> task = load_seq2seq_task(model, [{"source": "three hundred forty two", "corrupted_source":
    ...     "three hundred fifty two", "target": "3", "answer": "4", "wrong": "5"}])
    >>> task.clean.target.tolist(), task.pos.tolist()  # the decoder's start token, then the target
    ([[2, 36]], [1])
    >>> bool(task.evaluate(model)[0] > 0)
    True
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .. import _checks
from .metrics import RowMetric, logit_diff_per_row, row_values
from .runs import SourceTarget
from .tasks import _read_rows

COLUMNS = ("source", "corrupted_source", "target", "answer", "wrong")


@dataclass(frozen=True, eq=False)
class Seq2SeqTask:
    """Clean/corrupted sources and targets ``[batch, key_pos]`` / ``[batch, pos]``, the sources' padding mask (None:
    no padding), the answer and wrong token per prompt and the target position read."""

    name: str
    source: Int[Tensor, "batch key_pos"]
    corrupted_source: Int[Tensor, "batch key_pos"]
    source_mask: Int[Tensor, "batch key_pos"] | None
    target: Int[Tensor, "batch pos"]
    corrupted_target: Int[Tensor, "batch pos"]
    answer: Int[Tensor, "batch"]
    wrong: Int[Tensor, "batch"]
    pos: Int[Tensor, "batch"]

    def __post_init__(self):
        batch = self.source.shape[0]
        shapes = dict(
            corrupted_source=tuple(self.source.shape), source_mask=tuple(self.source.shape),
            corrupted_target=tuple(self.target.shape), answer=(batch,), wrong=(batch,), pos=(batch,),
        )  # fmt: skip
        for field, shape in shapes.items():
            value = getattr(self, field)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"task {self.name!r}: {field} must have shape {shape}, got {tuple(value.shape)}")
        if self.target.shape[0] != batch:
            raise ValueError(f"task {self.name!r}: {self.target.shape[0]} targets for {batch} sources")
        if not bool(((self.pos >= 0) & (self.pos < self.target.shape[1])).all()):
            raise ValueError(
                f"task {self.name!r}: pos must lie in [0, {self.target.shape[1]}), got {self.pos.tolist()}"
            )

    def __len__(self) -> int:
        return self.source.shape[0]

    @property
    def clean(self) -> SourceTarget:
        return SourceTarget(self.source, self.target)

    @property
    def corrupted(self) -> SourceTarget:
        return SourceTarget(self.corrupted_source, self.corrupted_target)

    @property
    def attention_mask(self) -> Int[Tensor, "batch key_pos"] | None:
        """The sources' padding mask (the same for the clean and the corrupted sources)."""
        return self.source_mask

    @property
    def metric(self) -> RowMetric:
        """``logit_diff_per_row(answer, wrong, pos)``: the answer's logit minus the wrong one's, per prompt."""
        return logit_diff_per_row(self.answer, self.wrong, self.pos)

    @torch.no_grad()
    def evaluate(self, model, metric: RowMetric | None = None, corrupted: bool = False) -> Float[Tensor, "batch"]:
        """``metric`` (default ``self.metric``) on the model's run of the clean (or corrupted) pairs."""
        source, target = self.corrupted if corrupted else self.clean
        logits = model(source, target, attention_mask=self.source_mask)
        prompt = torch.arange(len(self), device=logits.device)
        return row_values(metric or self.metric, logits, prompt, f"task {self.name!r}.evaluate")


def _pieces(tokenizer, text: str, what: str) -> list[int]:
    """``text``'s ids without special tokens (an empty text: none)."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be text, got {text!r}")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text.strip() else []


def _one_token(tokenizer, text: str, what: str) -> int:
    ids = _pieces(tokenizer, text, what)
    if len(ids) != 1:
        raise ValueError(
            f"{what} {text!r} is {len(ids)} tokens with this tokenizer; an answer must be exactly one token"
        )
    return ids[0]


def load_seq2seq_task(model, path_or_rows: str | Path | list, name: str | None = None) -> Seq2SeqTask:
    """A task from a ``.csv``/``.json`` file or a list of dicts with the columns ``source,corrupted_source,target,
    answer,wrong`` and optionally ``corrupted_target`` (module docstring); ``name``: default the file's stem.

    Sources are tokenized with the model's tokenizer (right-padded, with their mask); a target is the decoder's
    start token followed by its text's tokens (no special tokens), right-padded, and ``pos`` is its last token."""
    _checks.check_model(model)
    if not model.writers_that("reads_source"):
        raise ValueError("load_seq2seq_task builds (source, target) pairs for an encoder-decoder; use load_task")
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("load_seq2seq_task reads text: this model has no tokenizer (build the Seq2SeqTask from ids)")
    rows, default_name = _read_rows(path_or_rows)
    name = default_name if name is None else name
    if not rows or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"load_seq2seq_task: expected a non-empty list of rows (dicts), got {rows[:1]!r}")
    missing = [column for column in COLUMNS if column not in rows[0]]
    if missing:
        raise ValueError(f"load_seq2seq_task: columns {sorted(rows[0])} lack {missing}; expected {','.join(COLUMNS)}")
    for column in ("source", "corrupted_source"):
        _checks.nonempty_texts([row[column] for row in rows], f"task {name!r}: {column}")
    sources = [model.to_tokens_and_mask([row[column] for row in rows]) for column in ("source", "corrupted_source")]
    for index in (sources[0].attention_mask != sources[1].attention_mask).any(dim=1).nonzero().flatten().tolist():
        raise ValueError(
            f"task {name!r}, row {index}: the source {rows[index]['source']!r} and the corrupted source "
            f"{rows[index]['corrupted_source']!r} have different token lengths; positions must line up"
        )
    start, pad = model.cfg.decoder_start_token_id, model.cfg.pad_token_id
    targets, corrupted_targets = [], []
    for index, row in enumerate(rows):
        where = f"task {name!r}, row {index}:"
        target = [start] + _pieces(tokenizer, row["target"], f"{where} target")
        corrupted = [start] + _pieces(tokenizer, row.get("corrupted_target", row["target"]), f"{where} corrupted")
        if len(target) != len(corrupted):
            raise ValueError(f"{where} the target is {len(target)} tokens and the corrupted target {len(corrupted)}")
        targets.append(target)
        corrupted_targets.append(corrupted)
    width = max(len(target) for target in targets)

    def padded(ids: list[list[int]]) -> Tensor:
        return torch.tensor([row + [pad] * (width - len(row)) for row in ids])

    answers = [_one_token(tokenizer, row["answer"], f"task {name!r}, row {i}: answer") for i, row in enumerate(rows)]
    wrongs = [_one_token(tokenizer, row["wrong"], f"task {name!r}, row {i}: wrong") for i, row in enumerate(rows)]
    mask = None if bool(sources[0].attention_mask.bool().all()) else sources[0].attention_mask
    return Seq2SeqTask(
        name, sources[0].tokens, sources[1].tokens, mask, padded(targets), padded(corrupted_targets),
        torch.tensor(answers), torch.tensor(wrongs), torch.tensor([len(target) - 1 for target in targets]),
    )  # fmt: skip


__all__ = ["Seq2SeqTask", "load_seq2seq_task"]

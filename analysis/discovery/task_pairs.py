"""A circuit-discovery ``Task``: clean/corrupted id pairs, the answer and wrong token per prompt, the position read.

The pairs line up position by position (each pair has one token length; prompts of different lengths are
right-padded, with one ``attention_mask``). A task's ids mean tokens of the tokenizer it was built with, so a task
checks the model it runs on (``Task.check_model``): ids in its vocabulary, the same vocabulary size, and the same
tokenization of its texts. ``_from_prompts`` tokenizes paired texts into a ``Task``, refusing pairs whose lengths
differ and answers that are not one token; the builders and ``load_task`` of ``tasks`` call it.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .. import _checks
from .metrics import RowMetric, logit_diff_per_row, row_values


@dataclass(frozen=True, eq=False)
class Task:
    """Clean/corrupted id pairs, the answer and wrong token per prompt, and the position read.

    ``attention_mask`` is None when no prompt is padded. The ``*_text`` fields are the prompts
    and answers as text (None for a task that exists only as ids, such as random tokens, whose
    decoded text would tokenize differently). ``threshold``: greater-than's start-year ``YY``.
    ``vocab_size``: the size of the vocabulary its ids were built with (the tokenizer's, or the model's ``d_vocab``
    where it had none; None: not known), which a model it runs on must have (``check_model``).
    Two tasks are equal when every field is.
    """

    name: str
    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"] | None
    answer: Int[Tensor, "batch"]
    wrong: Int[Tensor, "batch"]
    pos: Int[Tensor, "batch"]
    clean_text: tuple[str, ...] | None = None
    corrupted_text: tuple[str, ...] | None = None
    answer_text: tuple[str, ...] | None = None
    wrong_text: tuple[str, ...] | None = None
    threshold: Int[Tensor, "batch"] | None = None
    vocab_size: int | None = None

    def __post_init__(self):
        if self.clean.ndim != 2:
            raise ValueError(f"task {self.name!r}: clean must be [batch, pos], got shape {tuple(self.clean.shape)}")
        batch, n_pos = self.clean.shape
        rows = {"answer": (batch,), "wrong": (batch,), "pos": (batch,), "threshold": (batch,)}
        for field, shape in dict(corrupted=(batch, n_pos), attention_mask=(batch, n_pos), **rows).items():
            value = getattr(self, field)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"task {self.name!r}: {field} must have shape {shape}, got {tuple(value.shape)}")
        for field in ("clean_text", "corrupted_text", "answer_text", "wrong_text"):
            value = getattr(self, field)
            if value is not None and len(value) != batch:
                raise ValueError(f"task {self.name!r}: {field} has {len(value)} strings for {batch} prompts")
        if not bool(((self.pos >= 0) & (self.pos < n_pos)).all()):
            raise ValueError(f"task {self.name!r}: pos must lie in [0, {n_pos}), got {self.pos.tolist()}")

    def __len__(self) -> int:
        return self.clean.shape[0]

    def __eq__(self, other) -> bool:
        if not isinstance(other, Task):
            return NotImplemented
        pairs = [(getattr(self, field), getattr(other, field)) for field in self.__dataclass_fields__]
        return all(
            isinstance(a, Tensor) == isinstance(b, Tensor)
            and (torch.equal(a.cpu(), b.cpu()) if isinstance(a, Tensor) else a == b)
            for a, b in pairs
        )

    @property
    def metric(self) -> RowMetric:
        """``logit_diff_per_row(answer, wrong, pos)``: the answer's logit minus the wrong one's, per prompt."""
        return logit_diff_per_row(self.answer, self.wrong, self.pos)

    def check_model(self, model: _checks.AnyModel, what: str = "evaluate") -> None:
        """Refuse a model whose tokenizer is not the one the task was built with (its ids would mean other tokens):
        ids outside its vocabulary, another vocabulary size (``vocab_size``), or, where the task holds its texts,
        another tokenization of its first answers and prompt."""
        _decoder(model, f"task {self.name!r}.{what}")
        where = f"task {self.name!r}"
        d_vocab = model.cfg.d_vocab
        largest = max(int(ids.max()) for ids in (self.clean, self.corrupted, self.answer, self.wrong))
        if largest >= d_vocab:
            raise ValueError(
                f"{where} holds token id {largest}, outside this model's vocabulary [0, d_vocab={d_vocab}): it was "
                "built with another tokenizer; build the task with this model"
            )
        size = _vocab_size(model)
        if self.vocab_size is not None and size != self.vocab_size:
            raise ValueError(
                f"{where} was built for a vocabulary of {self.vocab_size} tokens; this model's has {size} (its "
                "tokenizer's, or d_vocab without one): its ids may mean other tokens here; build the task with this "
                "model"
            )
        if model.tokenizer is None or self.answer_text is None:
            return
        rows = range(min(3, len(self)))
        pairs = [(self.answer_text[r], [int(self.answer[r])]) for r in rows]
        pairs += [(self.wrong_text[r], [int(self.wrong[r])]) for r in rows]
        n_real = self.clean.shape[1] if self.attention_mask is None else int(self.attention_mask[0].sum())
        clean = model.to_tokens_and_mask([self.clean_text[0]], padding_side="right").tokens[0]
        pairs.append((self.clean_text[0], self.clean[0, :n_real].tolist(), clean.tolist()))
        for text, ids, *found in pairs:
            found = found[0] if found else _ids(model.tokenizer, text)
            if list(found) != ids:
                raise ValueError(
                    f"{where} was built with another tokenizer: {text!r} is {ids} in the task and {list(found)} with "
                    "this model's; build the task with this model"
                )

    @torch.no_grad()
    def evaluate(
        self, model: _checks.AnyModel, metric: RowMetric | None = None, corrupted: bool = False
    ) -> Float[Tensor, "batch"]:
        """``metric`` (default ``self.metric``) on the model's run of the clean (or corrupted) prompts; a model whose
        tokenizer is not the task's is refused (``check_model``)."""
        self.check_model(model)
        tokens = self.corrupted if corrupted else self.clean
        logits = model(tokens, attention_mask=self.attention_mask)
        prompt = torch.arange(len(self), device=logits.device)
        return row_values(metric or self.metric, logits, prompt, f"task {self.name!r}.evaluate")


def _vocab_size(model) -> int:
    """The size of the vocabulary a task's ids are drawn from: the tokenizer's, or ``d_vocab`` without one."""
    return model.cfg.d_vocab if model.tokenizer is None else len(model.tokenizer)


def _decoder(model, what: str):
    _checks.check_model(model)
    _checks.require(model, "next_token_logits", what, "returns no next-token logits")
    return model


def _tokenizer(model, what: str):
    if _decoder(model, what).tokenizer is None:
        raise ValueError(f"{what} writes its prompts as text, so it needs a tokenizer: this model has none")
    return model.tokenizer


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _one_token(model, text: str, what: str) -> int:
    ids = _ids(model.tokenizer, text)
    if len(ids) != 1:
        pieces = model.to_str_tokens(torch.tensor(ids, dtype=torch.long)) if ids else []
        raise ValueError(
            f"{what} {text!r} is {len(ids)} tokens with this tokenizer, {pieces}; an answer must be exactly one "
            "token (words usually need their leading space, e.g. ' Mary')"
        )
    return ids[0]


def _from_prompts(model, name: str, clean, corrupted, answer_text, wrong_text, threshold=None) -> Task:
    """Tokenize paired prompts (right-padded), refusing a pair whose token lengths differ."""
    if not clean or len(clean) != len(corrupted) or len(clean) != len(answer_text) or len(clean) != len(wrong_text):
        raise ValueError(
            f"task {name!r}: got {len(clean)} clean prompts, {len(corrupted)} corrupted, {len(answer_text)} answers "
            f"and {len(wrong_text)} wrong answers; expected the same number (at least one) of each"
        )
    for side, texts in (("clean", clean), ("corrupted", corrupted)):
        _checks.nonempty_texts(texts, f"task {name!r}: {side} prompt")
    clean_tm = model.to_tokens_and_mask(list(clean), padding_side="right")
    corrupted_tm = model.to_tokens_and_mask(list(corrupted), padding_side="right")
    n_clean, n_corrupted = clean_tm.attention_mask.sum(-1), corrupted_tm.attention_mask.sum(-1)
    if bool((n_clean != n_corrupted).any()):
        pair = int((n_clean != n_corrupted).nonzero()[0])
        raise ValueError(
            f"task {name!r}, pair {pair}: the clean prompt {clean[pair]!r} is {int(n_clean[pair])} tokens and the "
            f"corrupted {corrupted[pair]!r} is {int(n_corrupted[pair])}; positions must line up, so each pair must "
            "have the same token length"
        )
    mask, device = clean_tm.attention_mask, clean_tm.tokens.device
    ids = [
        torch.tensor([_one_token(model, text, f"task {name!r}, row {row}: {what}") for row, text in enumerate(texts)])
        for what, texts in (("answer", answer_text), ("wrong", wrong_text))
    ]
    mask = None if bool(mask.bool().all()) else mask
    texts = (tuple(clean), tuple(corrupted), tuple(answer_text), tuple(wrong_text))
    threshold = None if threshold is None else torch.tensor(threshold, device=device)
    return Task(
        name, clean_tm.tokens, corrupted_tm.tokens, mask, *(t.to(device) for t in ids), n_clean - 1, *texts, threshold,
        _vocab_size(model),
    )  # fmt: skip


__all__ = ["Task"]

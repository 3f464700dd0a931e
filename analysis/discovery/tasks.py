"""Circuit-discovery tasks: clean/corrupted prompt pairs, the answer each clean prompt calls for, and a metric.

A ``Task`` (``task_pairs``, with the checks that keep its ids meaning the tokens they were built as)
holds ``[batch, pos]`` clean and corrupted ids that pair position by position (each pair
has one token length; prompts of different lengths are right-padded, with one ``attention_mask``),
the ``answer`` and ``wrong`` token per prompt and the position ``pos`` read (the last real token).
``task.metric`` is ``logit_diff_per_row(answer, wrong, pos)``, ready for ``patch_sites``,
``edge_attribution_patching`` and ``faithfulness_curve``::

    metric(logits, prompt)[r] = logits[r, pos_p, answer_p] - logits[r, pos_p, wrong_p],  p = prompt[r]

Built for any tokenizer (names, nouns and years are kept only where they are one token):

============================  ========================================================================
``ioi_task``                  indirect object identification: "When Mary and John went to the store,
                              John gave a drink to" -> " Mary" (answer) vs " John" (wrong); corrupted
                              by a third name in the subject's second place (EAP-IG's "ABC" pairs)
``greater_than_task``         "The war lasted from the year 1732 to the year 17" -> a year > 32;
                              corrupted start year "1701"; ``greater_than_metric`` is EAP-IG's prob diff
``induction_task``            ``[BOS] r_1..r_n r_1..r_{n-1}`` -> ``r_n``; corrupted: a fresh second half
``load_task``/``write_csv``   a task of your own, from CSV, JSON or a list of dicts, and back
============================  ========================================================================
"""

import csv
import json
import random
from collections.abc import Sequence
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .. import _checks
from .metrics import RowMetric
from .task_pairs import Task, _decoder, _from_prompts, _ids, _tokenizer, _vocab_size  # Task re-exported (__all__)

# Common first names; a tokenizer keeps those that are one token after a space.
NAMES = [
    "Mary",
    "John",
    "Alice",
    "Bob",
    "James",
    "Sarah",
    "Michael",
    "Emma",
    "David",
    "Laura",
    "Daniel",
    "Anna",
    "Paul",
    "Kate",
    "Mark",
    "Lisa",
    "Peter",
    "Jane",
    "Tom",
    "Amy",
    "George",
    "Emily",
    "Robert",
    "Rachel",
    "Richard",
    "Jessica",
    "Thomas",
    "Susan",
    "Charles",
    "Karen",
    "Steven",
    "Nancy",
    "Kevin",
    "Helen",
    "Brian",
    "Linda",
    "Eric",
    "Julia",
    "Jason",
    "Maria",
    "Adam",
    "Diana",
    "Ryan",
    "Rose",
    "Scott",
    "Claire",
    "Frank",
    "Grace",
    "Henry",
    "Alex",
    "Jack",
    "Lucy",
    "Sam",
    "Ruth",
    "Max",
    "Anne",
    "Carl",
    "Joan",
    "Dan",
    "Sophie",
    "Ben",
    "Kelly",
    "Tim",
    "Ann",
    "Andrew",
    "Amanda",
    "Matthew",
    "Nicole",
    "Joseph",
    "Sandra",
    "Patrick",
    "Megan",
    "Justin",
    "Olivia",
]
IOI_TEMPLATES = (  # {A} and {B} are the two names, in either order; {S} the subject's second mention
    "When {A} and {B} went to the store, {S} gave a drink to",
    "Then, {A} and {B} went to the park. {S} gave a ball to",
    "After {A} and {B} had lunch at the cafe, {S} handed a book to",
    "While {A} and {B} were working at the office, {S} sent a letter to",
    "Then, {A} and {B} had a long argument, and afterwards {S} said to",
    "When {A} and {B} got a snack at the house, {S} decided to give it to",
    "After {A} and {B} went to the garden, {S} gave a flower to",
    "Then, {A} and {B} were thinking about going to the school. {S} wanted to give a bag to",
)
NOUNS = [
    "war",
    "reign",
    "trip",
    "project",
    "study",
    "campaign",
    "treaty",
    "drought",
    "voyage",
    "siege",
    "famine",
    "journey",
    "conflict",
    "expedition",
    "marriage",
    "alliance",
    "plague",
    "festival",
    "occupation",
    "rebellion",
    "construction",
    "dispute",
    "program",
    "tradition",
]
CENTURIES = range(11, 18)  # start years 1100..1799, as in EAP-IG's data
GREATER_THAN_TEMPLATE = "The {noun} lasted from the year {century}{yy} to the year {century}"


def _positive_int(name: str, value) -> int:
    return _checks.count(value, name, minimum=1)


def single_token_names(model: _checks.AnyModel, names: Sequence[str] = NAMES) -> list[str]:
    """The ``names`` that are one token after a space (``" Mary"``) for the model's tokenizer, in order."""
    tokenizer = _tokenizer(model, "single_token_names")
    return list(dict.fromkeys(name for name in names if len(_ids(tokenizer, " " + name)) == 1))


def ioi_task(
    model: _checks.AnyModel,
    n_prompts: int,
    seed: int = 0,
    *,
    corruption: str = "abc",
    names: Sequence[str] = NAMES,
) -> Task:
    """Indirect object identification: the answer is the name not repeated (IO), the wrong one the subject (S).

    Prompts alternate ABBA ("When Mary and John ..., John gave a drink to") and BABA ("When
    John and Mary ..., John gave ...") over ``IOI_TEMPLATES``. ``corruption="abc"`` (EAP-IG's
    pairs) puts a third name C in the subject's second place, "... Alice gave a drink to", so
    no name is repeated and the IO is no longer the one to predict; ``"all"`` replaces all three
    mentions with three fresh names. Names are the ``names`` that are one token after a space.
    """
    _positive_int("n_prompts", n_prompts)
    if corruption not in ("abc", "all"):
        raise ValueError(f"corruption must be 'abc' (S2 becomes a third name) or 'all', got {corruption!r}")
    usable = single_token_names(model, names)
    needed = 3 if corruption == "abc" else 5
    if len(usable) < needed:
        raise ValueError(
            f"ioi_task(corruption={corruption!r}) needs {needed} names that are one token after a space; this "
            f"tokenizer keeps {len(usable)} of the {len(names)} given: {usable}"
        )
    rng = random.Random(seed)
    clean, corrupted, answers, wrongs = [], [], [], []
    for index in range(n_prompts):
        template = rng.choice(IOI_TEMPLATES)
        io, s, *fresh = rng.sample(usable, needed)
        first, second = (io, s) if index % 2 == 0 else (s, io)  # ABBA, then BABA
        clean.append(template.format(A=first, B=second, S=s))
        fill = dict(A=first, B=second, S=fresh[0]) if corruption == "abc" else dict(zip("ABS", fresh))
        corrupted.append(template.format(**fill))
        answers.append(" " + io)
        wrongs.append(" " + s)
    return _from_prompts(model, "ioi", clean, corrupted, answers, wrongs)


def year_tokens(model: _checks.AnyModel) -> Int[Tensor, "100"]:
    """The token of each two-digit year ``"00"`` .. ``"99"`` (``ValueError`` unless each is one token)."""
    tokenizer = _tokenizer(model, "greater-than")
    found = []
    for year in range(100):
        digits = f"{year:02d}"
        ids = _ids(tokenizer, digits)
        if len(ids) != 1:
            pieces = model.to_str_tokens(torch.tensor(ids, dtype=torch.long))
            raise ValueError(
                f"greater-than needs each two-digit year '00'..'99' to be one token, but this tokenizer writes "
                f"{digits!r} as {pieces} (it splits numbers into digits, as Llama-family tokenizers do), so "
                "'a year after YY' is no single next token; use a tokenizer that keeps two digits whole (GPT-2's)"
            )
        found.append(ids[0])
    return torch.tensor(found, device=model.W_E.device)


def greater_than_task(model: _checks.AnyModel, n_prompts: int, seed: int = 0, *, nouns: Sequence[str] = NOUNS) -> Task:
    """EAP-IG's greater-than: "The war lasted from the year 1732 to the year 17" -> a year after 32.

    The corrupted prompt starts in year ``CC01``, which every year ``02..99`` follows. Start
    years are ``CCYY`` with ``CC`` in 11..17 and ``YY`` in 02..98 that the tokenizer writes as
    ``[" CC", "YY"]``. ``answer``/``wrong`` are the years either side of the boundary (``YY+1``,
    ``YY``) for ``task.metric``; ``greater_than_metric`` gives EAP-IG's probability difference.
    """
    _positive_int("n_prompts", n_prompts)
    tokenizer = _tokenizer(model, "greater_than_task")
    years = year_tokens(model).tolist()
    kept = [noun for noun in nouns if len(_ids(tokenizer, " " + noun)) == 1]
    if not kept:
        raise ValueError(f"greater_than_task: none of the nouns {list(nouns)} is one token after a space here")
    starts = []
    for century in CENTURIES:
        head = _ids(tokenizer, f" {century}")
        if len(head) == 1 and _ids(tokenizer, f" {century}01") == head + [years[1]]:
            starts += [
                (century, yy) for yy in range(2, 99) if _ids(tokenizer, f" {century}{yy:02d}") == head + [years[yy]]
            ]
    if not starts:
        raise ValueError(
            "greater_than_task: this tokenizer writes no year ' CCYY' (CC in 11..17) as the two tokens ' CC' and 'YY'"
        )
    rng = random.Random(seed)
    clean, corrupted, answers, wrongs, thresholds = [], [], [], [], []
    for _ in range(n_prompts):
        noun, (century, yy) = rng.choice(kept), rng.choice(starts)
        clean.append(GREATER_THAN_TEMPLATE.format(noun=noun, century=century, yy=f"{yy:02d}"))
        corrupted.append(GREATER_THAN_TEMPLATE.format(noun=noun, century=century, yy="01"))
        answers.append(f"{yy + 1:02d}")
        wrongs.append(f"{yy:02d}")
        thresholds.append(yy)
    return _from_prompts(model, "greater-than", clean, corrupted, answers, wrongs, thresholds)


def greater_than_metric(model: _checks.AnyModel, task: Task) -> RowMetric:
    """EAP-IG's prob diff: ``sum_{y > YY} p(y) - sum_{y <= YY} p(y)`` over the 100 year tokens, at ``pos``.

    ``p`` is the softmax over the whole vocabulary at the prompt's ``pos``; ``YY`` is
    ``task.threshold``. In ``[-1, 1]``; EAP-IG minimises its negative mean as a loss.
    """
    if task.threshold is None:
        raise ValueError(f"greater_than_metric needs a greater-than task; task {task.name!r} has no threshold")
    task.check_model(model, "greater_than_metric")
    ids, threshold, pos = year_tokens(model), task.threshold, task.pos

    def metric(logits: Float[Tensor, "rows pos d_vocab"], prompt: Int[Tensor, "rows"]) -> Float[Tensor, "rows"]:
        rows = torch.arange(logits.shape[0], device=logits.device)
        prompt = prompt.to(logits.device)
        probs = logits[rows, pos.to(logits.device)[prompt]].float().softmax(-1)[:, ids.to(logits.device)]
        after = torch.arange(100, device=logits.device) > threshold.to(logits.device)[prompt, None]
        return (probs * after).sum(-1) - (probs * ~after).sum(-1)

    return metric


def induction_task(model: _checks.AnyModel, n_prompts: int, seq_len: int, seed: int = 0) -> Task:
    """``[BOS] r_1..r_n r_1..r_{n-1}`` -> ``r_n`` (``n = seq_len``): induction copies what followed last time.

    Per prompt ``2n`` distinct random tokens are drawn (never a special token): ``r_1..r_n``,
    a fresh second half ``s_1..s_{n-1}`` for the corrupted prompt (no repeat, so nothing to
    copy) and ``wrong``. BOS is the tokenizer's, if the model has one. Random tokens have no
    faithful text, so the task has no ``*_text`` (and ``write_csv`` refuses it).
    """
    _decoder(model, "induction_task")
    _positive_int("n_prompts", n_prompts)
    if _positive_int("seq_len", seq_len) < 2:
        raise ValueError(f"seq_len must be at least 2 (one token to repeat and one to predict), got {seq_len}")
    tokenizer = model.tokenizer
    bos = None if tokenizer is None else tokenizer.bos_token_id
    n_pos = 2 * seq_len - 1 + (bos is not None)
    if n_pos > model.cfg.n_ctx:
        raise ValueError(
            f"induction_task: prompts of 2*seq_len - 1 (+1 BOS) = {n_pos} tokens exceed n_ctx={model.cfg.n_ctx}"
        )
    size = model.cfg.d_vocab if tokenizer is None else min(model.cfg.d_vocab, len(tokenizer))
    special = set() if tokenizer is None else set(tokenizer.all_special_ids)
    allowed = torch.tensor([token for token in range(size) if token not in special])
    if len(allowed) < 2 * seq_len:
        raise ValueError(
            f"induction_task needs 2*seq_len = {2 * seq_len} distinct tokens; the vocabulary has {len(allowed)}"
        )
    generator = torch.Generator().manual_seed(seed)
    draws = [allowed[torch.randperm(len(allowed), generator=generator)[: 2 * seq_len]] for _ in range(n_prompts)]
    drawn = torch.stack(draws).to(model.W_E.device)
    first, fresh, wrong = drawn[:, :seq_len], drawn[:, seq_len:-1], drawn[:, -1]
    start = [] if bos is None else [torch.full_like(first[:, :1], bos)]
    clean, corrupted = torch.cat(start + [first, first[:, :-1]], 1), torch.cat(start + [first, fresh], 1)
    pos = torch.full_like(wrong, n_pos - 1)
    return Task("induction", clean, corrupted, None, first[:, -1], wrong, pos, vocab_size=_vocab_size(model))


def write_csv(task: Task, path: str | Path, layout: str = "generic") -> Path:
    """Write ``task`` as CSV and return the path; ``load_task`` reads it back to an equal task.

    ``"generic"``: columns ``clean,corrupted,answer,wrong`` (text). ``"eap-ig"``: EAP-IG's
    files: ``clean,corrupted,correct_idx`` with ``correct_idx = YY`` for greater-than (the
    layout of its ``greater_than_data.csv``), else ``clean,corrupted,correct_idx,incorrect_idx``
    with token ids (its IOI files). The file's stem is the loaded task's name.
    """
    if layout not in ("generic", "eap-ig"):
        raise ValueError(f"layout must be 'generic' or 'eap-ig', got {layout!r}")
    if task.clean_text is None or task.answer_text is None:
        raise ValueError(
            f"task {task.name!r} has no text (its prompts exist only as token ids), so it cannot be written as CSV"
        )
    if layout == "generic":
        header = ["clean", "corrupted", "answer", "wrong"]
        rows = zip(task.clean_text, task.corrupted_text, task.answer_text, task.wrong_text)
    elif task.threshold is not None:
        header = ["clean", "corrupted", "correct_idx"]
        rows = zip(task.clean_text, task.corrupted_text, task.threshold.tolist())
    else:
        header = ["clean", "corrupted", "correct_idx", "incorrect_idx"]
        rows = zip(task.clean_text, task.corrupted_text, task.answer.tolist(), task.wrong.tolist())
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _read_rows(path_or_rows) -> tuple[list[dict], str]:
    if isinstance(path_or_rows, (str, Path)):
        path = Path(path_or_rows)
        if path.suffix.lower() == ".csv":
            with path.open(newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f)), path.stem
        if path.suffix.lower() == ".json":
            rows = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(rows, list):
                raise ValueError(f"{path}: expected a JSON list of objects, got a {type(rows).__name__}")
            return rows, path.stem
        raise ValueError(f"load_task reads .csv and .json files, got {path.name!r}")
    if isinstance(path_or_rows, (list, tuple)):
        return list(path_or_rows), "task"
    raise TypeError(f"load_task takes a path or a list of dicts, got {type(path_or_rows).__name__}")


def _int(row: dict, index: int, column: str) -> int:
    try:
        return int(row[column])
    except (TypeError, ValueError):
        raise ValueError(f"row {index}: column {column!r} must be an integer, got {row[column]!r}") from None


def load_task(model: _checks.AnyModel, path_or_rows, name: str | None = None) -> Task:
    """A task from a ``.csv``/``.json`` file or a list of dicts, in either ``write_csv`` layout.

    ``clean,corrupted,answer,wrong`` (text; ``answer`` and ``wrong`` one token each, with their
    leading space); or EAP-IG's ``clean,corrupted,correct_idx,incorrect_idx`` (token ids) or
    ``clean,corrupted,correct_idx`` (greater-than's ``YY``). Other columns are ignored.
    ``name``: default the file's stem (``"task"`` for a list).
    """
    tokenizer = _tokenizer(model, "load_task")
    rows, default_name = _read_rows(path_or_rows)
    name = default_name if name is None else name
    if not rows or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"load_task: expected a non-empty list of rows (dicts), got {rows[:1]!r}")
    columns = set(rows[0])
    if not ({"clean", "corrupted", "answer", "wrong"} <= columns or {"clean", "corrupted", "correct_idx"} <= columns):
        raise ValueError(
            f"load_task: columns {sorted(columns)} match no layout; expected clean,corrupted,answer,wrong or EAP-IG's "
            "clean,corrupted,correct_idx[,incorrect_idx]"
        )
    for index, row in enumerate(rows):
        if set(row) != columns:
            raise ValueError(f"row {index} has columns {sorted(row)}, row 0 has {sorted(columns)}")
        for column in ("clean", "corrupted"):
            if not isinstance(row.get(column), str):
                raise ValueError(f"row {index}: column {column!r} must be text, got {row.get(column)!r}")
    clean, corrupted = [row["clean"] for row in rows], [row["corrupted"] for row in rows]
    if {"answer", "wrong"} <= columns:
        answers, wrongs = [row["answer"] for row in rows], [row["wrong"] for row in rows]
        return _from_prompts(model, name, clean, corrupted, answers, wrongs)
    if {"correct_idx", "incorrect_idx"} <= columns:
        ids = [[_int(row, i, column) for column in ("correct_idx", "incorrect_idx")] for i, row in enumerate(rows)]
        task = _from_prompts(model, name, clean, corrupted, *zip(*([tokenizer.decode([t]) for t in p] for p in ids)))
        for row, (given, found) in enumerate(zip(ids, torch.stack([task.answer, task.wrong], 1).tolist())):
            if given != found:  # an id whose text tokenizes to another token
                raise ValueError(f"row {row}: correct_idx, incorrect_idx = {given} decode to text that is {found}")
        return task
    thresholds = [_int(row, i, "correct_idx") for i, row in enumerate(rows)]  # greater-than's YY
    for index, yy in enumerate(thresholds):
        if not 0 <= yy <= 98:
            raise ValueError(f"row {index}: greater-than's correct_idx is the start year's YY in [0, 98], got {yy}")
    year_tokens(model)  # the years must be single tokens
    answers, wrongs = [f"{yy + 1:02d}" for yy in thresholds], [f"{yy:02d}" for yy in thresholds]
    return _from_prompts(model, name, clean, corrupted, answers, wrongs, thresholds)


__all__ = ["Task", "greater_than_metric", "greater_than_task", "induction_task", "ioi_task", "load_task", "write_csv"]

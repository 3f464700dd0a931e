"""Row metrics: what a patched forward is scored by, one value per row, and the one place every tool reads it.

A row metric maps ``(logits [rows, pos, d_vocab], prompt [rows])`` to ``[rows]``: ``prompt[r]`` names the prompt
that row ``r`` runs (a batched forward repeats the prompts once per site, ``batched``). ``logit_diff_per_row``
builds the usual one, the correct token's logit minus the incorrect one's; ``row_values`` is where patching, AtP,
EAP, faithfulness curves and the tasks read any metric, refusing a wrong shape, a NaN or an inf by name.
"""

import numbers
from collections.abc import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .. import _checks

RowMetric = Callable[[Tensor, Tensor], Tensor]  # (logits [rows, pos, d_vocab], prompt [rows]) -> [rows]


def _per_prompt(value, name: str) -> Tensor:
    """An int, a list of ints or an int tensor ``[]`` / ``[prompt]`` (one per prompt) as an int64 tensor."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = torch.tensor(int(value))
    elif isinstance(value, (list, tuple)) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value
    ):
        value = torch.tensor([int(v) for v in value], dtype=torch.long)
    if (
        not isinstance(value, Tensor)
        or value.is_floating_point()
        or value.is_complex()
        or value.dtype == torch.bool
        or value.ndim > 1
    ):
        raise TypeError(f"{name} must be an int or an integer tensor [prompt] (one per prompt), got {value!r}")
    return value.long()


def logit_diff_per_row(
    correct: int | Int[Tensor, "batch"],
    incorrect: int | Int[Tensor, "batch"],
    pos: int | Int[Tensor, "batch"] = -1,
) -> RowMetric:
    """``metric(logits, prompt)[r] = logits[r, pos_p, correct_p] - logits[r, pos_p, incorrect_p]``, ``p = prompt[r]``.

    ``pos`` one position per prompt (the last real token of a right-padded prompt), or one for all; a negative
    position counts from the end, as in Python (``-1``: the last, which in a right-padded prompt is padding). Token ids
    must lie in ``[0, d_vocab)`` and positions in ``[-n_pos, n_pos)``: a negative id is refused here, the rest at each
    call, where the logits give ``d_vocab`` and the prompts' length ``n_pos``.
    """
    correct, incorrect, pos = (
        _per_prompt(v, n) for v, n in ((correct, "correct"), (incorrect, "incorrect"), (pos, "pos"))
    )
    for ids, name in ((correct, "correct"), (incorrect, "incorrect")):
        _checks.within(ids, 0, None, name, "token ids", high_name="d_vocab")

    def metric(logits: Float[Tensor, "rows pos d_vocab"], prompt: Int[Tensor, "rows"]) -> Float[Tensor, "rows"]:
        rows = torch.arange(logits.shape[0], device=logits.device)
        prompt = prompt.to(logits.device)
        n_pos, d_vocab = logits.shape[1], logits.shape[-1]

        def per_row(value: Tensor, name: str) -> Tensor:
            if value.ndim == 0:
                return value.to(logits.device).expand(len(prompt))
            if prompt.numel() and int(prompt.max()) >= len(value):
                raise ValueError(
                    f"{name} has {len(value)} entries, one per prompt, but the rows read prompt {int(prompt.max())}"
                )
            return value.to(logits.device)[prompt]

        at_pos = _checks.within(
            per_row(pos, "pos"), -n_pos, n_pos, "pos",
            f"the prompts are {n_pos} tokens long; negative positions count from the end",
        )  # fmt: skip
        ids = [per_row(value, name) for value, name in ((correct, "correct"), (incorrect, "incorrect"))]
        for values, name in zip(ids, ("correct", "incorrect")):
            _checks.within(values, 0, d_vocab, name, f"token ids of a vocabulary of d_vocab={d_vocab}")
        at = logits[rows, at_pos % n_pos]
        return at[rows, ids[0]] - at[rows, ids[1]]

    return metric


def row_values(
    metric: RowMetric, logits: Tensor, prompt: Tensor, tool: str, where: Callable[[int], str] | None = None
) -> Tensor:
    """``metric(logits, prompt)``, refused unless it is one finite value per row (still differentiable).

    Where every tool reads its metric: a NaN or inf is refused naming ``tool``, the value and the row (``where(row)``;
    default ``prompt <p>``)."""
    values = metric(logits, prompt)
    if not isinstance(values, Tensor) or values.shape != prompt.shape:
        raise ValueError(
            f"metric must return one value per row, a tensor of shape {tuple(prompt.shape)}, got "
            f"{getattr(values, 'shape', type(values).__name__)}"
        )
    return _checks.finite_metric(values, tool, where or (lambda row: f"prompt {int(prompt[row])}"))


__all__ = ["RowMetric", "logit_diff_per_row", "row_values"]

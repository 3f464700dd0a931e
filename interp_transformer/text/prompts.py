"""``test_prompt``: how likely does the model find an expected answer after a prompt?

The prompt and the answer are tokenized together (``prompt + answer``; the
answer gets a leading space by default, as GPT-2's tokens carry the space
before a word). For each answer token, the logits at the position before it
give that token's rank (0 = the model's top choice), logit and probability, and
the model's own top-k candidates at that position.
"""

from dataclasses import dataclass

import torch


@dataclass
class TokenPrediction:
    """A candidate token at one position: its text, id, rank, logit and probability."""

    token: str
    token_id: int
    rank: int
    logit: float
    prob: float


@dataclass
class PromptTestResult:
    """What ``test_prompt`` measured; ``str(result)`` is the printed report."""

    prompt_str_tokens: list[str]
    answer_str_tokens: list[str]
    answer: list[TokenPrediction]  # one per answer token
    top: list[list[TokenPrediction]]  # the model's top-k at each answer position

    @property
    def answer_ranks(self) -> list[tuple[str, int]]:
        return [(prediction.token, prediction.rank) for prediction in self.answer]

    def __str__(self) -> str:
        lines = [f"Tokenized prompt: {self.prompt_str_tokens}", f"Tokenized answer: {self.answer_str_tokens}"]
        for prediction, top in zip(self.answer, self.top, strict=True):
            lines.append("")
            lines.append(f"Performance on answer token {prediction.token!r}:")
            lines.append(_line(f"Rank: {prediction.rank:<6}", prediction))
            lines += [_line(f"Top {candidate.rank}th token.", candidate) for candidate in top]
        lines.append("")
        lines.append(f"Ranks of the answer tokens: {self.answer_ranks}")
        return "\n".join(lines)


def _line(prefix: str, prediction: TokenPrediction) -> str:
    return f"{prefix} Logit: {prediction.logit:6.2f} Prob: {prediction.prob:7.2%} Token: |{prediction.token}|"


@torch.no_grad()
def test_prompt(
    model,
    prompt: str,
    answer: str,
    *,
    prepend_bos: bool = True,
    prepend_space_to_answer: bool = True,
    top_k: int = 10,
    print_details: bool = True,
) -> PromptTestResult:
    """Rank, logit and probability of each token of ``answer`` after ``prompt`` (see module docstring).

    Prints the report unless ``print_details=False``; returns it as a ``PromptTestResult``.
    """
    if not isinstance(prompt, str) or not isinstance(answer, str):
        raise TypeError(f"prompt and answer must be str, received {type(prompt).__name__} and {type(answer).__name__}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, received {top_k!r}")
    if prepend_space_to_answer and not answer.startswith(" "):
        answer = " " + answer
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)[0]
    answer_tokens = model.to_tokens(answer, prepend_bos=False)[0]
    if len(answer_tokens) == 0:
        raise ValueError("answer is empty: expected at least one token")
    tokens = torch.cat([prompt_tokens, answer_tokens])
    raw_logits = model(tokens[None])[0]
    log_probs = raw_logits.log_softmax(dim=-1)
    answer_predictions, top_predictions = [], []
    for offset, token_id in enumerate(answer_tokens.tolist()):
        position = len(prompt_tokens) - 1 + offset  # the logits here predict answer token `offset`
        position_logits, position_log_probs = raw_logits[position], log_probs[position]
        rank = int((position_logits > position_logits[token_id]).sum())
        answer_predictions.append(_prediction(model, token_id, rank, position_logits, position_log_probs))
        top_ids = position_logits.topk(min(top_k, position_logits.shape[-1])).indices.tolist()
        top_predictions.append(
            [
                _prediction(model, top_id, rank, position_logits, position_log_probs)
                for rank, top_id in enumerate(top_ids)
            ]
        )
    result = PromptTestResult(
        model.to_str_tokens(prompt_tokens), model.to_str_tokens(answer_tokens), answer_predictions, top_predictions
    )
    if print_details:
        print(result)
    return result


def _prediction(model, token_id: int, rank: int, logits, log_probs) -> TokenPrediction:
    token = model.to_str_tokens(torch.tensor([token_id]))[0]
    return TokenPrediction(token, token_id, rank, float(logits[token_id]), float(log_probs[token_id].exp()))


test_prompt.__test__ = False  # type: ignore[attr-defined]  # not a pytest test, despite the name (a function attribute)

__all__ = ["PromptTestResult", "TokenPrediction", "test_prompt"]

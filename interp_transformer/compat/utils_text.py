"""TransformerLens' text helpers: corpus chunking, BOS handling, ``test_prompt`` (exported by
``interp_transformer.compat.utils``).

``tokenize_and_concatenate`` needs the ``datasets`` package (the ``harvest`` extra).
"""

import copy

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from interp_transformer.compat.errors import CompatValueError
from interp_transformer.compat.losses import get_cumsum_along_dim

USE_DEFAULT_VALUE = None  # TransformerLens' sentinel: "use the model's default"


def override_or_use_default_value(default_flag, override=None):
    """``override`` unless it is None, else ``default_flag``."""
    return override if override is not None else default_flag


class LocallyOverridenDefaults:
    """``with LocallyOverridenDefaults(model, prepend_bos=..., padding_side=...):`` sets
    ``model.cfg.default_prepend_bos``
    and ``model.tokenizer.padding_side`` for the block (None keeps them) and restores them on exit, also on an error."""

    def __init__(self, model, **overrides):
        unknown = set(overrides) - {"prepend_bos", "padding_side"}
        if unknown:
            raise CompatValueError(
                f"{sorted(unknown)} cannot be overridden; valid parameters are ['prepend_bos', 'padding_side']"
            )
        self.model, self.overrides, self._saved = model, overrides, []

    def _targets(self):
        if "prepend_bos" in self.overrides:
            yield self.model.cfg, "default_prepend_bos", self.overrides["prepend_bos"], (None, True, False)
        if "padding_side" in self.overrides and self.model.tokenizer is not None:
            yield self.model.tokenizer, "padding_side", self.overrides["padding_side"], (None, "left", "right")

    def __enter__(self):
        for owner, name, value, valid in self._targets():
            if value not in valid:
                raise CompatValueError(f"{name} must be one of {list(valid)}, but got {value!r}")
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, override_or_use_default_value(getattr(owner, name), value))
        return self

    def __exit__(self, *exc_info):
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()


def keep_single_column(dataset, col_name: str):
    """``dataset`` with every column but ``col_name`` removed."""
    for key in list(dataset.features):
        if key != col_name:
            dataset = dataset.remove_columns(key)
    return dataset


def tokenize_and_concatenate(
    dataset,
    tokenizer: PreTrainedTokenizerBase,
    streaming: bool = False,
    max_length: int = 1024,
    column_name: str = "text",
    add_bos_token: bool = True,
    num_proc: int = 10,
    set_format: bool = True,
):
    """Tokenize each document, join them with the EOS token and cut the stream into rows of ``max_length`` tokens.

    Documents are tokenized whole (never cut mid-token), joined with one EOS between
    documents of a batch of the ``map``; each row starts with BOS when ``add_bos_token``
    (so ``max_length - 1`` text tokens). The remainder that does not fill a row is dropped;
    a batch shorter than one row is padded with the pad token (EOS when there is none).
    Returns a dataset with one column, ``"tokens"`` (torch format with ``set_format``).
    """
    dataset = keep_single_column(dataset, column_name)
    if tokenizer.eos_token_id is None:
        raise CompatValueError("tokenize_and_concatenate needs a tokenizer with an EOS token to join documents")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    seq_len = max_length - 1 if add_bos_token else max_length

    def tokenize(examples):
        texts = examples[column_name]
        if not texts:
            return {"tokens": np.zeros((0, max_length), dtype=np.int64)}
        encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        pieces = []
        for index, ids in enumerate(encoded):
            pieces.append(np.asarray(ids, dtype=np.int64))
            if index < len(encoded) - 1:
                pieces.append(np.array([tokenizer.eos_token_id], dtype=np.int64))
        tokens = np.concatenate(pieces)
        if len(tokens) < seq_len:
            tokens = np.concatenate([tokens, np.full(seq_len - len(tokens), pad_id, dtype=np.int64)])
        n_rows = len(tokens) // seq_len
        rows = tokens[: n_rows * seq_len].reshape(n_rows, seq_len)
        if add_bos_token:
            rows = np.concatenate([np.full((n_rows, 1), tokenizer.bos_token_id, dtype=np.int64), rows], axis=1)
        return {"tokens": rows}

    options = {} if streaming else {"num_proc": num_proc}
    tokenized = dataset.map(tokenize, batched=True, remove_columns=[column_name], **options)
    if set_format:
        tokenized.set_format(type="torch", columns=["tokens"])
    return tokenized


def get_tokenizer_with_bos(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """A tokenizer that prepends BOS itself (a copy, padding side kept); one without a BOS token is returned as is."""
    if tokenizer.bos_token is None or getattr(tokenizer, "add_bos_token", False):
        return tokenizer
    with_bos = copy.deepcopy(tokenizer)
    with_bos.add_bos_token = True
    with_bos.padding_side = tokenizer.padding_side
    return with_bos


def get_input_with_manually_prepended_bos(bos_token: str, input: str | list) -> str | list:
    """``bos_token + text`` for a text or each of a list of texts."""
    return bos_token + input if isinstance(input, str) else [bos_token + text for text in input]


def get_tokens_with_bos_removed(tokenizer: PreTrainedTokenizerBase, tokens: Tensor) -> Tensor:
    """``tokens`` without each row's BOS: the first token when padded on the right, the BOS after the padding on the
    left."""
    if tokenizer.padding_side == "right":
        return tokens[..., 1:]
    shape = list(tokens.shape)
    shape[-1] -= 1
    if tokenizer.bos_token_id == tokenizer.pad_token_id:
        is_leading_pad = get_cumsum_along_dim(tokens.ne(tokenizer.pad_token_id), -1) == 0
        bos_positions = is_leading_pad.sum(-1) - 1
    else:
        bos_positions = (tokens == tokenizer.bos_token_id).int().argmax(-1)
    keep = torch.ones_like(tokens, dtype=torch.bool).scatter(1, bos_positions.unsqueeze(-1), False)
    return tokens[keep].view(*shape)


@torch.no_grad()
def test_prompt(
    prompt: str,
    answer: str | list,
    model,
    prepend_space_to_answer: bool = True,
    print_details: bool = True,
    prepend_bos: bool | None = None,
    top_k: int = 10,
) -> None:
    """Print how the model ranks ``answer`` (or each of several one-token answers) after ``prompt``, as TransformerLens
    does.

    Prints the tokenized prompt and answer, then for each answer position its rank, logit
    and probability and the model's ``top_k`` tokens, then the ranks. Returns None.
    """
    answers = [answer] if isinstance(answer, str) else list(answer)
    several = len(answers) > 1
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)
    answer_tokens = model.to_tokens(answers, prepend_bos=False)
    if several:
        answer_tokens = answer_tokens[:, :1]
    tokens = torch.cat([prompt_tokens.repeat(answer_tokens.shape[0], 1), answer_tokens], dim=1)
    prompt_str_tokens = model.to_str_tokens(prompt, prepend_bos=prepend_bos)
    answer_str_tokens = [model.to_str_tokens(a, prepend_bos=False) for a in answers]
    prompt_length, answer_length = len(prompt_str_tokens), 1 if several else len(answer_str_tokens[0])
    if print_details:
        print("Tokenized prompt:", prompt_str_tokens)
        print(
            "Tokenized answers:" if several else "Tokenized answer:",
            answer_str_tokens if several else answer_str_tokens[0],
        )
    logits = model(tokens)
    probs = logits.softmax(dim=-1)
    ranks = []
    for index in range(prompt_length, prompt_length + answer_length):
        targets = tokens[:, index]
        position_probs = probs[:, index - 1]
        sorted_probs, order = position_probs.sort(descending=True)
        target_ranks = order.argsort(-1)[torch.arange(len(targets)), targets.cpu()].tolist()
        strings = [a[index - prompt_length] for a in answer_str_tokens]
        ranks.append(list(zip(strings, target_ranks, strict=True)))
        if print_details:
            for i, (string, rank) in enumerate(zip(strings, target_ranks, strict=True)):
                print(
                    f"Performance on answer token: Rank: {rank: <8} Logit: "
                    f"{logits[i, index - 1, targets[i]].item():5.2f} "
                    f"Prob: {position_probs[i, targets[i]].item():6.2%} Token: |{string}|"
                )
            for i in range(min(top_k, sorted_probs.shape[-1])):
                print(
                    f"Top {i}th token. Logit: {logits[0, index - 1, order[0, i]].item():5.2f} Prob: "
                    f"{sorted_probs[0, i].item():6.2%} Token: |{model.to_string(order[0, i])}|"
                )
    print("Ranks of the answer tokens:", [r[0] for r in ranks] if not several else ranks)


test_prompt.__test__ = False  # type: ignore[attr-defined]  # not a pytest test, despite the name (a function attribute)

__all__ = [
    "LocallyOverridenDefaults",
    "USE_DEFAULT_VALUE",
    "get_input_with_manually_prepended_bos",
    "get_tokenizer_with_bos",
    "get_tokens_with_bos_removed",
    "keep_single_column",
    "override_or_use_default_value",
    "test_prompt",
    "tokenize_and_concatenate",
]

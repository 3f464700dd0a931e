"""The shipped ``translate-tiny`` model's task: numbers spelled out in English, translated into their digits.

    source: "three hundred forty two thousand six hundred five" </s>
    target: <s> 3 4 2 6 0 5 </s>

Numbers ``0 .. 999 999``. The alignment is known: each digit comes from one source word
(``alignment``): the hundreds digit of a group from the unit word before "hundred", the tens
digit from the tens word ("forty") or a teen ("twelve", which gives two digits), the units
digit from the unit word or the teen; a digit 0 comes from no word ("three hundred five"
has none for its tens). Source and target differ in length and their positions do not
line up ("hundred" and "thousand" give no digit, teens give two), so a decoder can only
find the word to translate by looking for it: its cross-attention has to learn the alignment.

``NumberTokenizer`` is the task's word-level tokenizer, a Hugging Face one (ids 0 ``<pad>``,
1 ``</s>``, 2 ``<s>``, then the 30 words, then the 10 digits); it also answers
``alignment(source_ids, target_ids)`` for the report. ``train_translation_model`` trains the shipped model:
deterministic for a
seed, on one CPU thread, in a few minutes. Numbers for which ``is_held_out`` holds (about 3%
of those with 3 to 6 digits) are never trained on; ``evaluate`` measures exact-match
accuracy on them.
"""

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from interp_transformer.core.losses import IGNORE_INDEX
from interp_transformer.core.shape_checks import shape_checking
from interp_transformer.families.seq2seq.recipe import Seq2SeqConfig
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer

UNITS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TEENS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
SPECIAL = ("<pad>", "</s>", "<s>")
WORDS = ("zero",) + UNITS + TEENS + TENS + ("hundred", "thousand")
DIGITS = tuple(str(d) for d in range(10))
VOCAB = SPECIAL + WORDS + DIGITS
PAD, EOS, START = 0, 1, 2
LARGEST = 999_999
HELD_OUT_MODULUS = 31  # numbers with n * 2654435761 % 31 == 0 are held out


def _group(value: int) -> list[tuple[str, set[int]]]:
    """Words of ``0 < value < 1000``, each with the places (2 hundreds, 1 tens, 0 units) whose digit it gives."""
    words: list[tuple[str, set[int]]] = []
    hundreds, rest = divmod(value, 100)
    if hundreds:
        words += [(UNITS[hundreds - 1], {2}), ("hundred", set())]
    if 10 <= rest <= 19:
        words.append((TEENS[rest - 10], {1, 0}))
    else:
        if rest >= 20:
            words.append((TENS[rest // 10 - 2], {1}))
        if rest % 10:
            words.append((UNITS[rest % 10 - 1], {0}))
    return words


def spell(number: int) -> list[str]:
    """``spell(342006) == ["three", "hundred", "forty", "two", "thousand", "six"]``."""
    return [word for word, _ in spelled_with_places(number)]


def spelled_with_places(number: int) -> list[tuple[str, set[int]]]:
    """The words of ``number``, each with the places (0 = units .. 5 = hundred thousands) whose digit it gives."""
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= LARGEST:
        raise ValueError(f"number must be an int in [0, {LARGEST}], got {number!r}")
    if number == 0:
        return [("zero", {0})]
    thousands, units = divmod(number, 1000)
    words: list[tuple[str, set[int]]] = []
    if thousands:
        words += [(word, {place + 3 for place in places}) for word, places in _group(thousands)] + [("thousand", set())]
    if units:
        words += _group(units)
    return words


def alignment_of(number: int) -> list[int]:
    """For each digit of ``number`` (left to right), the index of the source word it comes from, or -1 (a 0 from no
    word)."""
    digits = str(number)
    by_place = {place: index for index, (_, places) in enumerate(spelled_with_places(number)) for place in places}
    return [by_place.get(len(digits) - 1 - position, -1) for position in range(len(digits))]


def is_held_out(number: int) -> bool:
    """Whether ``number`` is kept out of training: about 1 in 31 numbers of 3 to 6 digits (every shorter one is trained
    on)."""
    return number >= 100 and number * 2654435761 % HELD_OUT_MODULUS == 0


class NumberTokenizer(PreTrainedTokenizerFast):
    """The task's word-level tokenizer (see the module docstring): a Hugging Face tokenizer that also knows the
    alignment.

    Build it with ``NumberTokenizer.create()``. Text is words (or digits) separated by spaces;
    ``</s>`` is appended; a word outside the vocabulary raises ``ValueError`` naming it.
    """

    @classmethod
    def create(cls) -> "NumberTokenizer":
        from tokenizers import Tokenizer, models, pre_tokenizers, processors

        backend = Tokenizer(models.WordLevel({token: index for index, token in enumerate(VOCAB)}, unk_token=None))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
        return cls(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", bos_token="<s>")

    def __call__(self, text=None, *args, **kwargs):
        texts = [text] if isinstance(text, str) else list(text) if isinstance(text, (list, tuple)) else []
        unknown = sorted({word for t in texts for word in t.split() if word not in WORDS and word not in DIGITS})
        if unknown or not texts or any(not t.split() for t in texts):
            raise ValueError(f"unknown words {unknown} in {text!r}: the vocabulary is {list(WORDS)} and the digits 0-9")
        return super().__call__(text, *args, **kwargs)

    def alignment(self, source: Sequence[int], target: Sequence[int]) -> list[int] | None:
        """For each target position (the decoder's input, from ``<s>``), the source position its next token comes from.

        The decoder at position ``t`` predicts target token ``t + 1``, so entry ``t`` is the source
        word of that digit, or -1 (a 0 from no word, ``</s>``). None when the source is not a
        number of the task.
        """
        words = [VOCAB[int(index)] for index in source if int(index) not in (PAD, EOS)]
        try:
            number = words_to_number(words)
        except ValueError:
            return None
        aligned = alignment_of(number)
        return [aligned[t] if t < len(aligned) else -1 for t in range(len(target))]


def words_to_number(words: Sequence[str]) -> int:
    """The number a list of words spells (its inverse, ``spell``, checks it); ``ValueError`` if it spells none."""
    value, group = 0, 0
    for word in words:
        if word in UNITS:
            group += UNITS.index(word) + 1
        elif word in TEENS:
            group += TEENS.index(word) + 10
        elif word in TENS:
            group += (TENS.index(word) + 2) * 10
        elif word == "hundred":
            group *= 100
        elif word == "thousand":
            value, group = group * 1000, 0
        elif word != "zero":
            raise ValueError(f"{word!r} is not a number word")
    number = value + group
    if not 0 <= number <= LARGEST or spell(number) != list(words):
        raise ValueError(f"{' '.join(words)!r} does not spell a number the way the task does")
    return number


@functools.lru_cache(maxsize=1)
def shared_tokenizer() -> NumberTokenizer:
    """One tokenizer for the task's batches (building one takes milliseconds, but batches are many)."""
    return NumberTokenizer.create()


@dataclass
class Batch:
    """One batch of the task: source ids and mask, the decoder's input, the targets it predicts (``IGNORE_INDEX``,
    PyTorch's -100, where padded)."""

    source: Int[Tensor, "batch key_pos"]
    attention_mask: Int[Tensor, "batch key_pos"]
    decoder_input: Int[Tensor, "batch pos"]
    labels: Int[Tensor, "batch pos"]
    numbers: list[int]


def encode_numbers(numbers: Sequence[int]) -> Batch:
    """The batch of these numbers: ``<s> digits`` as decoder input, ``digits </s>`` as labels."""
    encoded = shared_tokenizer()([" ".join(spell(n)) for n in numbers], padding=True, return_tensors="pt")
    targets = [[VOCAB.index(d) for d in str(n)] for n in numbers]
    width = max(len(t) for t in targets) + 1
    decoder_input = torch.tensor([[START] + t + [PAD] * (width - 1 - len(t)) for t in targets])
    labels = torch.tensor([t + [EOS] + [IGNORE_INDEX] * (width - 1 - len(t)) for t in targets])
    return Batch(encoded["input_ids"], encoded["attention_mask"], decoder_input, labels, list(numbers))


def sample_numbers(n: int, generator: torch.Generator, held_out: bool = False) -> list[int]:
    """``n`` numbers, their digit count uniform (1..6, or 3..6 for the held-out set), uniform within it among
    the held-out numbers or the others."""
    numbers: list[int] = []
    while len(numbers) < n:
        digits = int(torch.randint(3 if held_out else 1, 7, (1,), generator=generator))
        low = 0 if digits == 1 else 10 ** (digits - 1)
        while True:
            number = int(torch.randint(low, 10**digits, (1,), generator=generator))
            if is_held_out(number) == held_out:
                break
        numbers.append(number)
    return numbers


def translate_tiny_config() -> Seq2SeqConfig:
    """The shipped model's shape: 2 encoder blocks and 1 decoder block of 4 heads, d_model 64 (about 118k parameters).

    One decoder block: its one cross-attention layer is where the alignment must be learned
    (with two, the second learns it and the first only roughly).
    """
    return Seq2SeqConfig(
        d_model=64,
        n_layers=2,
        n_decoder_layers=1,
        n_heads=4,
        d_head=16,
        d_mlp=128,
        d_vocab=len(VOCAB),
        n_ctx=16,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=START,
        name="translate-tiny",
    )


def sequence_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of the labelled target positions (``labels == IGNORE_INDEX`` left out)."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


@dataclass
class TranslationCurve:
    """Training loss and held-out exact-match accuracy, logged every ``log_every`` steps."""

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    held_out_accuracy: list[float] = field(default_factory=list)


@dataclass
class TranslationTraining:
    model: EncoderDecoderTransformer
    curve: TranslationCurve
    settings: dict


@torch.no_grad()
def evaluate(model: EncoderDecoderTransformer, numbers: Sequence[int]) -> float:
    """Exact-match accuracy of greedy translations of ``numbers`` (digits and the final ``</s>``)."""
    batch = encode_numbers(numbers)
    output = model.generate(batch.source, batch.attention_mask, max_new_tokens=8)
    correct = 0
    for row, number in zip(output.tolist(), numbers, strict=True):
        expected = [START] + [VOCAB.index(d) for d in str(number)] + [EOS]
        correct += row[: len(expected)] == expected
    return correct / len(numbers)


def train_translation_model(
    steps: int = 1500,
    batch: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    cfg: Seq2SeqConfig | None = None,
    progress: bool = True,
    log_every: int = 100,
    n_eval: int = 256,
) -> TranslationTraining:
    """Train the encoder-decoder on spelled-out numbers; deterministic for a seed (one CPU thread)."""
    cfg = cfg or translate_tiny_config()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = EncoderDecoderTransformer(cfg, tokenizer=NumberTokenizer.create(), seed=seed)
        generator = torch.Generator().manual_seed(seed + 1)
        eval_numbers = sample_numbers(n_eval, torch.Generator().manual_seed(seed + 2), held_out=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / steps))
        )
        curve = TranslationCurve()
        with shape_checking(False):
            for step in tqdm(range(steps), desc="training translate-tiny", disable=not progress):
                data = encode_numbers(sample_numbers(batch, generator))
                model.train()
                loss = sequence_loss(
                    model(data.source, data.decoder_input, attention_mask=data.attention_mask), data.labels
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
                if step % log_every == 0 or step == steps - 1:
                    model.eval()
                    curve.steps.append(step)
                    curve.loss.append(round(loss.item(), 4))
                    curve.held_out_accuracy.append(round(evaluate(model, eval_numbers), 4))
    finally:
        torch.set_num_threads(threads)
    model.eval()
    settings = dict(steps=steps, batch=batch, lr=lr, seed=seed)
    return TranslationTraining(model, curve, settings)


__all__ = [
    "NumberTokenizer",
    "TranslationCurve",
    "TranslationTraining",
    "VOCAB",
    "alignment_of",
    "encode_numbers",
    "evaluate",
    "is_held_out",
    "sample_numbers",
    "sequence_loss",
    "spell",
    "train_translation_model",
    "translate_tiny_config",
    "words_to_number",
]

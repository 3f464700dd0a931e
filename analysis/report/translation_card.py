"""The model card of ``translate-tiny``: the task, the command that retrains it, its training curve, and what it
learned.

What it learned is measured with the analysis tools, on numbers never trained on
(``interp_transformer.pretrained.translation.is_held_out``): the exact-match accuracy of its greedy
translations, and how closely each cross-attention head follows the task's known
alignment (``analysis.readouts.cross_attention.alignment_scores``).
"""

import dataclasses

import torch
from jaxtyping import Float
from torch import Tensor

from interp_transformer.pretrained.translation import (
    NumberTokenizer,
    TranslationTraining,
    encode_numbers,
    evaluate,
    sample_numbers,
)

from ..readouts.cross_attention import alignment_scores, cross_pattern_hook_names

TASK = (
    "Translate a number from 0 to 999999, spelled out in English words (the source, e.g. 'three hundred forty two "
    "thousand six hundred five'), into its digits (the target, '3 4 2 6 0 5'). Each digit comes from one source word "
    "(a 0 from none; a teen gives two digits; 'hundred' and 'thousand' give none), so source and target positions do "
    "not line up and the decoder finds the word to translate through cross-attention. About 1 in 31 numbers of 3 to "
    "6 digits is held out of training."
)
HELD_OUT_SEED = 12345  # the held-out numbers the card reports on


@torch.no_grad()
def held_out_alignment_scores(model, numbers: list[int]) -> Float[Tensor, "layer head_index"]:
    """Each cross-attention head's alignment score on ``numbers``, the decoder reading the correct digits."""
    batch = encode_numbers(numbers)
    tokenizer = NumberTokenizer.create()
    alignment = torch.tensor(
        [
            tokenizer.alignment(source.tolist(), target.tolist())
            for source, target in zip(batch.source, batch.decoder_input)
        ]
    )
    _, cache = model.run_with_cache(
        batch.source,
        batch.decoder_input,
        attention_mask=batch.attention_mask,
        names_filter=cross_pattern_hook_names(model),
    )
    return alignment_scores(cache, alignment)


def translation_model_card(training: TranslationTraining, n_held_out: int = 1000) -> dict:
    """The JSON model card (beside the config) of a trained ``translate-tiny``."""
    numbers = sample_numbers(n_held_out, torch.Generator().manual_seed(HELD_OUT_SEED), held_out=True)
    scores = held_out_alignment_scores(training.model, numbers[:500])
    best = [
        {"layer": layer, "head": int(row.argmax()), "score": round(float(row.max()), 4)}
        for layer, row in enumerate(scores)
    ]
    options = " ".join(f"--{name} {value}" for name, value in training.settings.items())
    return {
        "task": TASK,
        "command": f"interp-transformer train-translation {options}",
        "training": training.settings,
        "curve": dataclasses.asdict(training.curve),
        "held_out": {
            "numbers": n_held_out,
            "seed": HELD_OUT_SEED,
            "exact_match": round(evaluate(training.model, numbers), 4),
        },
        "alignment": {
            "what": "mean cross-attention on the source word each next digit comes from, on 500 held-out numbers",
            "best_head_per_layer": best,
        },
    }


__all__ = ["TASK", "held_out_alignment_scores", "translation_model_card"]

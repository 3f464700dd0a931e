"""Head detectors on repeated random tokens (which classify heads) and on the prompt.

Which detectors run follows the model's attention: a causal model gets previous-token,
duplicate-token and induction heads, plus its loss on each half of the repeated
sequences when its output is next-token logits; a bidirectional one gets previous-token,
next-token (only bidirectional attention reaches it) and duplicate-token heads counting
copies on both sides, on random sequences framed like the prompt (its first and last
tokens: ``[CLS]`` and ``[SEP]`` for BERT text).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from interp_transformer import ActivationCache
from interp_transformer.core.losses import lm_loss

from ... import plots
from ...readouts import attention
from ..context import ReportContext, ReportSection, SectionData, head_figure

RANDOM_SEQ_LEN = 20  # length of each half of the repeated random sequences the detectors run on
RANDOM_BATCH = 4
CAUSAL_DETECTORS = ("previous_token", "duplicate_token", "induction")
BIDIRECTIONAL_DETECTORS = ("previous_token", "next_token", "duplicate_token")
DETECTORS = CAUSAL_DETECTORS
DETECTOR_TITLES = {
    "previous_token": "previous-token",
    "duplicate_token": "duplicate-token",
    "induction": "induction",
    "next_token": "next-token",
}


@dataclass
class DetectorsData(SectionData):
    """Scores ``[layer, head_index]`` per detector (None: the tokens give it no target), and how they were made.

    ``lead`` is the detector whose best head the attention view opens on; the losses are
    the next-token loss on each half of the repeated sequences (None without next-token logits).
    """

    random: dict[str, Tensor | None]
    prompt: dict[str, Tensor | None]
    random_tokens: Tensor
    seq_len: int
    lead: str
    first_half_loss: float | None = None
    repeated_half_loss: float | None = None


def detector_scores(cache: ActivationCache, tokens: Tensor, names) -> dict[str, Tensor | None]:
    """Scores of each detector in ``names`` whose target marks at least one position of ``tokens``, else ``None``."""
    bidirectional = not cache.model.capabilities.causal
    has_target = {
        "previous_token": lambda: tokens.shape[1] >= 2,
        "next_token": lambda: tokens.shape[1] >= 2,
        "duplicate_token": lambda: bool(attention.duplicate_token_target(tokens, bidirectional).any()),
        "induction": lambda: bool(attention.induction_target(tokens).any()),
    }
    score = {
        "previous_token": lambda: attention.previous_token_scores(cache),
        "next_token": lambda: attention.next_token_scores(cache),
        "duplicate_token": lambda: attention.duplicate_token_scores(cache, tokens),
        "induction": lambda: attention.induction_scores(cache, tokens),
    }
    return {name: score[name]() if has_target[name]() else None for name in names}


def _explanation(causal: bool, seq_len: int, frame: str) -> str:
    kinds = (
        (
            "previous-token heads attend to the token just before the query, duplicate-token heads to earlier copies "
            "of the query's token, induction heads to the token after an earlier copy"
        )
        if causal
        else (
            "previous-token heads attend to the token just before the query, next-token heads to the token just after "
            "it (only bidirectional attention reaches it), duplicate-token heads to other copies of the query's token, "
            "earlier or later"
        )
    )
    return (
        f"A head's score is the mean attention it puts where the detector's target says (1 = all of it): {kinds}. "
        f"The scores that classify heads come from {RANDOM_BATCH} sequences of {seq_len} random tokens repeated "
        f"twice{frame}, so they do not depend on the prompt; the prompt's own scores follow."
    )


def detectors_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    causal = model.capabilities.causal
    names = CAUSAL_DETECTORS if causal else BIDIRECTIONAL_DETECTORS
    framing = [token for token in (ctx.bos, None if causal else ctx.eos) if token is not None]
    seq_len = min(RANDOM_SEQ_LEN, (model.cfg.n_ctx - len(framing)) // 2)
    if causal:
        frame = f" after token {ctx.token_label(ctx.bos)!r}" if ctx.bos is not None else ""
    else:
        frame = " between " + " and ".join(repr(ctx.token_label(token)) for token in framing) if framing else ""
    section = ReportSection("detectors", "Head detectors")
    section.paragraphs.append(_explanation(causal, seq_len, frame))
    random_tokens = attention.repeated_random_tokens(
        model, seq_len, RANDOM_BATCH, seed=0, bos=ctx.bos, eos=None if causal else ctx.eos
    )
    with torch.no_grad():
        output, cache = model.run_with_cache(random_tokens, names_filter=attention.pattern_hook_names(model))
    data = DetectorsData(
        random=detector_scores(cache, random_tokens, names),
        prompt=detector_scores(ctx.cache, ctx.tokens, names),
        random_tokens=random_tokens,
        seq_len=seq_len,
        lead="induction" if causal else "previous_token",
    )
    if model.capabilities.next_token_logits:
        # columns of per_token predict the next position; the first half's first token is unpredictable
        per_token = lm_loss(output, random_tokens, per_token=True)
        offset = int(ctx.bos is not None)
        data.first_half_loss = float(per_token[:, offset : offset + seq_len - 1].mean())
        data.repeated_half_loss = float(per_token[:, offset + seq_len - 1 :].mean())
    no_target = "no repeated token" if causal else "too short or no repeated token"
    for name in names:
        fig = plots.plot_head_scores(
            data.random[name], title=f"{DETECTOR_TITLES[name]} score<br><sup>repeated random tokens</sup>"
        )
        section.figures.append(head_figure(fig, model.cfg.n_layers, model.cfg.n_heads, unit_range=True))
    for name in names:
        if data.prompt[name] is None:
            section.paragraphs.append(
                f"The prompt gives the {DETECTOR_TITLES[name]} detector no target ({no_target}): not scored on the "
                "prompt."
            )
        else:
            fig = plots.plot_head_scores(
                data.prompt[name], title=f"{DETECTOR_TITLES[name]} score<br><sup>on the prompt</sup>"
            )
            section.figures.append(head_figure(fig, model.cfg.n_layers, model.cfg.n_heads, unit_range=True))
    section.data = data
    return section

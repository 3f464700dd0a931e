"""A feature's direct effect on the logits: its decoder direction read through the final norm and the unembedding.

Feature ``f`` writes ``acts_f * W_dec[f]`` at its hook, which reaches the residual stream as
``r_f = W_dec[f] M`` (``M`` from ``writes.residual_write``: the identity on the stream,
``W_O`` for ``hook_z``, ``W_out`` for ``hook_post``). With the final norm's scale frozen,
the logits are linear in the final residual stream, and one unit of ``f`` adds to the
logit of token ``t``::

    effect[f, t] = r_f . pull_back(W_U[:, t]) / scale

``pull_back`` is the final norm's own algebra (for LayerNorm ``w * d - mean(w * d)``: the
centring moved onto the direction; for RMSNorm ``w * d``), exactly as in direct logit
attribution (``analysis.readouts.attribution``). ``scale`` depends on the position; the effect here
is per unit of scale (``scale = 1``), so it ranks tokens, and ``feature_attribution``
divides by the real scale at a position. ``b_U`` is no feature's and is left out.
Needs ``model.capabilities.linear_logits`` (a pre-norm decoder).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.sae import SAE
from interp_transformer.sae.normalization import needs_stats
from interp_transformer.sae.sae import EncodeState

from .. import _checks
from ..readouts.attribution import POST_NORM_INSTEAD
from .writes import residual_write

VOCAB_CHUNK = 8192  # unembedding columns pulled back at a time: bounded memory for any vocabulary


def feature_indices(sae: SAE, features: None | int | Sequence[int] | Tensor) -> Tensor:
    """``features`` (None: all) as a ``[feature]`` int64 tensor, each checked to lie in ``[0, d_sae)``."""
    if features is None:
        return torch.arange(sae.d_sae)
    if isinstance(features, Tensor):
        features = features.tolist() if features.ndim else [int(features)]
    if isinstance(features, int) and not isinstance(features, bool):
        features = [features]
    if isinstance(features, (str, bytes)) or not isinstance(features, Sequence):
        raise TypeError(f"features must be None, an int or a sequence of ints, got {type(features).__name__}")
    bad = [f for f in features if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f < sae.d_sae]
    if bad or not features:
        raise ValueError(f"features must be ints in [0, d_sae={sae.d_sae}), at least one; got {list(features)[:10]}")
    return torch.tensor(list(features), dtype=torch.long)


@dataclass
class FeatureLogitEffect:
    """``effect [feature, d_vocab]`` per unit of activation (final-norm scale 1) and each feature's extremes.

    ``top_tokens``/``top_values`` ``[feature, k]``: the tokens each feature promotes most,
    largest first; ``bottom_tokens``/``bottom_values``: those it suppresses most, most
    negative first.
    """

    features: Int[Tensor, "feature"]
    effect: Float[Tensor, "feature d_vocab"]
    top_tokens: Int[Tensor, "feature k"]
    top_values: Float[Tensor, "feature k"]
    bottom_tokens: Int[Tensor, "feature k"]
    bottom_values: Float[Tensor, "feature k"]


def why_no_logit_effect(model: _checks.AnyModel, sae: SAE) -> str | None:
    """Why ``sae``'s features have no input-independent direct logit effect in ``model``, or None when they have one."""
    if not model.capabilities.linear_logits:
        return f"feature_logit_effect needs {_checks.NEEDS['linear_logits']}; this model {POST_NORM_INSTEAD}"
    if needs_stats(sae.cfg.normalize_activations) and not sae.is_transcoder:
        return (
            f"an SAE with normalize_activations={sae.cfg.normalize_activations!r} writes each feature scaled by a "
            "statistic of its input, so a feature has no input-independent logit effect; use feature_attribution "
            "on a prompt"
        )
    try:
        residual_write(model, sae)
    except ValueError as error:
        return str(error)
    return None


@torch.no_grad()
def feature_residual_directions(
    model: _checks.AnyModel, sae: SAE, features: Tensor
) -> Float[Tensor, "feature d_model"]:
    """``r_f = directions[f] M``: what one unit of each feature adds to the residual stream (module docstring)."""
    reason = why_no_logit_effect(model, sae)
    if reason is not None:
        raise ValueError(reason)
    directions, _, _ = sae.decode_affine(EncodeState(stats=None, d_head=None))
    write = residual_write(model, sae)
    return write.to_residual(directions[features.to(directions.device)].to(model.W_U.dtype))


@torch.no_grad()
def feature_logit_effect(
    model: _checks.AnyModel, sae: SAE, features: None | int | Sequence[int] | Tensor = None, k: int = 10
) -> FeatureLogitEffect:
    """Direct effect of one unit of each feature on every logit (module docstring), and its top and bottom ``k``
    tokens."""
    _checks.check_model(model)
    _checks.require(model, "linear_logits", "feature_logit_effect", POST_NORM_INSTEAD)
    features = feature_indices(sae, features)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= model.cfg.d_vocab:
        raise ValueError(f"k must be an int in [1, d_vocab={model.cfg.d_vocab}], got {k!r}")
    residual = feature_residual_directions(model, sae, features)  # [feature, d_model]
    W_U, norm = model.W_U, model.final_norm
    columns = []
    for W_U_chunk in W_U.split(VOCAB_CHUNK, dim=1):
        pulled = norm.pull_back(W_U_chunk.T)  # [chunk, d_model]: what the frozen norm reads for each token
        columns.append(residual @ pulled.T)
    effect = torch.cat(columns, dim=1)
    top, bottom = effect.topk(k, dim=1), effect.topk(k, dim=1, largest=False)
    return FeatureLogitEffect(features, effect, top.indices, top.values, bottom.indices, bottom.values)


__all__ = [
    "FeatureLogitEffect",
    "feature_indices",
    "feature_logit_effect",
    "feature_residual_directions",
    "why_no_logit_effect",
]

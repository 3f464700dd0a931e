"""Activation patching: which activations carry the difference between two prompts?

Run the model on a *corrupted* prompt, replace one activation with its value on the
*clean* prompt, and measure ``metric(logits)``. Sweeping the replacement over layers
and positions (residual stream) or layers and heads (head outputs) gives a map of
where the information that moves the metric lives::

    result[layer, pos] = metric(model(corrupted) with act_layer[:, pos] := clean act_layer[:, pos])

Patching an entire activation that everything downstream reads (the whole residual
stream at a layer) recovers the clean metric; patching a position or head where the
two runs already agree gives the corrupted one. Clean and corrupted prompts must
have the same shape so that positions line up.
"""

from collections.abc import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer import ActivationCache

from .. import _checks

Metric = Callable[[Tensor], Tensor | float]
RESIDUAL_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


def logit_diff_metric(
    correct: int | Int[Tensor, "batch"], incorrect: int | Int[Tensor, "batch"], pos: int = -1
) -> Metric:
    """``metric(logits) = mean_batch(logits[b, pos, correct_b] - logits[b, pos, incorrect_b])``.

    The mean of ``analysis.discovery.logit_diff_per_row``, which checks the token ids against ``[0, d_vocab)`` and
    ``pos`` against ``[-n_pos, n_pos)`` (negative: from the end)."""
    from ..discovery.batched import logit_diff_per_row

    per_row = logit_diff_per_row(correct, incorrect, pos)

    def metric(logits: Float[Tensor, "batch pos d_vocab"]) -> Tensor:
        return per_row(logits, torch.arange(logits.shape[0], device=logits.device)).mean()

    return metric


def _evaluate(metric: Metric, logits: Tensor, tool: str, at: str) -> float:
    """The metric's one finite value on ``logits``, the run of ``tool`` patched ``at``."""
    value = metric(logits)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric must return a scalar, got a tensor of shape {tuple(value.shape)}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"metric must return a scalar tensor or float, got {type(value).__name__}")
    return float(_checks.finite_metric(value, tool, lambda _: at))


def _prepare(model: _checks.AnyModel, clean_tokens, corrupted_tokens, metric) -> tuple[Tensor, Tensor]:
    _checks.check_model(model)
    _checks.require(
        model,
        "next_token_logits",
        "activation patching",
        "returns no next-token logits: patching is built and tested for decoders only",
    )
    if not callable(metric):
        raise TypeError(f"metric must be a callable logits -> scalar, got {type(metric).__name__}")
    clean, corrupted = model.prepare_tokens(clean_tokens), model.prepare_tokens(corrupted_tokens)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean tokens {tuple(clean.shape)} and corrupted tokens {tuple(corrupted.shape)} must have the same "
            "[batch, pos] shape so that positions line up"
        )
    return clean, corrupted


def _clean_activations(model, clean, clean_cache: ActivationCache | None, names: list[str], analysis: str) -> dict:
    if clean_cache is None:
        _, clean_cache = model.run_with_cache(clean, names_filter=names)
    _checks.check_cache(clean_cache)
    _checks.require_hooks(clean_cache, names, analysis)
    activations = {name: _checks.cached(clean_cache, name) for name in names}
    for name, activation in activations.items():
        if activation.shape[:2] != clean.shape:
            raise ValueError(
                f"clean_cache[{name!r}] has batch/pos {tuple(activation.shape[:2])}, the tokens {tuple(clean.shape)}"
            )
    return activations


def _residual_hook_name(model: _checks.AnyModel, kind: str, layer: int) -> str:
    if kind not in RESIDUAL_KINDS:
        raise ValueError(f"kind must be one of {RESIDUAL_KINDS}, got {kind!r}")
    name = model.act_name(kind, layer)
    if name not in model.hook_dict:
        there = [other for other in RESIDUAL_KINDS if model.act_name(other, layer) in model.hook_dict]
        raise ValueError(
            f"kind={kind!r}: this model has no {name} (an attention-only block has no MLP, a parallel block no "
            f"residual mid-point); its blocks have {there}"
        )
    return name


@torch.no_grad()
def patch_residual(
    model: _checks.AnyModel,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    *,
    kind: str = "resid_pre",
    per_position: bool = True,
    clean_cache: ActivationCache | None = None,
    progress: bool = True,
) -> Float[Tensor, "layer pos"] | Float[Tensor, "layer"]:
    """Patch the clean ``hook_{kind}`` into the corrupted run, one (layer, position) at a time.

    ``kind`` is ``resid_pre`` (default), ``resid_mid``, ``resid_post``, ``attn_out`` or
    ``mlp_out``. Returns ``[layer, pos]`` metric values; with ``per_position=False`` every
    position of a layer is patched at once, giving ``[layer]``. ``clean_cache`` may be
    passed to reuse a clean run; otherwise one is made. One forward pass per entry.
    """
    clean, corrupted = _prepare(model, clean_tokens, corrupted_tokens, metric)
    n_layers, n_pos = model.cfg.n_layers, clean.shape[1]
    names = [_residual_hook_name(model, kind, layer) for layer in range(n_layers)]
    clean_acts = _clean_activations(model, clean, clean_cache, names, "patch_residual")
    position_sets = [slice(p, p + 1) for p in range(n_pos)] if per_position else [slice(None)]
    results = torch.empty(n_layers, len(position_sets), dtype=torch.float64)
    with tqdm(total=results.numel(), desc=f"patching {kind}", disable=not progress) as bar:
        for layer, name in enumerate(names):
            for index, positions in enumerate(position_sets):

                def patch(activation: Tensor, hook, positions=positions, name=name) -> Tensor:
                    patched = activation.clone()
                    patched[:, positions] = clean_acts[name][:, positions]
                    return patched

                logits = model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])
                at = f"layer {layer}, " + (f"position {index}" if per_position else "every position")
                results[layer, index] = _evaluate(metric, logits, "patch_residual", at)
                bar.update(1)
    return results if per_position else results[:, 0]


@torch.no_grad()
def patch_head_outputs(
    model: _checks.AnyModel,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    *,
    clean_cache: ActivationCache | None = None,
    progress: bool = True,
) -> Float[Tensor, "layer head_index"]:
    """Patch each head's clean output into the corrupted run, at every position at once.

    A head's output is its slice ``hook_z[:, :, head]`` (what ``W_O[head]`` then writes to
    the residual stream). Returns ``[layer, head_index]`` metric values.
    """
    clean, corrupted = _prepare(model, clean_tokens, corrupted_tokens, metric)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    names = [model.act_name("z", layer) for layer in range(n_layers)]
    clean_z = _clean_activations(model, clean, clean_cache, names, "patch_head_outputs")
    results = torch.empty(n_layers, n_heads, dtype=torch.float64)
    with tqdm(total=results.numel(), desc="patching heads", disable=not progress) as bar:
        for layer, name in enumerate(names):
            for head in range(n_heads):

                def patch(z: Tensor, hook, head=head, name=name) -> Tensor:
                    patched = z.clone()
                    patched[:, :, head] = clean_z[name][:, :, head]
                    return patched

                logits = model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])
                results[layer, head] = _evaluate(metric, logits, "patch_head_outputs", f"layer {layer}, head {head}")
                bar.update(1)
    return results

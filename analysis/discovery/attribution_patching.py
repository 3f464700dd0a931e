"""Attribution patching (AtP): every site's patching effect from one forward and one backward pass.

Activation patching site ``s`` changes the metric by ``m(corrupt with s := clean) - m(corrupt)``. Its
first-order estimate around the corrupted run is::

    atp[s, b] = sum over the site's slice of (clean_s - corrupt_s) * d m_b / d act_s      (at the corrupted run)

one gradient for every site at once: a forward on the corrupted prompts that keeps each
sited activation, a backward of the per-prompt metric summed over prompts (prompts never
interact, so each row's gradient is its own prompt's), and a product with the clean
activations. It is the derivative of patching: ``tests/test_attribution_patching.py`` holds
it equal to central finite differences of patching along ``corrupt + t (clean - corrupt)``.

What it is not: exact. Where the model is far from linear between the two runs (attention
saturating, a head's effect cancelling through later layers), AtP misestimates. AtP*'s
GradDrop (``grad_drop=True``) ranks nodes whose effect cancels along their paths; its
query/key fix (recomputing the attention pattern for patches of queries and keys) does not
apply to these sites, which are after the pattern. Use ``patch_sites`` to confirm the sites
AtP ranks first.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .. import _checks
from .batched import Site, _check_sites, _clean_activations, _start
from .metrics import RowMetric, row_values


def _site_values(tensor: Tensor, site: Site) -> Tensor:
    """``tensor``'s slice at ``site``, summed over every axis but the batch: ``[batch]``."""
    where = (slice(None), slice(None) if site.pos is None else site.pos) + site.index
    selected = tensor[where]
    return selected.reshape(selected.shape[0], -1).sum(dim=-1)


def _estimates(model, corrupted, mask, metric, sites_, clean_acts, extra_hooks=()) -> Tensor:
    """``(clean - corrupt) . d metric / d act`` per site and prompt, one forward and backward with ``extra_hooks``."""
    batch = corrupted.shape[0]
    names = list(dict.fromkeys(site.hook for site in sites_))
    kept: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        kept[hook.name] = activation

    kwargs = {} if mask is None else {"attention_mask": mask}
    with torch.enable_grad():
        hooks = [(name, keep) for name in names] + list(extra_hooks)
        logits = model.run_with_hooks(corrupted, fwd_hooks=hooks, **kwargs)
        values = row_values(metric, logits, torch.arange(batch, device=logits.device), "attribution_patching")
        if not values.requires_grad:
            raise ValueError("the metric's values do not depend on the logits (no gradient reaches them)")
        grads = torch.autograd.grad(values.sum(), [kept[name] for name in names], allow_unused=True)
    grad_of = {name: (g if g is not None else torch.zeros_like(kept[name])) for name, g in zip(names, grads)}
    rows = [
        _site_values((clean_acts[site.hook] - kept[site.hook].detach()) * grad_of[site.hook], site) for site in sites_
    ]
    return torch.stack(rows).to(torch.float64)


def _drop_gradient(activation: Tensor, hook) -> Tensor:
    """The same value, with no gradient flowing back through it (GradDrop)."""
    return activation.detach()


def attribution_patching(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    sites_: Sequence[Site],
    *,
    grad_drop: bool = False,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, "site batch"]:
    """``atp[s, b]``: the first-order estimate of patching site ``s`` clean on prompt ``b`` (module docstring).

    ``grad_drop=True``: AtP*'s GradDrop score instead, ``sum over blocks l of |AtP with no gradient through block
    l's writes| / (n_layers - 1)``, one more backward pass per block. Where a node's effect cancels along its
    paths, dropping one path exposes it; the score is for ranking (finding the nodes AtP misses), not an estimate
    of patching."""
    if not isinstance(grad_drop, bool):
        raise TypeError(f"grad_drop must be a bool, got {type(grad_drop).__name__}")
    model, clean, corrupted, mask = _start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    _check_sites(model, sites_, clean.shape[1])
    with torch.no_grad():
        clean_acts = _clean_activations(model, clean, mask, sites_)
    if not grad_drop:
        return _estimates(model, corrupted, mask, metric, sites_, clean_acts)
    n_layers = model.cfg.n_layers
    if n_layers < 2:
        raise ValueError(f"GradDrop averages over dropping each of at least 2 blocks; this model has {n_layers}")
    total = 0
    for block in model.blocks:
        dropped = [(writer.output, _drop_gradient) for writer in block.writers()]
        total = total + _estimates(model, corrupted, mask, metric, sites_, clean_acts, dropped).abs()
    return total / (n_layers - 1)


__all__ = ["attribution_patching"]

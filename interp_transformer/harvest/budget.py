"""Batch size and shard size under a memory budget.

While harvesting, a process holds two kinds of activations:

- the cache of one batch, exactly ``model.estimate_cache_bytes(batch_size,
  context_length, hooks, dtype)`` bytes (what ``run_with_cache`` keeps), and the
  batch's output: the residual stream when the forward stops early, the logits
  ``[batch, pos, d_vocab]`` when a hook needs the full forward;
- the shard being filled: ``shard_contexts * bytes_per_context``, where one context
  stores ``sum over hooks of prod(shape) * itemsize`` plus its token ids and index.

``held = cache(batch_size) + output(batch_size) + shard_contexts * bytes_per_context`` must fit in
``memory_budget_bytes`` when one is given. Weights and the forward pass's
transient tensors (freed as it goes) are not part of the budget.
Without a ``batch_size``, the largest batch that fits is chosen; when even
``batch_size=1`` with one-context shards does not fit, the run is refused with
that minimum.
"""

import contextlib
import math
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from interp_transformer.harvest.selection import HookLayout

SHARD_TARGET_BYTES = 128 * 2**20  # default shard size, when neither the caller nor the budget fixes it
MAX_AUTO_BATCH = 4096


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    shard_contexts: int
    cache_bytes: int  # one batch's run_with_cache, and its output
    bytes_per_context: int  # what one context adds to a shard
    held_bytes: int  # cache_bytes + one full shard


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def bytes_per_context(layouts: Sequence[HookLayout], dtype: torch.dtype, context_length: int) -> int:
    """Bytes one context adds to a shard: every hook's activation, its token ids (int32) and index (int64)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(math.prod(layout.shape) for layout in layouts) * itemsize + 4 * context_length + 8


def plan_batches(
    model,
    hooks: list[str],
    layouts: Sequence[HookLayout],
    context_length: int,
    dtype: torch.dtype,
    n_contexts: int,
    batch_size: int | None,
    memory_budget_bytes: int | None,
    shard_contexts: int | None = None,
    output_bytes_per_context: int = 0,
) -> BatchPlan:
    """Choose (or check) the batch size and the shard size; ``ValueError`` when the budget cannot hold them."""
    _check_positive("batch_size", batch_size)
    _check_positive("shard_contexts", shard_contexts)
    _check_positive("memory_budget_bytes", memory_budget_bytes)
    per_context = bytes_per_context(layouts, dtype, context_length)

    def cache(batch: int) -> int:
        return model.estimate_cache_bytes(batch, context_length, hooks, dtype) + batch * output_bytes_per_context

    def held(batch: int, shard: int) -> int:
        return cache(batch) + min(shard, n_contexts) * per_context

    if batch_size is None:
        if memory_budget_bytes is None:
            raise ValueError("give batch_size, or memory_budget_bytes to choose it")
        batch_size = _largest_fitting_batch(
            lambda b: held(b, shard_contexts or b), memory_budget_bytes, min(n_contexts, MAX_AUTO_BATCH)
        )
        if batch_size == 0:
            raise ValueError(_too_small(memory_budget_bytes, held(1, 1), "even batch_size=1"))
    batch_cache = cache(batch_size)
    if shard_contexts is None:
        target = (
            SHARD_TARGET_BYTES
            if memory_budget_bytes is None
            else min(SHARD_TARGET_BYTES, memory_budget_bytes - batch_cache)
        )
        shard_contexts = batch_size * max(1, int(target // (batch_size * per_context)))
    plan = BatchPlan(
        batch_size,
        shard_contexts,
        batch_cache,
        per_context,
        batch_cache + min(shard_contexts, n_contexts) * per_context,
    )
    if memory_budget_bytes is not None and plan.held_bytes > memory_budget_bytes:
        raise ValueError(
            _too_small(
                memory_budget_bytes,
                plan.held_bytes,
                f"batch_size={batch_size} with {shard_contexts} contexts per shard",
                held(1, 1),
            )
        )
    return plan


def _largest_fitting_batch(held, budget: int, upper: int) -> int:
    """The largest ``b`` in ``[0, upper]`` with ``held(b) <= budget`` (``held`` grows with ``b``)."""
    low, high = 0, upper
    while low < high:
        middle = (low + high + 1) // 2
        if held(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def _too_small(budget: int, needed: int, what: str, minimum: int | None = None) -> str:
    floor = (
        ""
        if minimum is None
        else f"; the smallest harvest (batch_size=1, one context per shard) needs {minimum} bytes "
        f"({format_bytes(minimum)})"
    )
    return (
        f"memory_budget_bytes={budget} ({format_bytes(budget)}) is too small: {what} holds {needed} bytes "
        f"({format_bytes(needed)}) of activations{floor}. Raise the budget, or keep fewer hooks or a shorter context"
    )


def _check_positive(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, received {value!r}")


# ---- measuring what the budget bounds (Linux /proc; elsewhere the process-lifetime peak) -------------


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss_bytes() -> int | None:
    """Resident memory of this process now (``VmRSS``), or None where ``/proc`` is absent."""
    return _status_bytes("VmRSS")


def reset_peak_rss() -> None:
    """Start a new peak window: on Linux, ``5`` into ``/proc/self/clear_refs`` resets ``VmHWM``."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    """Peak resident memory since ``reset_peak_rss`` (``VmHWM``), else over the process's life."""
    peak = _status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

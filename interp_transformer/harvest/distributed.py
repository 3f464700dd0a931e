"""The process group a harvest runs in: one process, or ``torchrun``'s ranks.

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (and the
rendezvous variables) in each process's environment. ``init_distributed`` reads
them and joins the group with NCCL when CUDA is available and gloo otherwise;
nothing else needs configuring. A group the caller already initialised is used
as it is and left open. Without those variables the harvest runs as a single
process.

Steps only rank 0 performs (tokenizing the corpus, checking and writing the
manifest) go through ``DistContext.on_rank0``: its result, or the error it
raised, reaches every rank, so a refused run stops all ranks with the same
message instead of leaving them waiting at a barrier.
"""

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
# How long a rank waits for the others at a collective. Rank 0 tokenizes the whole corpus while the
# others wait, which takes longer than torch's default 30 minutes on a large text corpus.
TIMEOUT_ENV = "INTERP_TRANSFORMER_HARVEST_TIMEOUT_MINUTES"
DEFAULT_TIMEOUT_MINUTES = 180
# Errors re-raised on every rank with their own type; anything else arrives as a RuntimeError.
_PORTABLE_ERRORS = {cls.__name__: cls for cls in (ValueError, TypeError, KeyError, FileNotFoundError, OSError)}


@dataclass
class DistContext:
    """This process's place in the run: ``rank`` of ``world_size``, and the device it computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None  # None: a single process, no group
    owns_group: bool = False  # True when init_distributed created the group (and close() destroys it)

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.backend is not None:
            dist.barrier()

    def broadcast_from_rank0(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; keep it small)."""
        if self.backend is None:
            return obj
        box = [obj if self.is_rank0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_to_all(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.backend is None:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def on_rank0(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 only; every rank returns its result or raises its error."""
        outcome: tuple = ("ok", None)
        original: BaseException | None = None
        if self.is_rank0:
            try:
                outcome = ("ok", fn())
            except (ValueError, TypeError, KeyError, OSError, RuntimeError) as error:
                if self.backend is None:
                    raise
                original, outcome = error, ("error", (type(error).__name__, _message(error)))
        outcome = self.broadcast_from_rank0(outcome)
        if original is not None:
            raise original
        if outcome[0] == "error":
            name, message = outcome[1]
            raise _PORTABLE_ERRORS.get(name, RuntimeError)(message)
        return outcome[1]

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


def _message(error: BaseException) -> str:
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, received {value!r}") from None


def init_distributed(device: torch.device | None = None) -> DistContext:
    """Join (or create) the process group ``torchrun`` describes; a single process without it.

    The device is ``device`` if given, else ``cuda:LOCAL_RANK`` when CUDA is
    available (NCCL), else the CPU (gloo). Collectives time out after
    ``INTERP_TRANSFORMER_HARVEST_TIMEOUT_MINUTES`` (default 180).
    """
    use_cuda = torch.cuda.is_available()
    local_rank = _env_int("LOCAL_RANK", 0)
    if device is None:
        device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_available() and dist.is_initialized():
        return DistContext(
            dist.get_rank(), dist.get_world_size(), local_rank, device, dist.get_backend(), owns_group=False
        )
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return DistContext(0, 1, local_rank, device)
    if not dist.is_available():
        raise RuntimeError(
            f"WORLD_SIZE={world_size} asks for several processes, but this torch build has no torch.distributed"
        )
    backend = "nccl" if device.type == "cuda" else "gloo"
    minutes = _env_int(TIMEOUT_ENV, DEFAULT_TIMEOUT_MINUTES)
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=minutes))
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, device, backend, owns_group=True)

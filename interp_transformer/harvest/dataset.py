"""Reading a harvest back: a map-style ``Dataset``, a shuffling sampler, and a streaming ``IterableDataset``.

Shards are opened with ``safetensors.safe_open``, which memory-maps the file:
reading one context touches only that context's bytes. Each item is a dict::

    {hook_name: Tensor[*shape], ..., "token_ids": Int[pos], "context_index": int}

(``unit="token"`` in ``ActivationStream`` gives one position per item instead:
``{hook_name: Tensor[d...], "token_id": int, "context_index": int, "position": int}``).

Shuffling is by shard, then within a buffer, from a seed: the order is the same
for the same seed and epoch, and reading stays within a few shards at a time.
"""

import bisect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from interp_transformer.harvest.manifest import Manifest, ShardRecord


def _chosen_hooks(manifest: Manifest, hooks: Sequence[str] | None) -> list[str]:
    if hooks is None:
        return manifest.hook_names
    hooks = [hooks] if isinstance(hooks, str) else list(hooks)
    for name in hooks:
        manifest.hook_shape(name)  # KeyError naming the hooks this harvest holds
    return hooks


def _open_manifest(out_dir, check_hashes: bool) -> Manifest:
    return Manifest.read(out_dir).verify(check_hashes=check_hashes)


class ActivationShards(Dataset):
    """The contexts of a harvest folder, by global context index, read from memory-mapped shards.

    ``hooks`` picks some of the harvested hooks (default: all). The folder must
    hold a complete harvest; ``check_hashes=True`` also re-hashes every file
    first. Each DataLoader worker opens its own file handles.
    """

    def __init__(self, out_dir: str | Path, hooks: Sequence[str] | None = None, check_hashes: bool = False):
        self.manifest = _open_manifest(out_dir, check_hashes)
        self.hooks = _chosen_hooks(self.manifest, hooks)
        self.shards: list[ShardRecord] = sorted(self.manifest.shards, key=lambda s: s.first_context)
        self._firsts = [shard.first_context for shard in self.shards]
        self._handles: dict[int, object] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.manifest.n_contexts

    def _handle(self, shard: ShardRecord):
        if self._pid != os.getpid():  # a forked DataLoader worker: never share the parent's mappings
            self._handles, self._pid = {}, os.getpid()
        if shard.index not in self._handles:
            self._handles[shard.index] = safe_open(
                str(self.manifest.out_dir / shard.file), framework="pt", device="cpu"
            )
        return self._handles[shard.index]

    def __getitem__(self, index: int) -> dict:
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"index must be an int, received {type(index).__name__}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"context index {index} is out of range for {n} contexts")
        index %= n
        shard = self.shards[bisect.bisect_right(self._firsts, index) - 1]
        local = index - shard.first_context
        handle = self._handle(shard)
        item = {name: handle.get_slice(name)[local] for name in self.hooks}
        item["token_ids"] = handle.get_slice("token_ids")[local]
        item["context_index"] = int(handle.get_slice("context_index")[local])
        return item

    def close(self) -> None:
        """Drop the open file mappings (they are also dropped with the dataset)."""
        self._handles = {}


class ShardShuffleSampler(Sampler[int]):
    """Context indices of an ``ActivationShards``: shards in a random order, each shard's contexts shuffled.

    Deterministic for ``seed`` and the epoch set with ``set_epoch``; reads one
    shard at a time, which keeps memory-mapped reads local.
    """

    def __init__(self, dataset: ActivationShards, seed: int = 0):
        self.shards = [(s.first_context, s.stop_context) for s in dataset.shards]
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(stop - first for first, stop in self.shards)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        for shard in torch.randperm(len(self.shards), generator=generator).tolist():
            first, stop = self.shards[shard]
            yield from (first + i for i in torch.randperm(stop - first, generator=generator).tolist())


class ActivationStream(IterableDataset):
    """A harvest as a stream: shards in a seeded random order, items mixed in a shuffle buffer.

    ``unit="context"`` yields contexts; ``unit="token"`` yields single positions
    (only for hooks shaped ``[pos, ...]``), skipping position 0 when
    ``exclude_bos`` and the harvest prepended a BOS. ``buffer_size`` items are
    held and drawn at random (``buffer_size=1``: shard order only;
    ``shuffle=False``: the global order). DataLoader workers, and the ranks
    given by ``rank``/``world_size``, each read their own shards.
    """

    def __init__(
        self,
        out_dir: str | Path,
        hooks: Sequence[str] | None = None,
        *,
        unit: Literal["context", "token"] = "context",
        shuffle: bool = True,
        seed: int = 0,
        buffer_size: int = 4096,
        exclude_bos: bool = False,
        rank: int = 0,
        world_size: int = 1,
        check_hashes: bool = False,
    ):
        if unit not in ("context", "token"):
            raise ValueError(f"unit must be 'context' or 'token', received {unit!r}")
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, received {buffer_size!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), received {rank}")
        self.manifest = _open_manifest(out_dir, check_hashes)
        self.hooks = _chosen_hooks(self.manifest, hooks)
        if unit == "token":
            spread = [name for name in self.hooks if tuple(self.manifest.hook_pos_axes(name)) != (0,)]
            if spread:
                raise ValueError(
                    f"unit='token' needs hooks shaped [pos, ...]; {spread} are not (e.g. attention patterns)"
                )
        self.unit, self.shuffle, self.seed, self.buffer_size = unit, shuffle, seed, buffer_size
        self.skip = 1 if exclude_bos and self.manifest.fingerprint["prepend_bos"] else 0
        self.rank, self.world_size, self.epoch = rank, world_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _my_shards(self) -> list[ShardRecord]:
        shards = sorted(self.manifest.shards, key=lambda s: s.first_context)
        if self.shuffle:
            order = torch.randperm(
                len(shards), generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            )
            shards = [shards[i] for i in order.tolist()]
        worker = get_worker_info()
        n_workers, worker_id = (worker.num_workers, worker.id) if worker is not None else (1, 0)
        return shards[self.rank * n_workers + worker_id :: self.world_size * n_workers]

    def _items(self, shard: ShardRecord) -> Iterator[dict]:
        with safe_open(str(self.manifest.out_dir / shard.file), framework="pt", device="cpu") as handle:
            tensors = {name: handle.get_tensor(name) for name in self.hooks}
            token_ids, context_index = handle.get_tensor("token_ids"), handle.get_tensor("context_index")
        for row in range(shard.n_contexts):
            if self.unit == "context":
                # clones: a view would keep its whole shard alive while it waits in the buffer
                item = {name: tensors[name][row].clone() for name in self.hooks}
                yield {**item, "token_ids": token_ids[row].clone(), "context_index": int(context_index[row])}
                continue
            for position in range(self.skip, token_ids.shape[1]):
                item = {name: tensors[name][row, position].clone() for name in self.hooks}
                yield {
                    **item,
                    "token_id": int(token_ids[row, position]),
                    "context_index": int(context_index[row]),
                    "position": position,
                }

    def __iter__(self) -> Iterator[dict]:
        worker = get_worker_info()
        worker_id = worker.id if worker is not None else 0
        generator = torch.Generator().manual_seed(
            ((self.seed * 1_000_003 + self.epoch) * 7919 + self.rank) * 101 + worker_id
        )
        buffer: list[dict] = []
        for shard in self._my_shards():
            for item in self._items(shard):
                if not self.shuffle:
                    yield item
                    continue
                buffer.append(item)
                if len(buffer) >= self.buffer_size:
                    yield _pop_random(buffer, generator)
        while buffer:
            yield _pop_random(buffer, generator)


def _pop_random(buffer: list, generator: torch.Generator):
    """Remove and return a uniformly chosen item (swap with the last, then pop: O(1))."""
    index = int(torch.randint(len(buffer), (1,), generator=generator))
    buffer[index], buffer[-1] = buffer[-1], buffer[index]
    return buffer.pop()

"""``harvest``: run a model over a corpus and store the activations of chosen hooks, sharded.

How the work is split
---------------------
The contexts (see ``contexts``) are cut into shards of ``shard_contexts``
consecutive contexts: shard ``s`` holds contexts ``[s * shard_contexts,
(s + 1) * shard_contexts)``. Rank ``r`` of ``world_size`` computes the shards
``r, r + world_size, r + 2 * world_size, ...`` (interleaved), each in batches of
``batch_size`` starting at the shard's first context. The shards, and the batches
inside them, depend on neither the rank nor the number of processes, so N
processes write the very same files as one: byte for byte.

Resuming
--------
Rerunning the same command continues a stopped harvest: a shard whose record
exists and whose file has the recorded sha256 is kept, any other is computed
again, and temporary files of killed writers are removed. Because the shard
layout does not depend on the number of processes, a rerun may use a different
world size: every missing shard is assigned to some rank of the new run.
"""

import json
import os
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm.auto import tqdm

from interp_transformer.harvest.budget import BatchPlan, current_rss_bytes, peak_rss_bytes, plan_batches, reset_peak_rss
from interp_transformer.harvest.contexts import make_contexts, special_tokens, tokenize_documents
from interp_transformer.harvest.corpus import CorpusLike, as_corpus
from interp_transformer.harvest.distributed import DistContext, init_distributed
from interp_transformer.harvest.fingerprint import content_hash, make_fingerprint, tensor_sha256
from interp_transformer.harvest.manifest import FORMAT, Manifest, ShardRecord
from interp_transformer.harvest.selection import (
    HookLayout,
    HookSelection,
    forward_output_bytes,
    hook_layouts,
    select_hooks,
    stop_at_layer_for,
)
from interp_transformer.harvest.source import ModelSource, load_model
from interp_transformer.harvest.storage import (
    RUNS_FILE,
    TOKENS_FILE,
    atomic_write_json,
    atomic_write_text,
    check_writable,
    load_tensor,
    read_json,
    record_name,
    remove_stale_temporaries,
    save_tensors,
    sha256_of_file,
    shard_name,
)

# Testing only: "RANK:N[:record]" makes rank RANK kill itself (SIGKILL) while writing the N-th shard it
# computes in this run: once the temporary file is complete, or (":record") after the rename, before the record.
KILL_ENV = "INTERP_TRANSFORMER_HARVEST_KILL_AT"


def harvest(
    model_or_source: ModelSource,
    corpus: CorpusLike,
    out_dir: str | Path,
    *,
    hooks: HookSelection,
    context_length: int,
    batch_size: int | None,
    dtype: torch.dtype = torch.float32,
    prepend_bos: bool = True,
    memory_budget_bytes: int | None = None,
    progress: bool = True,
    shard_contexts: int | None = None,
    text_field: str = "text",
    bos_token_id: int | None = None,
    separator_token_id: int | None = None,
    model_dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
) -> Manifest:
    """Harvest the activations of ``hooks`` over ``corpus`` into ``out_dir``; returns the manifest.

    ``model_or_source``: a hooked model (``DemoTransformer``; moved to the device),
    ``"induction-2l"``, a Hugging Face directory or an in-memory ``transformers``
    model. ``corpus``: see ``corpus.as_corpus`` (text needs the model's tokenizer;
    a model without one takes token-id documents and ``bos_token_id``).
    ``hooks``: names, glob patterns or a predicate (see ``selection``).
    ``context_length``: tokens per context, the BOS included (see ``contexts``).
    ``batch_size``: contexts per forward pass; ``None`` picks the largest that
    ``memory_budget_bytes`` allows (see ``budget``). ``dtype``: storage dtype of the
    activations. ``shard_contexts``: contexts per shard file (default: about
    128 MiB per shard, a multiple of the batch size).

    Each shard file holds, per hook, a tensor ``[n_contexts_in_shard, *shape]``
    (``shape`` as one context's activation, e.g. ``[pos, d_model]``), plus
    ``context_index [n_contexts_in_shard]`` and ``token_ids [n_contexts_in_shard, pos]``.
    Under ``torchrun`` each rank computes its share; rank 0 writes the manifest
    once all are done. Rerunning the same call resumes (see the module docstring).
    """
    context = init_distributed(torch.device(device) if device is not None else None)
    try:
        return _harvest(
            context,
            model_or_source,
            corpus,
            Path(out_dir),
            hooks,
            context_length,
            batch_size,
            dtype,
            prepend_bos,
            memory_budget_bytes,
            progress,
            shard_contexts,
            text_field,
            bos_token_id,
            separator_token_id,
            model_dtype,
        )
    finally:
        context.close()


def _check_settings(model, context_length, dtype: torch.dtype, prepend_bos: bool) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype (the storage dtype) must be a floating torch dtype, received {dtype!r}")
    smallest = 2 if prepend_bos else 1
    if not isinstance(context_length, int) or isinstance(context_length, bool) or context_length < smallest:
        raise ValueError(
            f"context_length must be an int >= {smallest} (the BOS counts when prepend_bos), received "
            f"{context_length!r}"
        )
    if context_length > model.cfg.n_ctx:
        raise ValueError(f"context_length={context_length} is longer than the model's n_ctx={model.cfg.n_ctx}")


def _harvest(
    ctx: DistContext,
    source,
    corpus,
    out_dir: Path,
    hook_selection,
    context_length,
    batch_size,
    dtype,
    prepend_bos,
    memory_budget_bytes,
    progress,
    shard_contexts,
    text_field,
    bos_token_id,
    separator_token_id,
    model_dtype,
) -> Manifest:
    model, model_description = load_model(source, dtype=model_dtype, device=ctx.device)
    _check_settings(model, context_length, dtype, prepend_bos)
    hooks = select_hooks(list(model.hook_dict), hook_selection)
    specials = special_tokens(getattr(model, "tokenizer", None), prepend_bos, bos_token_id, separator_token_id)
    corpus = as_corpus(corpus, text_field)
    layouts = hook_layouts(model, hooks, context_length)
    stop_at_layer = stop_at_layer_for(model, hooks)
    output_bytes = forward_output_bytes(model, context_length, stop_at_layer)

    kept_on_rank0: dict = {}

    def prepare() -> dict:
        created = not out_dir.exists()
        try:
            return _prepare()
        except BaseException:
            if created and out_dir.is_dir() and not any(out_dir.iterdir()):
                out_dir.rmdir()  # a refused run leaves no trace
            raise

    def _prepare() -> dict:
        check_writable(out_dir)
        _refuse_foreign_folder(out_dir)
        remove_stale_temporaries(out_dir)
        ids = tokenize_documents(corpus, getattr(model, "tokenizer", None), model.cfg.d_vocab, progress)
        contexts = make_contexts(ids, context_length, specials.bos_token_id, specials.separator_token_id)
        fingerprint = make_fingerprint(
            model, hooks, context_length, prepend_bos, specials.bos_token_id, specials.separator_token_id, dtype
        )
        n_contexts = contexts.token_ids.shape[0]
        plan = plan_batches(
            model,
            hooks,
            layouts,
            context_length,
            dtype,
            n_contexts,
            batch_size,
            memory_budget_bytes,
            shard_contexts,
            output_bytes,
        )
        tokens = {
            "file": TOKENS_FILE,
            "tokens_sha256": tensor_sha256(contexts.token_ids),
            "n_contexts": n_contexts,
            "n_documents": contexts.n_documents,
            "n_stream_tokens": contexts.n_stream_tokens,
            "dropped_tokens": contexts.dropped_tokens,
        }
        manifest = Manifest(
            out_dir,
            complete=False,
            content_hash=content_hash(fingerprint),
            fingerprint=fingerprint,
            tokens=tokens,
            layout={
                "batch_size": plan.batch_size,
                "shard_contexts": plan.shard_contexts,
                "n_shards": -(-n_contexts // plan.shard_contexts),
            },
            hooks=[layout.to_json() for layout in layouts],
            model=model_description,
            corpus=corpus.description,
            world_size=ctx.world_size,
        )
        existing = Manifest.read(out_dir) if Manifest.exists(out_dir) else None
        if existing is not None:
            existing.refuse_if_different(manifest.comparable())
        tokens_path = out_dir / TOKENS_FILE
        recorded_sha = existing.tokens["sha256"] if existing is not None else None
        if recorded_sha is None or not tokens_path.is_file() or sha256_of_file(tokens_path) != recorded_sha:
            tokens["sha256"] = save_tensors(tokens_path, {"token_ids": contexts.token_ids}, {"format": FORMAT})
        else:
            tokens["sha256"] = recorded_sha
        if existing is None:
            manifest.write()
        kept_on_rank0["token_ids"] = contexts.token_ids  # the other ranks read the file rank 0 just wrote
        return {"manifest": manifest.to_json(), "plan": plan}

    prepared = ctx.on_rank0(prepare)
    plan: BatchPlan = prepared["plan"]
    manifest_json = prepared["manifest"]
    token_ids = (
        kept_on_rank0["token_ids"]
        if ctx.is_rank0
        else _load_tokens(out_dir, manifest_json["tokens"]["tokens_sha256"], ctx.rank)
    )
    chash = manifest_json["content_hash"]
    stats = _run_shards(ctx, model, token_ids, out_dir, hooks, layouts, plan, dtype, chash, stop_at_layer, progress)
    all_stats = ctx.gather_to_all(stats)
    ctx.barrier()

    def finish() -> None:
        manifest = _final_manifest(out_dir, manifest_json, ctx.world_size)
        manifest.write()
        _append_run_log(out_dir, all_stats, plan, ctx)

    ctx.on_rank0(finish)
    return Manifest.read(out_dir)


def _refuse_foreign_folder(out_dir: Path) -> None:
    if Manifest.exists(out_dir):
        return
    ours = [p.name for p in out_dir.iterdir() if p.name == TOKENS_FILE or p.name.startswith("shard-")]
    if ours:
        raise ValueError(
            f"{out_dir} holds harvest files ({sorted(ours)[:3]}...) but no manifest.json, so nothing says how they "
            "were made; harvest into a new folder (nothing here was changed)"
        )


def _load_tokens(out_dir: Path, expected_sha: str, rank: int) -> torch.Tensor:
    path = out_dir / TOKENS_FILE
    if not path.is_file() or tensor_sha256(token_ids := load_tensor(path, "token_ids")) != expected_sha:
        raise ValueError(
            f"rank {rank} does not find the {TOKENS_FILE} rank 0 wrote: out_dir {out_dir} must be one folder "
            "that every node sees (a shared filesystem)"
        )
    return token_ids


def _shard_is_done(out_dir: Path, index: int, first: int, stop: int, chash: str) -> bool:
    record_path, shard_path = out_dir / record_name(index), out_dir / shard_name(index)
    if not (record_path.is_file() and shard_path.is_file()):
        return False
    try:
        record = read_json(record_path)
    except ValueError:
        return False
    expected = {"first_context": first, "stop_context": stop, "content_hash": chash}
    if any(record.get(key) != value for key, value in expected.items()):
        return False
    return sha256_of_file(shard_path) == record.get("sha256")


def _run_shards(
    ctx, model, token_ids, out_dir, hooks, layouts, plan: BatchPlan, dtype, chash, stop_at_layer, progress
) -> dict:
    n_contexts, context_length = token_ids.shape
    n_shards = -(-n_contexts // plan.shard_contexts)
    mine = list(range(ctx.rank, n_shards, ctx.world_size))
    ranges = {s: (s * plan.shard_contexts, min((s + 1) * plan.shard_contexts, n_contexts)) for s in mine}
    had_file = {s for s in mine if (out_dir / shard_name(s)).exists()}
    todo = [s for s in mine if not _shard_is_done(out_dir, s, *ranges[s], chash)]
    kill_at, kill_stage = _kill_point(ctx.rank)
    bar = tqdm(
        total=sum(ranges[s][1] - ranges[s][0] for s in todo) * context_length,
        unit="tok",
        unit_scale=True,
        desc=f"harvest (rank {ctx.rank} of {ctx.world_size})",
        disable=not (progress and ctx.is_rank0),
    )
    reset_peak_rss()
    rss_before = current_rss_bytes()
    start = time.perf_counter()
    try:
        for count, index in enumerate(todo):
            first, stop = ranges[index]
            tensors = _compute_shard(
                model, token_ids, first, stop, hooks, layouts, plan.batch_size, dtype, stop_at_layer, ctx.device, bar
            )
            metadata = {"format": FORMAT, "content_hash": chash, "first_context": first, "stop_context": stop}
            dies_here = count == kill_at
            path = out_dir / shard_name(index)
            sha = save_tensors(
                path, tensors, metadata, on_temp_file=_die if dies_here and kill_stage == "temp" else None
            )
            if dies_here and kill_stage == "record":
                _die(path)
            record = ShardRecord(index, path.name, first, stop, sha, path.stat().st_size, chash)
            atomic_write_json(out_dir / record_name(index), record.__dict__)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    computed_tokens = sum(ranges[s][1] - ranges[s][0] for s in todo) * context_length
    return {
        "rank": ctx.rank,
        "seconds": seconds,
        "tokens_computed": computed_tokens,
        "shards_computed": len(todo),
        "shards_kept": len(mine) - len(todo),
        "shards_redone": len(had_file & set(todo)),
        "rss_before_bytes": rss_before,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def _compute_shard(
    model, token_ids, first, stop, hooks, layouts: list[HookLayout], batch_size, dtype, stop_at_layer, device, bar
) -> dict:
    """Activations of contexts ``[first, stop)``: per hook ``[stop - first, *shape]``, batch by batch."""
    n = stop - first
    tensors = {layout.name: torch.empty((n, *layout.shape), dtype=dtype) for layout in layouts}
    forward_kwargs = {} if stop_at_layer is None else {"stop_at_layer": stop_at_layer}
    for start in range(first, stop, batch_size):
        end = min(start + batch_size, stop)
        batch = token_ids[start:end].to(device=device, dtype=torch.long)
        with torch.no_grad():
            output, cache = model.run_with_cache(batch, names_filter=hooks, dtype=dtype, **forward_kwargs)
        del output  # not kept: it would live on beside the next batch's forward
        for name in hooks:
            if name not in cache:
                raise RuntimeError(f"the forward pass (stop_at_layer={stop_at_layer}) did not reach hook {name}")
            tensors[name][start - first : end - first].copy_(cache[name])
        del cache
        bar.update((end - start) * token_ids.shape[1])
    tensors["context_index"] = torch.arange(first, stop, dtype=torch.int64)
    tensors["token_ids"] = token_ids[first:stop].to(torch.int32).clone()
    return tensors


def _final_manifest(out_dir: Path, manifest_json: dict, world_size: int) -> Manifest:
    """The complete manifest: every shard's record, checked to cover every context once."""
    manifest = Manifest(out_dir=out_dir, **{k: v for k, v in manifest_json.items() if k != "format"})
    shards = []
    for index in range(manifest.layout["n_shards"]):
        path = out_dir / record_name(index)
        if not path.is_file():
            raise RuntimeError(f"shard {index} has no record after every rank finished: {path} is missing")
        record = ShardRecord(**read_json(path))
        if record.content_hash != manifest.content_hash:
            raise RuntimeError(f"{path} belongs to another harvest (content hash {record.content_hash[:12]}...)")
        shards.append(record)
    manifest.shards, manifest.complete, manifest.world_size = shards, True, world_size
    problems = manifest.problems(check_hashes=False)
    if problems:
        raise RuntimeError("the finished shards do not add up: " + "; ".join(problems))
    return manifest


def _append_run_log(out_dir: Path, all_stats: list[dict], plan: BatchPlan, ctx: DistContext) -> None:
    seconds = max(s["seconds"] for s in all_stats)
    tokens = sum(s["tokens_computed"] for s in all_stats)
    entry = {
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "world_size": ctx.world_size,
        "device": ctx.device.type,
        "batch_size": plan.batch_size,
        "seconds": round(seconds, 4),
        "tokens_computed": tokens,
        "tokens_per_second": round(tokens / seconds, 1) if tokens and seconds > 0 else None,
        "shards_computed": sum(s["shards_computed"] for s in all_stats),
        "shards_kept": sum(s["shards_kept"] for s in all_stats),
        "shards_redone": sum(s["shards_redone"] for s in all_stats),
        "estimated_held_bytes": plan.held_bytes,
        "rss_before_bytes": [s["rss_before_bytes"] for s in all_stats],
        "peak_rss_bytes": [s["peak_rss_bytes"] for s in all_stats],
    }
    path = out_dir / RUNS_FILE
    previous = path.read_text(encoding="utf-8") if path.is_file() else ""
    atomic_write_text(path, previous + json.dumps(entry) + "\n")


def _kill_point(rank: int) -> tuple[int | None, str]:
    """``(N, stage)`` from ``KILL_ENV`` when it names this rank, else ``(None, "")``."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return None, ""
    parts = spec.split(":")
    if (
        len(parts) not in (2, 3)
        or not parts[0].isdigit()
        or not parts[1].isdigit()
        or parts[2:] not in ([], ["record"])
    ):
        raise ValueError(f"{KILL_ENV} must be RANK:N or RANK:N:record, received {spec!r}")
    if int(parts[0]) != rank:
        return None, ""
    return int(parts[1]), "record" if len(parts) == 3 else "temp"


def _die(_path) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["KILL_ENV", "harvest"]

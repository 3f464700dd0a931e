"""Harvesting activations: sharded, resumable, reproducible, and the same under torchrun as in one process.

References: the model's own ``run_with_cache`` on each context, an independent
tokenization of the corpus, a single-process harvest (for torchrun's output),
and SAELens itself when its virtual environment is present.
"""

import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import einops
import pytest
import torch
from safetensors import safe_open
from torch.utils.data import DataLoader

from interp_transformer.harvest import (
    ActivationShards,
    ActivationStream,
    Corpus,
    Manifest,
    ShardShuffleSampler,
    export_saelens,
    harvest,
)
from interp_transformer.harvest.cli import add_harvest_parser, main
from interp_transformer.harvest.run import KILL_ENV
from interp_transformer.loading import from_pretrained
from interp_transformer.models.processing import fold_ln
from interp_transformer.pretrained import load_shipped
from interp_transformer.text.tokens import offline_gpt2_tokenizer

from .gpt2_helpers import one_thread, tiny_gpt2  # noqa: F401 (autouse fixture)

REPO = Path(__file__).resolve().parents[1]
EOT = 50256
TEXTS = [
    "The cat sat on the mat. The cat was happy, and the mat was warm.",
    "Mary and John went to the store. John gave a drink to Mary.",
    "",  # gives no tokens: skipped
    "Interpretability asks what a network computes, and how, one activation at a time.",
    "When the sun rose over the hills, the village woke up and the bakers lit their ovens.",
    "A transformer reads tokens, writes to its residual stream, and reads the stream again.",
    "Induction heads copy what followed the last occurrence of the current token; previous-token heads help them.",
    "The river ran cold in spring. Fishermen waited on the bank, and the herons waited with them.",
    "Sparse autoencoders split an activation into many features, most of them off for any given token.",
]
GPT2_HOOKS = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z", "blocks.0.attn.hook_pattern"]
IDS_ARGS = [
    "--model",
    "induction-2l",
    "--bos-token-id",
    "0",
    "--context-length",
    "12",
    "--batch-size",
    "3",
    "--shard-contexts",
    "6",
    "--hooks",
    "blocks.*.hook_resid_post",
    "blocks.1.attn.hook_z",
    "--no-progress",
]


def _env(**extra) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    env.pop(KILL_ENV, None)
    return {**env, **extra}


def _torchrun(*argv, **env) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port of its own: another torchrun may run beside it (test workers)
        "--nproc_per_node",
        "2",
        "-m",
        "interp_transformer.harvest",
        *map(str, argv),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=_env(**env))


def _cli(*argv) -> int:
    return main([str(arg) for arg in argv])


def _folder_hashes(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A tiny random GPT-2 with GPT-2's vocabulary, saved with the offline GPT-2 tokenizer."""
    directory = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2(seed=0, vocab_size=50257, n_positions=64).save_pretrained(directory)
    offline_gpt2_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def gpt2_model(gpt2_dir):
    return from_pretrained(gpt2_dir)


@pytest.fixture(scope="module")
def text_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    return path


@pytest.fixture(scope="module")
def ids_jsonl(tmp_path_factory):
    generator = torch.Generator().manual_seed(0)
    rows = [
        torch.randint(1, 64, (int(n),), generator=generator).tolist()
        for n in torch.randint(4, 40, (14,), generator=generator)
    ]
    path = tmp_path_factory.mktemp("corpus") / "ids.jsonl"
    path.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def gpt2_harvest(gpt2_model, text_jsonl, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt2-harvest") / "acts"
    harvest(
        gpt2_model, text_jsonl, out, hooks=GPT2_HOOKS, context_length=16, batch_size=2, shard_contexts=3, progress=False
    )
    return out


@pytest.fixture(scope="module")
def ids_harvest(ids_jsonl, tmp_path_factory):
    """The single-process reference for the torchrun runs on token ids."""
    out = tmp_path_factory.mktemp("ids-harvest") / "acts"
    assert _cli(*IDS_ARGS, "--corpus", ids_jsonl, "--out", out) == 0
    return out


# ---- tokenization and values -------------------------------------------------------------------


def test_contexts_follow_the_documented_convention(gpt2_harvest):
    tokenizer = offline_gpt2_tokenizer()
    stream = []
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if ids:
            stream += ([EOT] if stream else []) + ids
    body = 15
    n_contexts = len(stream) // body
    expected = [[EOT] + stream[i * body : (i + 1) * body] for i in range(n_contexts)]
    manifest = Manifest.read(gpt2_harvest)
    token_ids = safe_open(str(manifest.tokens_path), "pt").get_tensor("token_ids")
    assert token_ids.tolist() == expected
    assert manifest.tokens["dropped_tokens"] == len(stream) - n_contexts * body
    assert manifest.tokens["n_documents"] == len(TEXTS) - 1


def test_stored_activations_equal_run_with_cache(gpt2_harvest, gpt2_model):
    dataset = ActivationShards(gpt2_harvest, check_hashes=True)
    assert len(dataset) == Manifest.read(gpt2_harvest).n_contexts >= 5
    for index in (0, 3, len(dataset) - 1):
        item = dataset[index]
        assert item["context_index"] == index
        _, cache = gpt2_model.run_with_cache(item["token_ids"].long()[None], names_filter=GPT2_HOOKS)
        for name in GPT2_HOOKS:
            torch.testing.assert_close(item[name], cache[name][0], rtol=0, atol=1e-6)


def test_corpus_readers_agree(gpt2_model, text_jsonl, tmp_path):
    as_files = []
    for index, text in enumerate(TEXTS):
        as_files.append(tmp_path / f"doc{index}.txt")
        as_files[-1].write_text(text)
    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "saved"))
    corpora = [
        Corpus.from_jsonl([text_jsonl]),
        Corpus.from_text_files(as_files),
        Corpus.from_disk(tmp_path / "saved"),
        Corpus.from_hf_files("json", [text_jsonl]),
    ]
    assert [list(corpus) for corpus in corpora[1:]] == [list(corpora[0])] * 3
    assert list(corpora[0]) == TEXTS


# ---- torchrun -------------------------------------------------------------------------------------


def test_torchrun_two_processes_write_the_same_shards_as_one(gpt2_harvest, gpt2_dir, text_jsonl, tmp_path):
    out = tmp_path / "two"
    result = _torchrun(
        "--model",
        gpt2_dir,
        "--corpus",
        text_jsonl,
        "--context-length",
        16,
        "--batch-size",
        2,
        "--shard-contexts",
        3,
        "--hooks",
        *GPT2_HOOKS,
        "--out",
        out,
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = Manifest.read(gpt2_harvest).verify(), Manifest.read(out).verify()
    assert two.world_size == 2 and one.world_size == 1
    assert json.loads((out / "runs.jsonl").read_text().splitlines()[-1])["world_size"] == 2
    assert len(two.shards) >= 4  # both ranks had several shards to write
    first, second = ActivationShards(gpt2_harvest), ActivationShards(out)
    for index in range(len(first)):
        a, b = first[index], second[index]
        assert a["context_index"] == b["context_index"] == index
        for name in [*GPT2_HOOKS, "token_ids"]:
            assert torch.equal(a[name], b[name]), (index, name)
    for shard in one.shards:
        assert (gpt2_harvest / shard.file).read_bytes() == (out / shard.file).read_bytes()


def test_killed_rank_then_rerun_completes_without_loss_or_duplicates(ids_harvest, ids_jsonl, tmp_path):
    out = tmp_path / "acts"
    command = [*IDS_ARGS, "--corpus", ids_jsonl, "--out", out]
    killed = _torchrun(*command, **{KILL_ENV: "1:1"})  # rank 1 dies while writing its second shard
    assert killed.returncode != 0
    assert not Manifest.read(out).complete
    assert any(".tmp-" in p.name for p in out.iterdir()), "the killed writer should leave a partial temporary file"

    rerun = _torchrun(*command)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    manifest = Manifest.read(out).verify(check_hashes=True)
    starts = sorted(shard.first_context for shard in manifest.shards)
    assert len(starts) == len(set(starts)) == manifest.layout["n_shards"]
    assert not any(".tmp-" in p.name for p in out.iterdir())
    log = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["shards_kept"] >= 1 and log[-1]["shards_computed"] >= 1
    reference = Manifest.read(ids_harvest)
    assert [s.sha256 for s in manifest.shards] == [s.sha256 for s in reference.shards]


def test_kill_between_shard_and_record_then_resume_with_another_world_size(ids_harvest, ids_jsonl, tmp_path):
    out = tmp_path / "acts"
    killed = _torchrun(*IDS_ARGS, "--corpus", ids_jsonl, "--out", out, **{KILL_ENV: "0:1:record"})
    assert killed.returncode != 0  # rank 0 died after renaming its second shard (index 2), before its record
    assert (out / "shard-000002.safetensors").is_file() and not (out / "shard-000002.json").exists()
    (out / "shard-000000.safetensors").write_bytes(b"damaged")  # and a finished shard gets damaged

    assert _cli(*IDS_ARGS, "--corpus", ids_jsonl, "--out", out) == 0  # one process now, two before
    manifest = Manifest.read(out).verify(check_hashes=True)
    assert [s.sha256 for s in manifest.shards] == [s.sha256 for s in Manifest.read(ids_harvest).shards]
    log = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert log["world_size"] == 1 and log["shards_redone"] >= 2  # shard 0 (damaged) and shard 2 (no record)
    assert log["shards_kept"] + log["shards_computed"] == manifest.layout["n_shards"]


# ---- drift is refused -----------------------------------------------------------------------------


def test_changed_processing_or_hooks_are_refused_and_nothing_is_lost(gpt2_harvest, gpt2_model, text_jsonl):
    before = _folder_hashes(gpt2_harvest)
    settings = dict(context_length=16, batch_size=2, shard_contexts=3, progress=False)
    folded = fold_ln(copy.deepcopy(gpt2_model))
    with pytest.raises(ValueError, match="processing") as refused:
        harvest(folded, text_jsonl, gpt2_harvest, hooks=GPT2_HOOKS, **settings)
    assert "weights_sha256" in str(refused.value) and '["fold_ln"]' in str(refused.value)
    with pytest.raises(ValueError, match=r"hooks: folder has"):
        harvest(gpt2_model, text_jsonl, gpt2_harvest, hooks=GPT2_HOOKS[:2], **settings)
    with pytest.raises(ValueError, match=r"batch_size: folder has 2, this run has 3"):
        harvest(gpt2_model, text_jsonl, gpt2_harvest, hooks=GPT2_HOOKS, **{**settings, "batch_size": 3})
    assert _folder_hashes(gpt2_harvest) == before
    # the same settings resume
    assert harvest(gpt2_model, text_jsonl, gpt2_harvest, hooks=GPT2_HOOKS, **settings).complete


# ---- reading back ---------------------------------------------------------------------------------


def test_sampler_and_stream_visit_every_context_once_in_a_seeded_order(gpt2_harvest):
    dataset = ActivationShards(gpt2_harvest, hooks=["blocks.0.hook_resid_post"])
    n = len(dataset)
    orders = [list(ShardShuffleSampler(dataset, seed=seed)) for seed in (0, 0, 1)]
    assert sorted(orders[0]) == list(range(n)) and orders[0] == orders[1] and orders[0] != orders[2]
    stream = ActivationStream(gpt2_harvest, hooks=["blocks.0.hook_resid_post"], seed=3, buffer_size=5)
    seen = [item["context_index"] for item in stream]
    assert sorted(seen) == list(range(n)) and seen != list(range(n))
    assert seen == [item["context_index"] for item in stream]
    loader = DataLoader(stream, batch_size=2, num_workers=2)
    assert sorted(torch.cat([batch["context_index"] for batch in loader]).tolist()) == list(range(n))
    tokens = list(
        ActivationStream(gpt2_harvest, hooks=["blocks.1.attn.hook_z"], unit="token", exclude_bos=True, seed=0)
    )
    assert len(tokens) == n * 15 and {t["position"] for t in tokens} == set(range(1, 16))
    some = tokens[7]
    assert torch.equal(
        some["blocks.1.attn.hook_z"],
        dataset.__class__(gpt2_harvest)[some["context_index"]]["blocks.1.attn.hook_z"][some["position"]],
    )
    with pytest.raises(ValueError, match="hook_pattern"):
        ActivationStream(gpt2_harvest, unit="token")


def test_saelens_export_has_saelens_schema_and_our_values(gpt2_harvest, tmp_path):
    dest = export_saelens(gpt2_harvest, tmp_path / "sae", hooks=GPT2_HOOKS[:2], progress=False)
    loaded = datasets.load_from_disk(str(dest))
    assert loaded.column_names == [*GPT2_HOOKS[:2], "token_ids"]
    assert loaded.features["blocks.0.hook_resid_post"] == datasets.Array2D(shape=(16, 32), dtype="float32")
    assert loaded.features["blocks.1.attn.hook_z"].shape == (16, 32)  # [pos, head_index * d_head]
    assert loaded.features["token_ids"] == datasets.Sequence(datasets.Value("int32"), length=16)
    loaded.set_format("torch")
    ours = ActivationShards(gpt2_harvest)
    assert len(loaded) == len(ours)
    for index in range(len(ours)):
        z = einops.rearrange(ours[index]["blocks.1.attn.hook_z"], "pos head_index d_head -> pos (head_index d_head)")
        assert torch.equal(loaded[index]["blocks.1.attn.hook_z"], z)
        assert torch.equal(loaded[index]["blocks.0.hook_resid_post"], ours[index]["blocks.0.hook_resid_post"])
        assert torch.equal(loaded[index]["token_ids"], ours[index]["token_ids"])
    with pytest.raises(ValueError, match="hook_pattern"):
        export_saelens(gpt2_harvest, tmp_path / "sae2", progress=False)
    assert not (tmp_path / "sae2").exists()


def _saelens_python():
    candidate = os.environ.get("INTERP_TRANSFORMER_SAELENS_PYTHON") or str(REPO / ".venv-saelens" / "bin" / "python")
    return candidate if Path(candidate).is_file() else None


@pytest.mark.skipif(
    _saelens_python() is None, reason="no SAELens virtual environment (benchmarks/saelens_env.sh builds one)"
)
def test_saelens_activations_store_reads_the_export(gpt2_harvest, tmp_path):
    dest = export_saelens(gpt2_harvest, tmp_path / "sae", hooks=["blocks.1.attn.hook_z"], progress=False)
    n = Manifest.read(gpt2_harvest).n_contexts
    out = tmp_path / "saelens.safetensors"
    worker = [
        _saelens_python(),
        str(REPO / "benchmarks" / "saelens_worker.py"),
        str(dest),
        "blocks.1.attn.hook_z",
        "16",
        "32",
        str(n),
        str(out),
    ]
    result = subprocess.run(worker, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with safe_open(str(out), "pt") as handle:
        acts, token_ids = handle.get_tensor("acts"), handle.get_tensor("token_ids")
    ours = ActivationShards(gpt2_harvest)
    expected = torch.stack([ours[i]["blocks.1.attn.hook_z"] for i in range(n)])
    assert torch.equal(
        acts, einops.rearrange(expected, "context pos head_index d_head -> (context pos) (head_index d_head)")
    )
    expected_ids = einops.rearrange(
        torch.stack([ours[i]["token_ids"] for i in range(n)]), "context pos -> (context pos)"
    )
    assert token_ids.long().tolist() == expected_ids.tolist()


# ---- memory budget --------------------------------------------------------------------------------


def test_memory_budget_picks_the_largest_batch_that_fits_or_says_the_minimum(ids_jsonl, tmp_path):
    model = load_shipped("induction-2l")
    hooks = ["blocks.1.hook_resid_post"]
    per_context = 12 * 64 * 4 + 12 * 4 + 8  # stored: the activation, token ids, context index
    logits = 12 * model.cfg.d_vocab * 4  # the forward reaches the unembed: its logits are held per batch
    budget = model.estimate_cache_bytes(5, 12, hooks, torch.float32) + 5 * (logits + per_context)
    manifest = harvest(
        model,
        ids_jsonl,
        tmp_path / "a",
        hooks=hooks,
        context_length=12,
        batch_size=None,
        memory_budget_bytes=budget,
        bos_token_id=0,
        progress=False,
    )
    assert manifest.layout["batch_size"] == 5
    log = json.loads((tmp_path / "a" / "runs.jsonl").read_text())
    assert log["estimated_held_bytes"] <= budget
    minimum = model.estimate_cache_bytes(1, 12, hooks, torch.float32) + logits + per_context
    with pytest.raises(ValueError, match=f"needs {minimum} bytes"):
        harvest(
            model,
            ids_jsonl,
            tmp_path / "b",
            hooks=hooks,
            context_length=12,
            batch_size=4,
            memory_budget_bytes=minimum + 10,
            bos_token_id=0,
            progress=False,
        )


# ---- bad input ------------------------------------------------------------------------------------


def test_bad_input_is_refused_before_anything_is_written(gpt2_harvest, gpt2_model, text_jsonl, tmp_path):
    before = _folder_hashes(gpt2_harvest)
    settings = dict(context_length=16, batch_size=2, shard_contexts=3, progress=False)
    with pytest.raises(KeyError, match=r"blocks\.0\.hook_resid_post"):
        harvest(gpt2_model, text_jsonl, gpt2_harvest, hooks=["blocks.0.hook_resid_pots"], **settings)
    with pytest.raises(KeyError, match="matches no hook"):
        harvest(gpt2_model, text_jsonl, gpt2_harvest, hooks="blocks.9.*", **settings)
    with pytest.raises(ValueError, match="corpus is empty"):
        harvest(gpt2_model, ["", ""], gpt2_harvest, hooks=GPT2_HOOKS, **settings)
    with pytest.raises(ValueError, match="corpus is empty"):
        harvest(gpt2_model, ["", ""], tmp_path / "new", hooks=GPT2_HOOKS, **settings)
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match="fewer than the 15"):
        harvest(gpt2_model, ["Hello world"], gpt2_harvest, hooks=GPT2_HOOKS, **settings)
    with pytest.raises(ValueError, match="n_ctx=64"):
        harvest(gpt2_model, text_jsonl, gpt2_harvest, hooks=GPT2_HOOKS, **{**settings, "context_length": 65})
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot write into out_dir"):
        harvest(gpt2_model, text_jsonl, blocker / "acts", hooks=GPT2_HOOKS, **settings)
    with pytest.raises(ValueError, match="is a file"):
        harvest(gpt2_model, text_jsonl, blocker, hooks=GPT2_HOOKS, **settings)
    assert _folder_hashes(gpt2_harvest) == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "shard-000000.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="no manifest.json"):
        harvest(gpt2_model, text_jsonl, foreign, hooks=GPT2_HOOKS, **settings)


def test_model_without_tokenizer_needs_ids_and_a_bos(ids_jsonl, text_jsonl, tmp_path):
    with pytest.raises(ValueError, match="no tokenizer"):
        harvest(
            "induction-2l",
            text_jsonl,
            tmp_path / "a",
            hooks="blocks.0.hook_resid_post",
            context_length=8,
            batch_size=2,
            bos_token_id=0,
            progress=False,
        )
    with pytest.raises(ValueError, match="bos_token_id"):
        harvest(
            "induction-2l",
            ids_jsonl,
            tmp_path / "b",
            hooks="blocks.0.hook_resid_post",
            context_length=8,
            batch_size=2,
            progress=False,
        )
    with pytest.raises(ValueError, match="outside"):
        harvest(
            "induction-2l",
            [[1, 2, 99]],
            tmp_path / "c",
            hooks="blocks.0.hook_resid_post",
            context_length=2,
            batch_size=2,
            bos_token_id=0,
            progress=False,
        )


def test_cli_reports_bad_input_in_one_line(ids_jsonl, tmp_path, capsys):
    code = main(
        [
            "--model",
            "induction-2l",
            "--corpus",
            str(ids_jsonl),
            "--bos-token-id",
            "0",
            "--context-length",
            "8",
            "--batch-size",
            "2",
            "--hooks",
            "blocks.0.hook_resid_pre2",
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "blocks.0.hook_resid_pre" in err


def test_cli_mounts_as_a_subcommand_and_applies_processing(ids_jsonl, tmp_path):
    parser = argparse.ArgumentParser(prog="interp-transformer")
    add_harvest_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "harvest",
            "--model",
            "induction-2l",
            "--corpus",
            str(ids_jsonl),
            "--bos-token-id",
            "0",
            "--context-length",
            "8",
            "--memory-budget",
            "1MiB",
            "--hooks",
            "*hook_attn_out",
            "--process",
            "fold_ln",
            "--out",
            str(tmp_path / "acts"),
            "--no-progress",
        ]
    )
    assert args.run(args) == 0
    manifest = Manifest.read(tmp_path / "acts").verify()
    assert manifest.fingerprint["processing"] == ["fold_ln"]
    assert manifest.hook_names == ["blocks.0.hook_attn_out", "blocks.1.hook_attn_out"]
    assert manifest.layout["batch_size"] >= 1

"""The benchmark script runs end to end (on tiny GPT-2, Llama, GPT-NeoX, Gemma 2 and Mixtral models) and reports what it
measured.

Timings are not asserted here (they belong to the benchmark's own report); what is
asserted is that every section ran for every family, that our logits matched Hugging
Face's, that the memory estimate equals what the caches held, that greedy generation
produced Hugging Face's ids, that the GGUF rows loaded a file with both loaders, that a
model TransformerLens cannot run is reported rather than crashing the run, and that the
benchmark's SmolLM2 shape is the library's SmolLM2 preset and the shipped GGUF file's shape.
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp_transformer.families.llama.hf import config_from_hf
from interp_transformer.families.llama.recipe import preset

from .gguf_helpers import tiny_llama, tiny_vocabulary, write_llama_gguf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sections import forward_flops, logit_differences  # noqa: E402
from bench_timing import start_transformer_lens  # noqa: E402
from hf_models import build_hf_model, hf_config, model_spec  # noqa: E402

TL_PYTHON = REPO / ".venv-tl" / "bin" / "python"
SECTION_TITLES = ("Forward pass", "run_with_cache", "Greedy generation", "loading", "Achieved GFLOP/s")
# the Hugging Face attention implementations each tiny model is timed against (Gemma 2 has no sdpa)
HF_ATTENTION = {
    "tiny": ("eager", "sdpa"),
    "tiny-llama": ("eager", "sdpa"),
    "tiny-neox": ("eager", "sdpa"),
    "tiny-gemma2": ("eager",),
    "tiny-mixtral": ("eager", "sdpa"),
}
NEW_FAMILIES = ("tiny-neox", "tiny-gemma2", "tiny-mixtral")


def table_rows(report: str, title_start: str) -> list[list[str]]:
    lines = report.split("### " + title_start, 1)[1].split("\n\n", 2)[1].splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:] if line.startswith("|")]


def run_bench(tmp_path, *arguments) -> str:
    out = tmp_path / "report.md"
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "bench.py"),
        "--quick",
        "--rounds",
        "1",
        "--out",
        str(out),
        *arguments,
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return out.read_text()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench_gguf") / "tiny.gguf"
    write_llama_gguf(path, tiny_llama(len(tiny_vocabulary()[0]), num_hidden_layers=1))
    return path


def assert_every_section_ran(report: str, model: str) -> None:
    """Every section's table for ``model``, with ours and each HF contender measured and our logits equal to HF's."""
    for title in SECTION_TITLES:
        assert f"### {model}: {title}" in report, f"no {title} table for {model}"
    forward = table_rows(report, f"{model}: Forward pass")
    ours_and_hf = [row for row in forward if row[1] != "TransformerLens"]
    hf_names = {f"HF {attention}" for attention in HF_ATTENTION[model]}
    assert {row[1] for row in ours_and_hf} == {"interp_transformer", "interp_transformer, shape checks off"} | hf_names
    assert all(float(row[2]) > 0 and float(row[7]) < 1e-4 for row in ours_and_hf)
    assert {row[4] for row in forward if row[1] == "TransformerLens"} == {"not run (--no-tl)"}
    cache = table_rows(report, f"{model}: run_with_cache")
    assert {row[2] for row in cache} == {
        "nothing (forward)",
        "everything",
        "everything, bfloat16 storage",
        "attention patterns",
        "resid_post",
    }
    kept = [row for row in cache if row[2] != "nothing (forward)"]
    assert [row[6] for row in kept] == ["yes"] * len(kept), "the cache memory estimate missed what the cache held"
    assert f"### {model}: Greedy generation, 64 new tokens after a 16-token prompt (ids equal to HF's: yes)" in report
    generation = table_rows(report, f"{model}: Greedy generation")
    assert [row[0] for row in generation] == [
        "with key/value cache",
        "without key/value cache",
        f"HF generate ({HF_ATTENTION[model][-1]})",
    ]
    flops = table_rows(report, f"{model}: Achieved GFLOP/s")
    assert {row[1] for row in flops} == {"plain matmul", "interp_transformer", f"HF {HF_ATTENTION[model][-1]}"}


def test_bench_script_runs_every_section_on_tiny_gpt2_and_llama(tmp_path, tiny_gguf):
    report = run_bench(tmp_path, "--config", "tiny,tiny-llama", "--no-tl", "--tiny-gguf", str(tiny_gguf))
    for model in ("tiny", "tiny-llama"):
        assert_every_section_ran(report, model)
    gpt2_loads = table_rows(report, "tiny: loading")
    assert [row[0] for row in gpt2_loads] == ["in-memory", "safetensors directory", "GGUF"]
    assert gpt2_loads[-1][-1] == "not run (no GGUF file for this model)"
    llama_loads = table_rows(report, "tiny-llama: loading")
    assert [row[0] for row in llama_loads] == [
        "in-memory",
        "safetensors directory",
        f"GGUF {tiny_gguf}",
        f"GGUF {tiny_gguf}",
    ]
    assert [row[1] for row in llama_loads[2:]] == [
        "interp_transformer.from_pretrained",
        "transformers AutoModelForCausalLM (gguf_file=)",
    ]
    assert all(float(row[2]) > 0 for row in llama_loads)
    assert llama_loads[2][-1].startswith("<= 15.0 s: ")


def test_bench_script_runs_every_section_on_tiny_neox_gemma2_and_mixtral(tmp_path):
    report = run_bench(tmp_path, "--config", ",".join(NEW_FAMILIES), "--no-tl", "--threads", "1")
    for model in NEW_FAMILIES:
        assert_every_section_ran(report, model)
        loads = table_rows(report, f"{model}: loading")
        assert [row[0] for row in loads] == ["in-memory", "safetensors directory", "GGUF"]
        assert all(float(row[2]) > 0 for row in loads[:2]) and loads[-1][-1] == "not run (no GGUF file for this model)"
        assert [row[-1].startswith("peak <= 1.5x loaded: ") for row in loads[:2]] == [True, True]


def test_a_model_transformer_lens_cannot_build_is_a_note_not_a_crash():
    """This venv's python has no TransformerLens: the worker says why it cannot run, and the note carries the reason."""
    worker, note = start_transformer_lens(sys.executable, "tiny-neox", 1, 0, ((1, 8),))
    assert worker is None
    assert note.startswith("not run: TransformerLens cannot build gpt_neox: "), note
    assert "Error: " in note, f"the note does not say why: {note}"


def test_the_forward_section_refuses_to_time_a_model_whose_logits_differ():
    """Known answer: equal models pass with a difference below float32 noise; one bias moved by 0.05 N(0, 1) stops the
    run."""
    import interp_transformer

    family, config = model_spec("tiny-neox")
    hf = {attention: build_hf_model(family, config, 0, attention) for attention in ("eager", "sdpa")}
    ours = interp_transformer.from_pretrained(hf["eager"])
    tokens = torch.randint(0, config["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(0))
    assert max(logit_differences("tiny-neox", ours, hf, tokens).values()) < 1e-5
    with torch.no_grad():
        ours.blocks[-1].mlp.b_out.add_(0.05 * torch.randn(ours.cfg.d_model, generator=torch.Generator().manual_seed(1)))
    with pytest.raises(RuntimeError, match="tiny-neox: our logits differ from HF eager's by"):
        logit_differences("tiny-neox", ours, hf, tokens)


def test_forward_flops_counts_every_weight_matrix_once_per_token():
    """Known answers: GPT-2's (and GPT-NeoX's) four projections and two MLP matrices; Llama's (and Gemma 2's)
    key/value projections over n_key_value_heads only, and its three-matrix gated MLP; Mixtral's router and
    only the experts a token is routed to."""
    import interp_transformer

    batch, pos = 2, 8
    for name in ("tiny", "tiny-llama", *NEW_FAMILIES):
        family, config = model_spec(name)
        ours = interp_transformer.from_pretrained(build_hf_model(family, config, 0))
        cfg = ours.cfg
        d, heads, d_head, d_mlp = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
        if family in ("gpt2", "gpt_neox"):
            per_layer = 4 * d * heads * d_head + 2 * d * d_mlp
        elif family == "mixtral":  # the router, and top-2 of 4 gated experts: half of their matrices per token
            per_layer = 2 * d * heads * d_head + 2 * d * cfg.n_key_value_heads * d_head + d * 4 + 3 * d * d_mlp * 2
        else:
            per_layer = 2 * d * heads * d_head + 2 * d * cfg.n_key_value_heads * d_head + 3 * d * d_mlp
        expected = 2 * (
            (cfg.n_layers * per_layer + d * cfg.d_vocab) * batch * pos
            + cfg.n_layers * 2 * batch * heads * pos * pos * d_head
        )
        assert forward_flops(ours, batch, pos) == expected


def test_the_smollm2_shape_is_the_preset_and_the_shipped_file():
    family, config = model_spec("smollm2")
    ours = config_from_hf(hf_config(family, config))
    assert ours.replace(name="SmolLM2-135M") == preset("SmolLM2-135M")
    from interp_transformer.loading.gguf import find_smollm2, read_gguf

    try:
        path = find_smollm2()
    except ValueError as error:
        pytest.skip(str(error))
    shipped = read_gguf(path, load_tokenizer=False)
    from_file = config_from_hf(shipped.hf_config)
    assert from_file.replace(init_range=ours.init_range, name=ours.name) == ours
    float32_weights = 4 * sum(math.prod(shape) for shape in shipped.state_dict.shapes().values())
    assert float32_weights == 4 * preset("SmolLM2-135M").n_params(hugging_face=True)


@pytest.mark.skipif(not TL_PYTHON.exists(), reason="the TransformerLens venv is made by benchmarks/tl_env.sh")
def test_transformer_lens_builds_the_same_tiny_models(tmp_path):
    """One run for four families: each TransformerLens worker builds the same weights and its logits match HF's."""
    models = ("tiny-llama", *NEW_FAMILIES)
    report = run_bench(tmp_path, "--config", ",".join(models), "--sections", "forward", "--threads", "1")
    for model in models:
        assert f"- TransformerLens, {model}: transformer-lens 4." in report
        note = report.split(f"- TransformerLens, {model}: ", 1)[1].split("\n", 1)[0]
        assert "weights sha256 equal to ours" in note
        assert float(note.rsplit("max |logits - HF logits| ", 1)[1]) < 1e-4, note
        (tl_row,) = [
            row
            for row in table_rows(report, f"{model}: Forward pass")
            if row[1] == "TransformerLens" and row[0] == "1x16"
        ]
        assert float(tl_row[2]) > 0

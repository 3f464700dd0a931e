"""The benchmark script runs end to end (on tiny GPT-2 and Llama models) and reports what it measured.

Timings are not asserted here (they belong to the benchmark's own report); what is
asserted is that every section ran for both families, that the memory estimate equals
what the caches held, that greedy generation produced Hugging Face's ids, that the
GGUF rows loaded a file with both loaders, and that the benchmark's SmolLM2 shape is
the library's SmolLM2 preset and the shipped GGUF file's shape.
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from interp_transformer.architectures.llama import preset
from interp_transformer.loading.llama import config_from_hf

from .gguf_helpers import tiny_llama, tiny_vocabulary, write_llama_gguf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sections import forward_flops  # noqa: E402
from hf_models import build_hf_model, hf_config, model_spec  # noqa: E402

TL_PYTHON = REPO / ".venv-tl" / "bin" / "python"


def table_rows(report: str, title_start: str) -> list[list[str]]:
    lines = report.split("### " + title_start, 1)[1].split("\n\n", 2)[1].splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:] if line.startswith("|")]


def run_bench(tmp_path, *arguments) -> str:
    out = tmp_path / "report.md"
    command = [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--quick", "--rounds", "1", "--out", str(out), *arguments]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return out.read_text()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench_gguf") / "tiny.gguf"
    write_llama_gguf(path, tiny_llama(len(tiny_vocabulary()[0]), num_hidden_layers=1))
    return path


def test_bench_script_runs_every_section_on_tiny_gpt2_and_llama(tmp_path, tiny_gguf):
    report = run_bench(tmp_path, "--config", "tiny,tiny-llama", "--no-tl", "--tiny-gguf", str(tiny_gguf))
    for model in ("tiny", "tiny-llama"):
        for title in ("Forward pass", "run_with_cache", "Greedy generation", "loading", "Achieved GFLOP/s"):
            assert f"### {model}: {title}" in report
        forward = table_rows(report, f"{model}: Forward pass")
        ours_and_hf = [row for row in forward if row[1] != "TransformerLens"]
        assert {row[1] for row in ours_and_hf} == {"interp_transformer", "interp_transformer, shape checks off", "HF eager", "HF sdpa"}
        assert all(float(row[2]) > 0 for row in ours_and_hf)
        assert {row[4] for row in forward if row[1] == "TransformerLens"} == {"not run (--no-tl)"}
        cache = table_rows(report, f"{model}: run_with_cache")
        assert {row[2] for row in cache} == {"nothing (forward)", "everything", "everything, bfloat16 storage", "attention patterns", "resid_post"}
        kept = [row for row in cache if row[2] != "nothing (forward)"]
        assert [row[6] for row in kept] == ["yes"] * len(kept), "the cache memory estimate missed what the cache held"
        assert f"### {model}: Greedy generation, 64 new tokens after a 16-token prompt (ids equal to HF's: yes)" in report
    gpt2_loads = table_rows(report, "tiny: loading")
    assert [row[0] for row in gpt2_loads] == ["in-memory", "safetensors directory", "GGUF"]
    assert gpt2_loads[-1][-1] == "not run (no GGUF file for this model)"
    llama_loads = table_rows(report, "tiny-llama: loading")
    assert [row[0] for row in llama_loads] == ["in-memory", "safetensors directory", f"GGUF {tiny_gguf}", f"GGUF {tiny_gguf}"]
    assert [row[1] for row in llama_loads[2:]] == ["interp_transformer.from_pretrained", "transformers AutoModelForCausalLM (gguf_file=)"]
    assert all(float(row[2]) > 0 for row in llama_loads)
    assert llama_loads[2][-1].startswith("<= 15.0 s: ")


def test_forward_flops_counts_every_weight_matrix_once_per_token():
    """Known answers: GPT-2's four projections and two MLP matrices; Llama's key/value projections over
    n_key_value_heads only, and its three-matrix gated MLP."""
    import interp_transformer

    batch, pos = 2, 8
    for name in ("tiny", "tiny-llama"):
        family, config = model_spec(name)
        ours = interp_transformer.from_pretrained(build_hf_model(family, config, 0))
        cfg = ours.cfg
        d, heads, d_head, d_mlp = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
        if family == "gpt2":
            per_layer = 4 * d * heads * d_head + 2 * d * d_mlp
        else:
            per_layer = 2 * d * heads * d_head + 2 * d * cfg.n_key_value_heads * d_head + 3 * d * d_mlp
        expected = 2 * ((cfg.n_layers * per_layer + d * cfg.d_vocab) * batch * pos + cfg.n_layers * 2 * batch * heads * pos * pos * d_head)
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
def test_transformer_lens_builds_the_same_tiny_llama(tmp_path):
    report = run_bench(tmp_path, "--config", "tiny-llama", "--sections", "forward")
    assert "- TransformerLens, tiny-llama: transformer-lens 4." in report
    assert "weights sha256 equal to ours" in report
    (tl_row,) = [row for row in table_rows(report, "tiny-llama: Forward pass") if row[1] == "TransformerLens" and row[0] == "1x16"]
    assert float(tl_row[2]) > 0

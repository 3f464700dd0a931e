"""Habits the linters cannot hold: no function of the package or of ``analysis/`` runs past 60 lines unless it
says why.

ruff holds the complexity limit (C901, 15; pyproject.toml). Length is a separate smell: a function past 60 lines
(from its ``def`` to its last line, signature and docstring included) is either split or listed in ``LONG_FUNCTIONS``
with a one-line reason. The list only shrinks: an entry whose function is gone or back under the limit fails too,
so the reason never outlives the function.
"""

import ast
import pathlib
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("interp_transformer", "analysis")
MAX_LINES = 60

# "path::Qualified.name": why it stays one function
LONG_FUNCTIONS = {
    "interp_transformer/harvest/run.py::_harvest": (
        "one distributed run: prepare and finish are closures run on rank 0 around the gather and the barrier"
    ),
    "analysis/discovery/circuit_streams.py::stream_hooks": (
        "the hook makers are closures over one run's offsets and activations; the hook order is the contract"
    ),
    "interp_transformer/families/bert/hf.py::convert_state_dict": (
        "one table of BERT's checkpoint names, checked together before any tensor is read"
    ),
    "analysis/discovery/report.py::circuit_report": (
        "17 documented keyword arguments; the body is find, then check over the curve of sizes"
    ),
    "analysis/views/circuit.py::circuit_view": "a 24-line docstring; the body lays out one figure's nodes and edges",
    "analysis/report/sections/circuits.py::circuits_section": (
        "one report section: the paragraphs and figures in the order the page shows them"
    ),
    "interp_transformer/compat/generation.py::GenerationMethods.generate": (
        "TransformerLens' generate: a 16-line signature, its arguments checked up front, then one sampling loop"
    ),
    "analysis/discovery/edges.py::edge_attribution_patching": (
        "EAP and EAP-IG share the clean and corrupted runs; walks and scores_of are closures over them"
    ),
    "interp_transformer/models/encoder_decoder/generate.py::beam_search": (
        "one beam-search loop over running and finished beams, their scores and origins, updated together"
    ),
    "analysis/attribution_graphs/figure.py::graph_figure": (
        "one plotly figure: edges by sign and width, then nodes by kind, then the layout"
    ),
    "analysis/attribution_graphs/circuit_tracer_files.py::load_circuit_tracer": (
        "circuit-tracer's folder layout: every file and tensor it names is checked in one pass"
    ),
    "interp_transformer/compat/pretrained.py::PretrainedMethods.from_pretrained": (
        "TransformerLens' signature (20 lines) and docstring; the body is 45 lines"
    ),
    "interp_transformer/families/opt/hf.py::convert_state_dict": (
        "one table of OPT's checkpoint names, checked together before any tensor is read"
    ),
    "interp_transformer/loading/gguf_tokenizer.py::tokenizer_from_gguf_metadata": (
        "one tokenizer built from the file's tokenizer.ggml.* keys, each refused by name in one pass"
    ),
    "interp_transformer/models/encoder_decoder/generate.py::generate": (
        "16 lines of signature and 8 of docstring; the body is 45 lines"
    ),
    "analysis/probes/fit.py::fit_probes": "17 lines of signature and 8 of docstring; the body is 42 lines",
    "interp_transformer/compat/head_detector.py::detect_head": (
        "TransformerLens' detect_head: its argument checks, then one loop over layers and heads"
    ),
    "interp_transformer/text/generate.py::generate": "16 lines of signature and 14 of docstring; the body is 36 lines",
    "analysis/attribution_graphs/view.py::graph_view": "11 lines of signature and 8 of docstring; the body is 47 lines",
    "analysis/attribution_graphs/clt.py::CrossLayerTranscoder.load": (
        "circuit-tracer's cross-layer layout: every W_enc/W_dec file pair checked in one pass"
    ),
    "analysis/report/sections/logits.py::logits_section": (
        "one report section: the paragraphs and figures in the order the page shows them"
    ),
    "analysis/attribution_graphs/feature_info.py::feature_info_from": (
        "17 lines of signature and 8 of docstring; the body is 38 lines"
    ),
    "interp_transformer/families/bart/hf.py::convert_body": (
        "one table of BART's checkpoint names, checked together before any tensor is read"
    ),
    "analysis/report/sections/omitted.py::omitted_parts": "one list of parts, each with its own what/why/instead entry",
    "interp_transformer/compat/patching.py::generic_activation_patch": (
        "TransformerLens' 11-line signature and a docstring; the body is 45 lines"
    ),
    "interp_transformer/cache/residual_stacks.py::ResidualStacks.get_full_resid_decomposition": (
        "TransformerLens' 10-line signature and a docstring; the body is 44 lines"
    ),
    "analysis/attribution_graphs/qk.py::qk_attribution": (
        "one score split in order: checks of the head and positions, the query and key sides, their products"
    ),
    "interp_transformer/families/gpt2/hf.py::convert_state_dict": (
        "one table of GPT-2's checkpoint names, checked together before any tensor is read"
    ),
}


def long_functions(source: str, path: str = "<snippet>", max_lines: int = MAX_LINES) -> dict[str, int]:
    """``{"path::Qualified.name": lines}`` for each function (methods and nested functions too) of ``source``
    longer than ``max_lines``, counted from the ``def`` line to the last line."""
    found: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lines = child.end_lineno - child.lineno + 1
                if lines > max_lines:
                    found[f"{path}::{name}"] = lines
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return found


def repository_long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found.update(long_functions(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()))
    return found


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}():\n{body}"


def test_the_finder_catches_long_functions_methods_and_nested_ones_and_only_those():
    source = (
        _function("at_the_limit", MAX_LINES - 1)
        + _function("one_over", MAX_LINES)
        + "class Holder:\n"
        + _function("long_method", MAX_LINES + 5, indent="    ")
        + "def outer():\n"
        + _function("inner", MAX_LINES, indent="    ")
        + "async def waits():\n"
        + "".join(f"    await x{i}\n" for i in range(MAX_LINES))
    )
    assert long_functions(source, "bad.py") == {
        "bad.py::one_over": MAX_LINES + 1,
        "bad.py::Holder.long_method": MAX_LINES + 6,
        "bad.py::outer": MAX_LINES + 2,
        "bad.py::outer.inner": MAX_LINES + 1,
        "bad.py::waits": MAX_LINES + 1,
    }


def test_the_finder_counts_the_signature_and_the_docstring():
    source = textwrap.dedent('''
        def documented(
            a,
            b,
        ):
            """Line one.

            Line three.
            """
    ''') + "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 7))
    assert long_functions(source) == {"<snippet>::documented": MAX_LINES + 1}


def test_every_function_over_60_lines_is_split_or_says_why():
    unexplained = sorted(set(repository_long_functions()) - set(LONG_FUNCTIONS))
    assert unexplained == [], (
        f"functions over {MAX_LINES} lines: split them, or add each to LONG_FUNCTIONS with a one-line reason"
    )


def test_the_list_of_long_functions_only_shrinks():
    stale = sorted(set(LONG_FUNCTIONS) - set(repository_long_functions()))
    assert stale == [], f"no longer over {MAX_LINES} lines (or moved): remove these from LONG_FUNCTIONS"


@pytest.mark.parametrize("name", sorted(LONG_FUNCTIONS))
def test_each_reason_is_one_short_line(name):
    reason = LONG_FUNCTIONS[name]
    assert reason and "\n" not in reason and len(reason) <= 110, f"{name}: {reason!r}"

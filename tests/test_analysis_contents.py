"""``analysis/`` reads as a table of contents, and its tools ask the model's writers, not the model's family.

Each count is read from the source (the folder, the AST), and each finder is tried on a
known-bad snippet so that a count of zero means something.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANALYSIS = ROOT / "analysis"
MAX_LOOSE_MODULES = 3  # __init__.py, __main__.py and one more
FAMILY_FACTS = ("has_cross_attention", "has_experts", "logit_softcap")


def loose_modules(folder: Path) -> list[str]:
    """The modules at the top of ``folder`` that sit in no package."""
    return sorted(path.name for path in folder.glob("*.py"))


def names_a_model(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return text == "model" or text.endswith(".model") or text.endswith("_model")


def family_fact_reads(source: str) -> list[str]:
    """Reads of a model's ``has_*`` facts or its ``logit_softcap`` (attribute or ``getattr``), with their lines.

    ``has_cross_attention`` and ``has_experts`` count whatever they are read on; another ``has_*`` and
    ``logit_softcap`` count when read on something named a model (a result's own ``logit_softcap`` field, a
    cache's ``has_batch_dim`` and a hook's ``has_hooks`` are not the model's family).
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner, name = node.value, node.attr
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr") and len(node.args) > 1:
            owner, key = node.args[0], node.args[1]
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            name = key.value
        else:
            continue
        family = (
            name in FAMILY_FACTS[:2] or (name.startswith("has_") or name == "logit_softcap") and names_a_model(owner)
        )
        if family:
            found.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_analysis_has_at_most_three_loose_modules():
    loose = loose_modules(ANALYSIS)
    assert len(loose) <= MAX_LOOSE_MODULES, loose
    assert {"__init__.py", "__main__.py"} <= set(loose)


def test_the_loose_module_count_finds_loose_modules(tmp_path):
    for name in ("__init__.py", "__main__.py", "attribution.py", "encoder_attribution.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "readouts").mkdir()
    (tmp_path / "readouts" / "__init__.py").write_text("")
    assert len(loose_modules(tmp_path)) == 4 > MAX_LOOSE_MODULES


@pytest.mark.parametrize("path", sorted(ANALYSIS.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_tools_ask_the_writers_not_the_family(path):
    """No branch on ``model.has_cross_attention``, ``has_experts`` or ``logit_softcap``: the writers say it."""
    assert family_fact_reads(path.read_text()) == []


def test_the_family_fact_finder_finds_family_branches():
    bad = (
        "def f(model, ctx, attr, cache):\n"
        "    if model.has_cross_attention:\n"
        "        return ctx.model.has_experts\n"
        "    cap = model.logit_softcap\n"
        "    other = getattr(model, 'has_stream_norms')\n"
        "    return attr.logit_softcap, cache.has_batch_dim\n"
    )
    assert family_fact_reads(bad) == [
        "2: model.has_cross_attention",
        "3: ctx.model.has_experts",
        "4: model.logit_softcap",
        "5: getattr(model, 'has_stream_norms')",
    ]


def test_a_model_answers_the_writer_questions():
    """The questions tools ask are answered from the writers: which read a source, which route tokens."""
    from interp_transformer.builder import build_decoder, build_encoder_decoder

    shape = dict(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=8, seed=0)
    decoder = build_decoder(**shape)
    experts = build_decoder(**shape, experts=dict(n_experts=2, top_k=1))
    seq2seq = build_encoder_decoder(**shape, placement="pre")
    asked = lambda model, question: [writer.sublayer for writer in model.writers_that(question)]  # noqa: E731
    assert asked(decoder, "reads_source") == asked(decoder, "routes_tokens") == asked(seq2seq, "routes_tokens") == []
    assert asked(seq2seq, "reads_source") == ["cross_attn", "cross_attn"]
    assert asked(experts, "routes_tokens") == ["mlp", "mlp"]
    assert decoder.read_out.softcap is None
    with pytest.raises(KeyError, match=r"'reads_sources'.*closest: \['reads_source'\]"):
        decoder.writers_that("reads_sources")

"""Counts that say whether the model is written once: one attention body, one registry, no packed lines.

Each count is read from the source (the AST, or the text), not from a list kept by hand,
and each finder is tried on a known-bad snippet so that a count of zero means something.
"""

import ast
from pathlib import Path

import interp_transformer
from interp_transformer.architectures import hf_converters, registered

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(interp_transformer.__file__).parent
Z_BODIES = ("_explicit_z", "_fused_z")


def python_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def functions(tree: ast.AST):
    return (node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def z_bodies(source: str) -> list[str]:
    """Every definition of a function that computes attention's ``z`` from q, k and v."""
    return [node.name for node in functions(ast.parse(source)) if node.name in Z_BODIES]


def query_projections(source: str) -> list[str]:
    """Every function that projects queries itself (``self.hook_q(...)``): an attention forward body."""
    found = []
    for node in functions(ast.parse(source)):
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        if any(call.func.attr == "hook_q" for call in calls):
            found.append(node.name)
    return found


def model_type_tables(source: str, model_types: set) -> int:
    """Dict literals mapping three or more Hugging Face model_types to names (a module, a class): a second registry."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = {key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}
            names = all(isinstance(value, ast.Constant) and isinstance(value.value, str) for value in node.values)
            count += names and len(keys & model_types) >= 3
    return count


def test_attention_has_two_z_bodies_and_one_forward_body():
    bodies = {str(path.relative_to(ROOT)): z_bodies(path.read_text()) for path in python_files("interp_transformer")}
    assert {path: names for path, names in bodies.items() if names} == {
        "interp_transformer/components/attention.py": ["_explicit_z", "_fused_z"]
    }
    forwards = {str(p.relative_to(ROOT)): query_projections(p.read_text()) for p in python_files("interp_transformer")}
    assert {path: names for path, names in forwards.items() if names} == {
        "interp_transformer/components/attention.py": ["attend"]
    }


def test_the_finders_find_a_copied_attention_body():
    copied = "class A:\n    def _explicit_z(self, q, k, v):\n        pass\n"
    copied += "    def forward(self, x):\n        self.hook_q(x)\n"
    assert z_bodies(copied) == ["_explicit_z"] and query_projections(copied) == ["forward"]


def test_families_are_listed_once_on_their_register_lines():
    model_types = set(hf_converters())
    assert {"gpt2", "llama", "t5", "qwen3_moe"} <= model_types
    tables = {
        str(p.relative_to(ROOT)): model_type_tables(p.read_text(), model_types)
        for p in python_files("interp_transformer")
    }
    assert {path: n for path, n in tables.items() if n} == {}
    assert model_type_tables('T = {"gpt2": "a.gpt2", "llama": "a.llama", "t5": "a.t5"}', model_types) == 1
    claimed = [t for architecture in registered() for t in architecture.hf_model_types]
    assert len(claimed) == len(set(claimed)) == len(model_types)


def test_no_line_is_over_120_characters():
    long = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in python_files("interp_transformer", "analysis", "tests", "benchmarks")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > 120
    ]
    assert long == []

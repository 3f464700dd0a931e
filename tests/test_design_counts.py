"""Counts that say whether the model is written once: one attention body, one registry, no packed lines.

Each count is read from the source (the AST, or the text), not from a list kept by hand,
and each finder is tried on a known-bad snippet so that a count of zero means something.
"""

import ast
from pathlib import Path

import pytest

import interp_transformer
from interp_transformer.families import hf_converters, registered

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
        "interp_transformer/parts/attention.py": ["_explicit_z", "_fused_z"]
    }
    forwards = {str(p.relative_to(ROOT)): query_projections(p.read_text()) for p in python_files("interp_transformer")}
    assert {path: names for path, names in forwards.items() if names} == {
        "interp_transformer/parts/attention.py": ["attend"]
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


GENERIC_CAPABILITIES = {"causal", "norm_placement", "final_norm", "read_out", "next_token_logits", "embedding_norm"}


def test_capabilities_hold_no_family_field():
    """What one family brings (output norms, a soft-cap, experts, cross-attention) is said by its parts."""
    from dataclasses import fields

    from interp_transformer.core.capabilities import Capabilities

    assert {field.name for field in fields(Capabilities)} == GENERIC_CAPABILITIES


ATTRIBUTION_MODULES = (
    "analysis/readouts/attribution.py",
    "analysis/readouts/post_norm.py",
    "analysis/readouts/encoder_decoder.py",
)


def own_attribution_walks(source: str) -> list[str]:
    """Functions that read heads' or neurons' output weights themselves (``.W_O``, ``.W_out``): a walk of their own."""
    found = []
    for node in functions(ast.parse(source)):
        reads = [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in ("W_O", "W_out")]
        if reads:
            found.append(node.name)
    return found


def walk_callers(source: str) -> list[str]:
    calls = lambda node: [n for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func) == "direct_path"]
    return [node.name for node in functions(ast.parse(source)) if calls(node)]


def test_one_attribution_walk():
    """Decoder, encoder and encoder-decoder attribution all package the one walk, ``writers.direct_path``."""
    sources = {name: (ROOT / name).read_text() for name in ATTRIBUTION_MODULES}
    assert {name: own_attribution_walks(source) for name, source in sources.items()} == dict.fromkeys(sources, [])
    assert sorted(f for source in sources.values() for f in walk_callers(source)) == [
        "decoder_logit_attribution",
        "direct_logit_attribution",
        "encoder_direct_attribution",
    ]
    copied = "def dla(model, g):\n    for block in model.blocks:\n        t = block.attn.W_O @ g\n"
    assert own_attribution_walks(copied) == ["dla"] and walk_callers("def f():\n    direct_path(b, d, at)\n") == ["f"]


def test_the_package_reads_as_a_table_of_contents():
    """At most 10 loose modules at the top of the package; the rest sit in packages named by concern."""
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(loose) <= 10, loose
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert {
        "core",
        "hooks",
        "parts",
        "families",
        "models",
        "text",
        "circuits",
        "verify",
        "pretrained",
        "compat",
    } <= packages


def test_no_shim_keeps_an_old_module_path_and_transformerlens_paths_stay():
    """Old paths raise ``ModuleNotFoundError`` (docs/CHANGELOG.md names the new import); TransformerLens' paths
    import."""
    import importlib
    import sys

    assert not any(type(finder).__module__.startswith("interp_transformer") for finder in sys.meta_path)
    for old in ("tokens", "model", "shape_checks", "models.config", "components", "architectures", "encoder"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"interp_transformer.{old}")
    hook_points = importlib.import_module("interp_transformer.hook_points")
    assert hook_points.HookPoint is importlib.import_module("interp_transformer.hooks").HookPoint
    factored = importlib.import_module("interp_transformer.FactoredMatrix")
    assert factored.FactoredMatrix is interp_transformer.FactoredMatrix


def test_no_inheritance_chain_packs_a_class():
    """The cache and the factored matrix hold their helpers (composition), not inherit them for length."""
    from interp_transformer.cache.activations import ActivationCache
    from interp_transformer.circuits.factored_matrix import FactoredMatrix

    assert ActivationCache.__bases__ == (object,) and FactoredMatrix.__bases__ == (object,)


def text_method_sets(source: str) -> list[str]:
    """Classes that define ``to_tokens`` themselves: a set of text methods."""
    tree = ast.parse(source)
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(item, ast.FunctionDef) and item.name == "to_tokens" for item in node.body)
    ]


def block_loops(source: str) -> list[str]:
    """Functions that run blocks themselves: a loop over ``blocks`` whose body calls a block."""
    found = []
    for node in functions(ast.parse(source)):
        for loop in (n for n in ast.walk(node) if isinstance(n, ast.For) and "blocks" in ast.unparse(n.iter)):
            target = ast.unparse(loop.target).split(",")[-1].strip(" ()")
            calls = [n for n in ast.walk(loop) if isinstance(n, ast.Call) and ast.unparse(n.func) == target]
            if calls:
                found.append(node.name)
    return found


def test_one_stack_and_one_set_of_text_methods():
    model_code = [p for p in python_files("interp_transformer") if "compat" not in p.parts]
    sets = {str(p.relative_to(ROOT)): text_method_sets(p.read_text()) for p in model_code}
    assert {path: names for path, names in sets.items() if names} == {
        "interp_transformer/text/methods.py": ["TextMethods"]
    }
    loops = {str(p.relative_to(ROOT)): block_loops(p.read_text()) for p in python_files("interp_transformer")}
    assert {path: names for path, names in loops.items() if names} == {
        "interp_transformer/models/stack.py": ["run_blocks"]
    }
    assert text_method_sets("class A:\n    def to_tokens(self, text):\n        pass\n") == ["A"]
    assert block_loops("def f(m, x):\n    for block in m.blocks:\n        x = block(x)\n") == ["f"]

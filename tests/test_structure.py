"""The shape of the code: no import cycles, the model never imports the analysis, and tools ask capabilities.

The import graph is read from the source with ``ast`` (imports inside functions
included), so a cycle hidden behind a late import fails here too. Tools
(``cache.py``, ``verify.py``, ``hooks.py``, ``caching.py`` and every ``analysis`` module)
may not check a model's class: they read ``model.capabilities`` and the hook-name table.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("interp_transformer", "analysis")
MODEL_CLASSES = ("DemoTransformer", "EncoderTransformer", "EncoderDecoderTransformer")
CLASS_QUESTIONS = ("is_encoder", "is_post_norm", "require_decoder")
TOOLS = (
    "interp_transformer.cache.activations",
    "interp_transformer.cache.caching",
    "interp_transformer.verify",
    "interp_transformer.hooks",
)


def module_files() -> dict[str, pathlib.Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


MODULES = module_files()


def _resolve(module: str, node: ast.AST) -> list[str]:
    """The modules an import statement in ``module`` names (package-relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names if f"{prefix}.{alias.name}" in MODULES]


def _owning_module(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _resolve(module, node):
                    target = _owning_module(name)
                    # a submodule importing its own package's __init__ is how packages work, not a cycle
                    if target and target != module and not module.startswith(target + "."):
                        graph[module].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]):
    """One cycle as a list of modules, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_there_is_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_the_model_package_never_imports_analysis():
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in import_graph().items()
        if m.startswith("interp_transformer")
        for t in targets
        if t.split(".")[0] == "analysis"
    )
    assert upward == []


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def class_checks(path: pathlib.Path) -> list[str]:
    """``isinstance``/``issubclass`` calls naming a model class, and calls of the old class questions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = getattr(node.func, "id", getattr(node.func, "attr", None))
        source = ast.unparse(node)
        if func in ("isinstance", "issubclass") and any(name in source for name in MODEL_CLASSES):
            found.append(f"{path.name}:{node.lineno}: {source}")
        if func in CLASS_QUESTIONS:
            found.append(f"{path.name}:{node.lineno}: {source}")
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if m in TOOLS or m.startswith("analysis")])
def test_tools_never_check_a_models_class(module):
    assert class_checks(MODULES[module]) == []


def test_the_class_check_finder_finds_them(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(model):\n    if isinstance(model, EncoderTransformer):\n        return is_encoder(model)\n")
    assert len(class_checks(bad)) == 2


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("analysis")])
def test_analysis_never_spells_a_hook_path(module):
    """Hook names come from the model's table (``model.act_name``), never from an f-string of a path."""
    spelled = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value for part in node.values if isinstance(part, ast.Constant))
            if text.startswith("blocks.") or ".hook_" in text:
                spelled.append(f"{node.lineno}: {ast.unparse(node)}")
    assert spelled == []


def test_no_module_is_longer_than_450_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 450}
    assert long == {}

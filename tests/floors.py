"""The package's floors: each folder's floor, and the folder import graph read from the source with ``ast``.

A folder may import its own floor's folders only where the folder graph stays acyclic, and lower floors
freely; never a higher floor. ``docs/architecture_figures.py`` draws the same table, so it lives here once.
"""

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "interp_transformer"
TOP = "(top)"  # the package's own modules: __init__, __main__, builder

FLOORS = {
    "core": 0,  # shape and token checks, key/value cache, capabilities, losses, files, checkpoint checks
    "hooks": 1,  # HookPoint, HookedRootModule, hook names, slices, per-thread tool state
    "circuits": 1,  # FactoredMatrix and its spectra
    "text": 1,  # tokenizers, prompts, token helpers, generation
    "parts": 2,  # one part per file: norms, embeddings, attention, MLPs, blocks
    "families": 3,  # one folder per family: recipe, converter, reference recorder, GGUF entry, TL mapping
    "cache": 3,  # ActivationCache, run_with_cache, residual stacks
    "models": 4,  # the model classes (decoder, encoder, encoder-decoder) and weight processing
    "loading": 5,  # sources, formats (safetensors, GGUF), build_model from a family's converted weights
    "pretrained": 6,  # the small models shipped in the wheel
    "harvest": 7,  # activations to disk, on one machine or many
    "sae": 8,  # sparse autoencoders: the module, its files, training
    "verify": 9,  # hook-by-hook comparison with Hugging Face
    "compat": 9,  # TransformerLens' classic API
    "training": 9,  # training models from config files
    TOP: 10,  # the package's entry: wires the floors together (core/services.py)
}
FLOOR_NAMES = {0: "ground", 1: "hooks and text", 2: "parts", 3: "families", 4: "models", 5: "loading"}


def folder_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / PACKAGE / parts[1]).is_dir():
        return parts[1]
    return TOP


def _module_name(path: pathlib.Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Every package module an import in ``source`` names (relative imports resolved, function bodies included)."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = node.module or ""
            if node.level:
                prefix = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            found += [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
    return [name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def folder_graph(sources: dict[str, tuple[str, bool]] = None) -> collections.Counter:
    """``{(from_folder, to_folder): number of imports}`` over ``sources`` (default: the package's files)."""
    if sources is None:
        sources = {}
        for path in (ROOT / PACKAGE).rglob("*.py"):
            module, is_package = _module_name(path)
            sources[module] = (path.read_text(), is_package)
    edges = collections.Counter()
    for module, (source, is_package) in sources.items():
        for name in imported_modules(source, module, is_package):
            a, b = folder_of(module), folder_of(name)
            if a != b:  # ``from interp_transformer import x`` inside a folder reads the top floor
                edges[(a, b)] += 1
    return edges


def upward_imports(edges) -> list[str]:
    """Imports from a folder to a higher floor (or to a folder no floor lists)."""
    bad = []
    for (a, b), count in sorted(edges.items()):
        if a not in FLOORS or b not in FLOORS:
            bad.append(f"{a} -> {b}: no floor for {a if a not in FLOORS else b} (add it to tests/floors.py)")
        elif FLOORS[b] > FLOORS[a]:
            bad.append(f"{a} (floor {FLOORS[a]}) -> {b} (floor {FLOORS[b]}), {count} import(s)")
    return bad


def folder_cycle(edges) -> list[str]:
    """One cycle of folders, as a list, or [] when the folder graph is acyclic."""
    graph = collections.defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    state, path = {}, []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []

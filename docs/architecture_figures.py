"""Draw the pictures in docs/architecture.md from the code, so that they cannot go stale.

Two figures, each between marker comments in the doc (``<!-- figure: NAME -->`` ... ``<!-- end figure -->``):

- ``floors``: the package's folders grouped by floor, with their import edges, read from the source with ``ast``;
- ``activation-path``: the path of one activation from hook to cache, recorded by running a tiny random GPT-2
  (the hooks of block 0 in the order they fire, their shapes, the part that owns each hook point, the function
  that fires it and the cache key it lands under).

    python docs/architecture_figures.py          # rewrite the figures in docs/architecture.md in place
    python docs/architecture_figures.py --check  # exit 1 and print a diff if the doc is stale
"""

import argparse
import difflib
import inspect
import re
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
COMMAND = "python docs/architecture_figures.py"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import interp_transformer  # noqa: E402
from interp_transformer import DemoTransformer, HookPoint, TransformerConfig  # noqa: E402
from tests.floors import FLOOR_NAMES, FLOORS, TOP, folder_cycle, folder_graph  # noqa: E402

PACKAGE = Path(interp_transformer.__file__).resolve().parent
START = re.compile(r"<!-- figure: ([\w-]+) -->")
END = "<!-- end figure -->"
GENERATED = f"*Generated from the code by `{COMMAND}`; edit the script, not this figure.*"
# the tiny model whose forward the activation path records, and its input
TINY = dict(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=32, d_vocab=23, n_ctx=8)
TOKENS = [[1, 5, 9, 2, 7]]
FOLLOWED = "pattern"  # the short name of the activation whose journey the figure spells out


# --- the floors ------------------------------------------------------------------------------------------------------
def node_id(folder: str) -> str:
    return "f_" + re.sub(r"\W", "_", folder)


def folder_label(folder: str) -> str:
    """``parts/`` for a folder; the package's own modules for the top floor."""
    if folder == TOP:
        return f"{TOP} " + ", ".join(path.name for path in sorted(PACKAGE.glob("*.py")))
    return f"{folder}/"


def floors_figure(
    graph: Mapping[tuple[str, str], int], floors: Mapping[str, int], names: Mapping[int, str] = FLOOR_NAMES
) -> str:
    """A mermaid flowchart (ground floor at the bottom, an arrow from importer to imported) and the same as a table;
    an import that goes up a floor is drawn dotted and named, and a cycle of folders is named. Only which folder
    imports which is drawn, not how many imports: the figure changes when the floors do, not with every import."""
    folders = sorted(set(floors) | {folder for edge in graph for folder in edge})
    by_floor: dict[object, list[str]] = {}
    for folder in folders:
        by_floor.setdefault(floors.get(folder, "none"), []).append(folder)
    order = sorted((k for k in by_floor if k != "none"), key=int) + (["none"] if "none" in by_floor else [])
    lines = ["```mermaid", "flowchart BT"]
    for floor in order:
        title = "no floor" if floor == "none" else f"floor {floor}" + (f": {names[floor]}" if floor in names else "")
        lines.append(f'    subgraph floor_{floor}["{title}"]')
        lines += [f'        {node_id(folder)}["{folder_label(folder)}"]' for folder in by_floor[floor]]
        lines.append("    end")
    upward = []
    for source, target in sorted(graph):
        goes_up = floors.get(target, -1) > floors.get(source, -1) or source not in floors or target not in floors
        arrow = "-.->" if goes_up else "-->"
        lines.append(f"    {node_id(source)} {arrow} {node_id(target)}")
        if goes_up:
            upward.append(f"`{folder_label(source)}` -> `{folder_label(target)}`")
    lines += ["```", "", "| floor | folder | imports |", "|---|---|---|"]
    for floor in order:
        for folder in by_floor[floor]:
            edges = [f"`{folder_label(t)}`" for s, t in sorted(graph) if s == folder]
            lines.append(f"| {floor} | `{folder_label(folder)}` | {', '.join(edges) or 'nothing of the package'} |")
    lines.append("")
    if upward:
        lines.append("Imports that go up a floor or leave the floors (dotted above): " + ", ".join(upward) + ".")
    else:
        lines.append("No import goes up a floor.")
    cycle = folder_cycle(graph)
    lines[-1] += f" A cycle of folders: {' -> '.join(cycle)}." if cycle else " The folder graph has no cycle."
    return "\n".join(lines)


# --- the path of one activation --------------------------------------------------------------------------------------
def package_path(obj) -> str:
    """Where ``obj`` (a class, a function, a module) is defined, relative to the package folder."""
    path = Path(inspect.getsourcefile(obj) or "").resolve()
    return str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else path.name


def defining_name(frame) -> str:
    """``Class.method`` for a method's frame (the class that defines it, not the instance's), else the function."""
    code = frame.f_code
    owner = frame.f_locals.get("self")
    if owner is not None:
        for cls in type(owner).__mro__:
            function = inspect.unwrap(cls.__dict__[code.co_name]) if code.co_name in cls.__dict__ else None
            if getattr(function, "__code__", None) is code:
                return f"{cls.__qualname__}.{code.co_name}"
    return code.co_name


def firing_site(hook_file: Path) -> tuple[str, str]:
    """The function that called the hook point now firing, and its file: the first frame outside this script,
    the hook machinery and torch."""
    skipped = {Path(__file__).resolve(), hook_file, Path(torch.__file__).resolve().parent}
    frame = inspect.currentframe()
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if not any(path == skip or skip in path.parents for skip in skipped):
            return defining_name(frame), str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else path.name
        frame = frame.f_back
    raise RuntimeError("no caller of the hook point outside the hook machinery and torch")


def cache_key(model, name: str) -> tuple:
    """The short key ``cache[...]`` reads ``name`` under (its table's entry for block 0), else the full name."""
    table = model.hook_names
    for short, template in table.layer_keys.items():
        for sub in table.sublayers if "{sub}" in template else (None,):
            if template.format(layer=0, sub=sub) == name:
                return (short, 0) if sub is None else (short, 0, sub)
    return (name,)


def spell_key(key: tuple) -> str:
    return "cache[" + ", ".join(repr(part).replace("'", '"') for part in key) + "]"


def record_block(model, tokens: torch.Tensor, layer: int = 0) -> list[dict]:
    """Run ``run_with_cache`` with a recorder on every hook point of one block: each hook's name, shape, owner,
    firing site and cache key, in firing order. Each key is read back from the cache and checked to be the
    activation recorded."""
    prefix = f"blocks.{layer}."
    hook_file = Path(inspect.getsourcefile(HookPoint)).resolve()
    fired: list[dict] = []

    def record(tensor: torch.Tensor, hook: HookPoint) -> None:
        owner = model.get_submodule(hook.name.rpartition(".")[0])
        site, site_file = firing_site(hook_file)
        fired.append(dict(name=hook.name, shape=list(tensor.shape), owner=type(owner), site=site, file=site_file))
        fired[-1]["value"] = tensor.detach().clone()

    with torch.no_grad(), model.hooks(fwd_hooks=[(lambda name: name.startswith(prefix), record)]):
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.startswith(prefix))
    for step in fired:
        step["key"] = cache_key(model, step["name"])
        if not torch.equal(cache[step["key"]], step.pop("value")):
            raise RuntimeError(f"{spell_key(step['key'])} is not the activation {step['name']} fired")
    return fired


def activation_path_figure() -> str:
    """Block 0 of a tiny random GPT-2, hook by hook, then the journey of ``hook_pattern`` into the cache."""
    model = DemoTransformer(TransformerConfig(**TINY), seed=0).eval()
    fired = record_block(model, torch.tensor(TOKENS))
    config = ", ".join(f"{key}={value}" for key, value in TINY.items())
    lines = [
        f"Block 0 of `DemoTransformer(TransformerConfig({config}), seed=0)`",
        f"on tokens `{TOKENS}`, recorded by `run_with_cache` with one more hook on every hook point of the block:",
        "the hooks in the order they fire, the part that owns each, the function that fires it, and the key that",
        "reads it back from the cache (each read back and checked equal to what fired).",
        "",
        "| # | hook point | shape | owned by | fired from | cache key |",
        "|---|---|---|---|---|---|",
    ]
    for number, step in enumerate(fired, 1):
        owner = f"`{step['owner'].__name__}` (`{package_path(step['owner'])}`)"
        site = f"`{step['site']}` (`{step['file']}`)"
        lines.append(
            f"| {number} | `{step['name']}` | `{step['shape']}` | {owner} | {site} | `{spell_key(step['key'])}` |"
        )
    silent = sorted(set(n for n in model.hook_dict if n.startswith("blocks.0.")) - {step["name"] for step in fired})
    if silent:
        lines += ["", "Hook points of the block that did not fire: " + ", ".join(f"`{n}`" for n in silent) + "."]
    lines += ["", *journey(model, next(step for step in fired if step["key"][0] == FOLLOWED))]
    return "\n".join(lines)


def journey(model, step: dict) -> list[str]:
    """The files one activation passes through, from the part that computes it to ``cache[...]``."""
    root, cache_class = type(model), model.cache_class
    table = model.hook_names
    where = {
        "hook point": package_path(HookPoint),
        "setup": package_path(root.setup),
        "run_with_cache": package_path(root.run_with_cache),
        "cache": package_path(cache_class),
        "act_name": package_path(root.act_name),
        "table": package_path(type(table)),
        "family": package_path(model.architecture.build),
    }
    key, name, hook = spell_key(step["key"]), step["name"], step["name"].rpartition(".")[2]
    return [
        "```mermaid",
        "flowchart LR",
        f'    part["{step["site"]}<br/>{step["file"]}"] -->|"{hook} {step["shape"]}"| point',
        f'    point["HookPoint {name}<br/>{where["hook point"]}"] -->|"the keeping hook"| run',
        f'    run["{root.run_with_cache.__qualname__}<br/>{where["run_with_cache"]}"] -->|"kept under {name}"| cache',
        f'    cache["{cache_class.__name__}<br/>{where["cache"]}"] -->|"{key.replace(chr(34), "#quot;")}"| user',
        '    user(["your code"])',
        "```",
        "",
        f"1. `{step['file']}`: `{step['site']}` computes the activation and passes it through `self.{hook}`, a "
        f"`HookPoint` (`{where['hook point']}`) owned by `{step['owner'].__name__}`.",
        f"2. `{where['setup']}`: `{root.setup.__qualname__}()` named that hook point `{name}` from "
        "`named_modules()`, and `model.hook_dict` holds it under that name.",
        f"3. `{where['run_with_cache']}`: `run_with_cache` adds a hook there that keeps the value, and wraps the "
        f"kept values in an `{cache_class.__name__}`.",
        f"4. `{where['cache']}`: `{key}` turns the short key into the full name through `model.act_name` "
        f"(`{where['act_name']}`), which reads the `{type(table).__name__}` table (`{where['table']}`) that the "
        f"family registers (`{where['family']}`), and returns the kept tensor.",
    ]


# --- the doc ---------------------------------------------------------------------------------------------------------
FIGURES = {
    "floors": lambda: floors_figure(folder_graph(), FLOORS),
    "activation-path": activation_path_figure,
}


def replace_regions(text: str, figures: Mapping[str, str]) -> str:
    """``text`` with the body of each ``<!-- figure: NAME -->`` ... ``<!-- end figure -->`` region replaced by
    ``figures[NAME]``. Every figure must have exactly one region, and every region a figure."""
    out, position, seen = [], 0, []
    for start in START.finditer(text):
        if start.start() < position:
            raise ValueError(f"figure {start.group(1)!r} starts inside the previous region, before its {END!r}")
        name = start.group(1)
        if name not in figures:
            close = difflib.get_close_matches(name, list(figures), n=1)
            raise ValueError(f"the doc has a figure {name!r}, expected one of {sorted(figures)}; closest: {close}")
        if name in seen:
            raise ValueError(f"figure {name!r} appears twice in the doc, expected once")
        end = text.find(END, start.end())
        if end < 0:
            raise ValueError(f"figure {name!r} has no {END!r} after it")
        out += [text[position : start.end()], f"\n{GENERATED}\n\n{figures[name].strip()}\n\n"]
        position, seen = end, seen + [name]
    missing = [name for name in figures if name not in seen]
    if missing:
        markers = ", ".join(f"'<!-- figure: {name} -->'" for name in missing)
        raise ValueError(f"the doc lacks the region of {markers} ... {END!r}, expected one per figure")
    return "".join(out) + text[position:]


def render(text: str) -> str:
    """The doc with every figure drawn afresh from the code."""
    return replace_regions(text, {name: draw() for name, draw in FIGURES.items()})


def stale_diff(text: str, fresh: str, label: str = "docs/architecture.md") -> str:
    """A unified diff from ``text`` to ``fresh`` (the doc with fresh figures); empty when ``text`` is up to date."""
    diff = difflib.unified_diff(
        text.splitlines(keepends=True), fresh.splitlines(keepends=True), label, f"{label} (regenerated)"
    )
    return "".join(diff)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 and print a diff if the doc is stale")
    parser.add_argument("--doc", type=Path, default=DOC, help="the Markdown file holding the figures")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    try:
        fresh = render(text)
    except ValueError as error:  # a doc whose regions are missing or malformed
        print(f"{args.doc}: {error}", file=sys.stderr)
        return 2
    if args.check:
        diff = stale_diff(text, fresh, str(args.doc))
        if diff:
            print(diff, end="")
            print(f"{args.doc} is stale: regenerate its figures with `{COMMAND}`")
            return 1
        return 0
    if fresh != text:
        args.doc.write_text(fresh)
        print(f"rewrote the figures in {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One folder per family, one register line: loading's, GGUF's and TransformerLens' tables all derive from the registry.

A family lives whole in ``interp_transformer/families/<name>/`` (recipe, Hugging Face converter, reference recorder,
GGUF entry, TransformerLens mapping), and its ``__init__.py``'s ``register(...)`` line is the only place that names it
for the floors above. ``family_tables`` finds any other table keyed by family outside ``families/``; there are none.
"""

import ast
import sys
import textwrap

import pytest

from interp_transformer.compat.from_core import config_from_core
from interp_transformer.core.errors import CompatValueError
from interp_transformer.families import gguf_architectures, hf_converters, lens_of, registered, unregister
from interp_transformer.loading import architecture_module, build_model, supported_architectures
from interp_transformer.loading.gguf import hf_name
from interp_transformer.models.decoder import DemoTransformer

from . import floors

FAMILIES = floors.ROOT / floors.PACKAGE / "families"
FOLDERS = sorted(path.name for path in FAMILIES.iterdir() if (path / "__init__.py").exists())


def _folder_of(architecture) -> str:
    return architecture.config_class.__module__.split(".")[2]


def test_every_family_folder_registers_itself_and_its_files_are_what_it_registers():
    by_folder = {}
    for architecture in registered():
        if architecture.config_class.__module__.startswith("interp_transformer.families."):
            by_folder.setdefault(_folder_of(architecture), []).append(architecture)
    assert set(FOLDERS) <= set(by_folder)  # found by families/__init__.py: no list of folders to edit
    for folder in FOLDERS:
        files = {path.stem for path in (FAMILIES / folder).glob("*.py")}
        architectures = by_folder[folder]
        assert ("hf" in files) == any(a.converter == f"interp_transformer.families.{folder}.hf" for a in architectures)
        assert ("gguf" in files) == any(a.gguf for a in architectures), folder
        assert ("lens" in files) == any(callable(a.lens) for a in architectures), folder


def test_the_three_tables_are_read_from_the_one_registry():
    converters = {t: a.converter for a in registered() for t in a.hf_model_types}
    assert hf_converters() == converters and supported_architectures() == sorted(converters)
    assert {architecture_module(t).__name__ for t in converters} == set(converters.values())
    entries = {arch: entry for a in registered() for arch, entry in a.gguf.items()}
    assert gguf_architectures() == entries
    assert sorted(entries) == [
        "gemma",
        "gemma2",
        "gemma3",
        "gpt2",
        "llama",
        "phi3",
        "qwen2",
        "qwen2moe",
        "qwen3",
        "qwen3moe",
    ]
    described = sorted(_folder_of(a) for a in registered() if callable(a.lens))
    assert described == ["gemma", "gpt2", "gpt_neox", "llama", "opt"]  # the families TransformerLens describes
    # the same family set where supported: every GGUF or TransformerLens family is one loading reads too
    assert all(a.converter is not None for a in registered() if a.gguf or callable(a.lens))


FAMILY_PACKAGE = '''
import dataclasses

from interp_transformer.families.gguf_entry import GGUFArchitecture
from interp_transformer.families.gpt2 import recipe as gpt2
from interp_transformer.families.registry import register


@dataclasses.dataclass(frozen=True)
class WrenConfig(gpt2.TransformerConfig):
    """A new family's config (GPT-2's parts, for the test)."""


def hooked_config(cfg, common):
    return dict(d_mlp=cfg.d_mlp, normalization_type="LN", original_architecture="WrenForCausalLM")


ARCHITECTURE = register(
    dataclasses.replace(gpt2.ARCHITECTURE, name="wren", config_class=WrenConfig),
    converter=f"{__name__}.hf",
    hf_model_types=("wren",),
    gguf={"wren": GGUFArchitecture("GPT2Config", "GPT2LMHeadModel", permuted_qk=False)},
    lens=hooked_config,
)
'''
CONVERTER = """
from interp_transformer.families.gpt2.hf import config_from_hf, convert_state_dict, hf_reference_activations
"""


@pytest.fixture
def wren_folder(tmp_path, monkeypatch):
    """A family in a folder of its own, outside the package: its __init__.py (one register line) and converter."""
    folder = tmp_path / "wren_family"
    folder.mkdir()
    (folder / "__init__.py").write_text(textwrap.dedent(FAMILY_PACKAGE))
    (folder / "hf.py").write_text(textwrap.dedent(CONVERTER))
    monkeypatch.syspath_prepend(str(tmp_path))
    import wren_family

    yield wren_family
    if any(architecture.name == "wren" for architecture in registered()):
        unregister(wren_family.ARCHITECTURE)
    for name in [name for name in sys.modules if name.split(".")[0] == "wren_family"]:
        del sys.modules[name]


def test_a_family_registered_in_its_own_folder_appears_in_all_three_tables(wren_folder):
    cfg = wren_folder.WrenConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=8)
    # loading
    assert "wren" in supported_architectures()
    assert architecture_module("wren").__name__ == "wren_family.hf"
    model = build_model(cfg, DemoTransformer(cfg, seed=0).state_dict())
    assert type(model).__name__ == "DemoTransformer" and model.cfg is cfg
    # GGUF
    assert "wren" in gguf_architectures()
    assert hf_name("token_embd.weight", "wren") == "model.embed_tokens.weight"
    # TransformerLens
    assert lens_of(cfg) is wren_folder.ARCHITECTURE
    hooked = config_from_core(cfg, "wren-tiny", None)
    assert (hooked.original_architecture, hooked.d_mlp, hooked.d_model) == ("WrenForCausalLM", 32, 16)


def test_an_unregistered_family_leaves_all_three_tables(wren_folder):
    cfg = wren_folder.WrenConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=8)
    unregister(wren_folder.ARCHITECTURE)
    assert "wren" not in supported_architectures() and "wren" not in gguf_architectures()
    with pytest.raises(CompatValueError, match="this checkpoint is a WrenConfig model"):
        config_from_core(cfg, "wren-tiny", None)


# --- the finder: tables keyed by family outside families/ ---------------------------------------------------------


def _family_keys() -> tuple[set[str], set[str]]:
    """(names a table of families would be keyed by, the family config classes' names)."""
    classes = {a.config_class.__name__ for a in registered()}
    names = {a.name for a in registered()} | set(hf_converters()) | set(gguf_architectures()) | set(FOLDERS)
    return names | classes, classes


def family_tables(sources: dict[str, str]) -> list[str]:
    """``path:line`` of each table keyed by family in ``sources``: a dict literal most of whose keys (two or more) name
    families (an architecture, model_type, GGUF architecture or config class), or a body of code whose ``if``
    statements branch on two or more family config classes (``isinstance(cfg, LlamaConfig)``, ``type(cfg) is
    GemmaConfig``)."""
    keys, classes = _family_keys()
    found = []
    for path, source in sources.items():
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                named = [_key_name(key) for key in node.keys if key is not None]
                hits = [name for name in named if name in keys]
                if len(hits) >= 2 and 2 * len(hits) >= len(named):
                    found.append(f"{path}:{node.lineno}")
            elif isinstance(node, (ast.Module, ast.FunctionDef)):
                tested = set()
                for statement in node.body:
                    while isinstance(statement, ast.If):  # an if and its elifs
                        tested |= {
                            n.id for n in ast.walk(statement.test) if isinstance(n, ast.Name) and n.id in classes
                        }
                        statement = statement.orelse[0] if len(statement.orelse) == 1 else None
                if len(tested) >= 2:
                    found.append(f"{path}:{getattr(node, 'lineno', 1)}")
    return found


def _key_name(key: ast.expr):
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    return key.id if isinstance(key, ast.Name) else None


def _package_sources_outside_families() -> dict[str, str]:
    root = floors.ROOT / floors.PACKAGE
    return {
        str(path.relative_to(floors.ROOT)): path.read_text()
        for path in root.rglob("*.py")
        if FAMILIES not in path.parents
    }


def test_the_registry_is_the_one_family_table():
    tables = ["interp_transformer/families/registry.py (the registry)"] + family_tables(
        _package_sources_outside_families()
    )
    assert len(tables) == 1, tables


@pytest.mark.parametrize(
    "source",
    [
        'GGUF = {"llama": 1, "qwen2": 2, "gemma": 3}',
        "CONVERTERS = {LlamaConfig: 'llama', GemmaConfig: 'gemma'}",
        "def f(cfg):\n    if type(cfg) is LlamaConfig:\n        return 1\n    elif isinstance(cfg, GemmaConfig):\n"
        "        return 2\n    return 3\n",
        "def f(cfg):\n    if type(cfg) is LlamaConfig:\n        return 1\n    if isinstance(cfg, (OPTConfig, int)):\n"
        "        return 2\n",
    ],
)
def test_the_finder_flags_a_known_bad_family_table(source):
    assert len(family_tables({"interp_transformer/compat/bad.py": source})) == 1


def test_the_finder_passes_tables_keyed_by_something_else():
    pre_tokenizers = '{"default": 1, "gpt2": 1, "smollm": 2, "starcoder": 2, "llama3": 3, "qwen2": 4}'
    assert family_tables({"x.py": f"SPLITS = {pre_tokenizers}\nKINDS = {{'decoder': 1, 'encoder': 2}}"}) == []

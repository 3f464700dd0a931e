"""The package has floors: the folder import graph is acyclic and no folder imports a floor above its own."""

import pytest

from . import floors


def test_every_folder_has_a_floor_and_the_ground_floor_imports_nothing():
    folders = {path.name for path in (floors.ROOT / floors.PACKAGE).iterdir() if (path / "__init__.py").exists()}
    assert folders | {floors.TOP} == set(floors.FLOORS)
    assert [edge for edge in floors.folder_graph() if edge[0] == "core"] == []


def test_no_folder_imports_a_higher_floor():
    assert floors.upward_imports(floors.folder_graph()) == []


def test_the_folder_graph_has_no_cycle():
    assert floors.folder_cycle(floors.folder_graph()) == []


def test_the_model_classes_call_loading_and_the_splice_through_services_only():
    edges = floors.folder_graph()
    assert ("models", "loading") not in edges and ("models", "sae") not in edges
    import interp_transformer  # noqa: F401  (the top floor provides the services)
    from interp_transformer.core import services

    assert {name: services.service(name).__name__ for name in services.SERVICES} == {
        name: path.rpartition(".")[2] for name, path in services.SERVICES.items()
    }
    with pytest.raises(KeyError, match="no service named 'load'"):
        services.service("load")


@pytest.mark.parametrize(
    "module, source, found",
    [
        (
            "interp_transformer.core.x",
            "from interp_transformer.models import base",
            "core (floor 0) -> models (floor 4)",
        ),
        ("interp_transformer.parts.x", "def f():\n    from ..loading import gguf\n", "parts (floor 2) -> loading"),
        ("interp_transformer.hooks.x", "import interp_transformer.cache.activations", "hooks (floor 1) -> cache"),
        (
            "interp_transformer.loading.x",
            "from interp_transformer import DemoTransformer",
            "loading (floor 5) -> (top)",
        ),
    ],
)
def test_the_finders_flag_a_known_bad_import(module, source, found):
    edges = floors.folder_graph({module: (source, False)})
    assert any(line.startswith(found) for line in floors.upward_imports(edges)), floors.upward_imports(edges)


def test_the_cycle_finder_finds_a_folder_cycle():
    edges = floors.folder_graph(
        {
            "interp_transformer.models.a": ("from interp_transformer.loading import b", False),
            "interp_transformer.loading.b": ("def f():\n    from interp_transformer.models import a\n", False),
        }
    )
    assert floors.folder_cycle(edges) in (["loading", "models", "loading"], ["models", "loading", "models"])
    assert floors.folder_cycle({("a", "b"): 1, ("b", "c"): 1}) == []

"""The pictures in docs/architecture.md are the ones docs/architecture_figures.py draws from the code today."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
_spec = importlib.util.spec_from_file_location("architecture_figures", ROOT / "docs" / "architecture_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def test_the_doc_holds_the_figures_the_code_draws(capsys):
    status = figures.main(["--check"])
    assert status == 0, f"docs/architecture.md is stale; run `{figures.COMMAND}`:\n{capsys.readouterr().out}"


def test_a_stale_figure_is_found_and_shown_as_a_diff(tmp_path, capsys):
    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 1 | `blocks.0."))
    stale = text.replace(row, row.replace("blocks.0.", "blocks.0.old_", 1))
    doc = tmp_path / "architecture.md"
    doc.write_text(stale)
    assert figures.main(["--check", "--doc", str(doc)]) == 1
    out = capsys.readouterr().out
    assert f"-{row.replace('blocks.0.', 'blocks.0.old_', 1)}\n+{row}\n" in out and "is stale" in out
    assert doc.read_text() == stale  # --check only reads
    assert figures.main(["--doc", str(doc)]) == 0 and doc.read_text() == text


def test_an_import_up_a_floor_is_drawn_dotted_and_named():
    floors = {"core": 0, "hooks": 1, "models": 2}
    figure = figures.floors_figure({("hooks", "core"): 3, ("core", "models"): 1}, floors)
    assert "f_hooks --> f_core" in figure and "f_core -.-> f_models" in figure
    assert "go up a floor or leave the floors (dotted above): `core/` -> `models/`." in figure
    assert "A cycle of folders: core -> models -> core." in figures.floors_figure(
        {("models", "core"): 2, ("core", "models"): 1}, floors
    )
    assert "No import goes up a floor. The folder graph has no cycle." in figures.floors_figure(
        {("hooks", "core"): 3}, floors
    )


def test_a_doc_without_its_regions_is_refused_by_name():
    drawn = {"floors": "F", "activation-path": "P"}
    regions = "<!-- figure: floors -->\nold\n<!-- end figure -->\n<!-- figure: activation-path -->\n<!-- end figure -->"
    assert figures.replace_regions(regions, drawn).count(figures.GENERATED) == 2
    with pytest.raises(ValueError, match="lacks the region of '<!-- figure: activation-path -->'"):
        figures.replace_regions("<!-- figure: floors -->\n<!-- end figure -->\n", drawn)
    with pytest.raises(ValueError, match=r"figure 'floor', expected one of .*closest: \['floors'\]"):
        figures.replace_regions(regions.replace("floors", "floor"), drawn)
    with pytest.raises(ValueError, match="'activation-path' has no '<!-- end figure -->' after it"):
        figures.replace_regions(regions.rpartition("\n")[0], drawn)


def test_the_command_line_refuses_a_doc_without_regions_in_one_line(tmp_path, capsys):
    doc = tmp_path / "architecture.md"
    doc.write_text("# no figures here\n")
    assert figures.main(["--check", "--doc", str(doc)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lacks the region of '<!-- figure: floors -->'" in err

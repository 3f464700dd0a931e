"""``interp-transformer patch`` on the shipped induction model: it names the sites our own patching ranks first."""

import pytest
import torch

from analysis.cli import EXIT_OK, EXIT_USAGE, main
from analysis.discovery import attribution_patching, edge_attribution_patching, logit_diff_per_row, patch_sites, sites
from interp_transformer.pretrained import load_shipped

CLEAN = "0 11 22 33 44 11 22 33"
CORRUPTED = "0 11 22 33 55 11 22 33"  # the token after 33 differs: induction copies 44 in one and 55 in the other


def run(capsys, *argv):
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("method", ["patch", "atp"])
def test_patch_prints_the_sites_patching_ranks_first(method, tmp_path, capsys):
    out_file = tmp_path / "patching.html"
    argv = ["patch", "--model", "induction-2l", "--clean", CLEAN, "--corrupted", CORRUPTED]
    code, out, _ = run(capsys, *argv, "--answer", 44, "--wrong", 55, "--method", method, "--out", out_file, "--top", 3)
    assert code == EXIT_OK, out
    model = load_shipped("induction-2l")
    clean = torch.tensor([[int(t) for t in CLEAN.split()]])
    corrupted = torch.tensor([[int(t) for t in CORRUPTED.split()]])
    metric = logit_diff_per_row(44, 55)
    chosen = sites(model, "heads")
    if method == "patch":
        effect = patch_sites(model, clean, corrupted, metric, chosen, progress=False)
        with torch.no_grad():
            effect = effect - float(metric(model(corrupted), torch.arange(1))[0])
    else:
        effect = attribution_patching(model, clean, corrupted, metric, chosen)
    top = chosen[int(effect[:, 0].abs().argmax())].label
    lines = out.splitlines()
    first = lines[lines.index(next(line for line in lines if line.startswith("sites that move it most"))) + 1]
    assert first.split()[0] == top and f"{float(effect[:, 0].abs().max()):.3f}" in first
    clean_line = next(line for line in lines if "clean" in line and "corrupted" in line)
    assert "clean +" in clean_line and "corrupted -" in clean_line  # induction copies 44 in one, 55 in the other
    page = out_file.read_text()
    assert "* plotly.js v" in page and 'src="http' not in page  # plotly.js inline, nothing fetched: opens offline


def test_patch_refuses_prompts_of_different_lengths_in_one_line(capsys):
    argv = ["patch", "--model", "induction-2l", "--clean", CLEAN, "--corrupted", "0 11 22", "--answer", 44]
    code, _, err = run(capsys, *argv, "--wrong", 55)
    assert code == EXIT_USAGE and "the clean prompt is 8 tokens and the corrupted one 3" in err
    assert "Traceback" not in err


def test_patch_with_eap_prints_the_strongest_edge(tmp_path, capsys):
    argv = ["patch", "--model", "induction-2l", "--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", 44]
    code, out, _ = run(capsys, *argv, "--wrong", 55, "--method", "eap", "--out", tmp_path / "edges.html")
    assert code == EXIT_OK, out
    model = load_shipped("induction-2l")
    clean = torch.tensor([[int(t) for t in CLEAN.split()]])
    corrupted = torch.tensor([[int(t) for t in CORRUPTED.split()]])
    upstream, reader, score = edge_attribution_patching(model, clean, corrupted, logit_diff_per_row(44, 55)).top(1)[0]
    first = out.splitlines()[out.splitlines().index("edges that move it most (EAP, first order):") + 1].split()
    assert first[:3] == [upstream, "->", reader] and first[3] == f"{score:+.3f}"
    assert (tmp_path / "edges.html").exists()

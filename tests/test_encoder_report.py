"""The HTML report of a BERT-style encoder: ``interp-transformer report`` on the real all-MiniLM-L6-v2.

The page the command line writes is parsed back (plotly's JSON, typed arrays included)
and its numbers are compared with the model run here, independently: cached attention
patterns, detector scores, the mean-pooled sentence embedding and its attribution.
"""

import base64
import contextlib
import io
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from plotly.offline import get_plotlyjs

from analysis.cli import EXIT_OK, main
from analysis.readouts import attention
from analysis.readouts.post_norm import encoder_direct_attribution
from analysis.report import ENCODER_DISPLAY_ORDER, build_report

from .encoder_helpers import minilm, minilm_path, random_mlm

PROMPT = "The cat sat on the mat. The cat sat on the mat again."


class _Page(HTMLParser):
    """Sections (id -> heading, text, figure ids) and the text of every script of a report page."""

    def __init__(self, page: str):
        super().__init__()
        self.sections: dict[str, dict] = {}
        self.scripts: list[str] = []
        self.urls: list[str] = []
        self._section, self._tag = None, None
        self.feed(page)
        self.figures = {}  # figure id -> (data, layout), decoded from each Plotly.newPlot call
        for script in self.scripts:
            for match in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', script):
                decoder = json.JSONDecoder()
                data, end = decoder.raw_decode(script, match.end())
                layout, _ = decoder.raw_decode(script, script.index("{", end))
                self.figures[match.group(1)] = (data, layout)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._tag = tag
        self.urls += [attrs[name] for name in ("src", "href") if attrs.get(name)]
        if tag == "section":
            self._section = attrs["id"]
            self.sections[self._section] = dict(heading="", text="", figures=[])
        elif tag == "div" and "plotly-graph-div" in (attrs.get("class") or ""):
            self.sections[self._section]["figures"].append(attrs["id"])
        elif tag == "script":
            self.scripts.append("")

    def handle_data(self, data):
        if self._tag == "script":
            self.scripts[-1] += data
        elif self._section is not None:
            self.sections[self._section]["heading" if self._tag == "h2" else "text"] += data

    def handle_endtag(self, tag):
        self._tag = None

    def section_figures(self, key: str) -> list[tuple[list, dict]]:
        return [self.figures[figure_id] for figure_id in self.sections[key]["figures"]]

    def figure_titled(self, key: str, title_start: str) -> list:
        found = [data for data, layout in self.section_figures(key) if layout["title"]["text"].startswith(title_start)]
        assert len(found) == 1, f"{key}: {len(found)} figures titled {title_start!r}"
        return found[0]


def as_tensor(values) -> torch.Tensor:
    """A plotly array from the page: a nested list, or a typed array ``{"dtype", "bdata", "shape"}``."""
    if isinstance(values, dict):
        array = np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"]))
        shape = [int(size) for size in str(values.get("shape", len(array))).split(",")]
        return torch.from_numpy(array.reshape(shape).astype(np.float64))
    return torch.tensor(values, dtype=torch.float64)


@pytest.fixture(scope="module")
def cli_page(tmp_path_factory):
    """``interp-transformer report`` on the MiniLM directory; ``(page, stdout)``."""
    out = tmp_path_factory.mktemp("encoder_report") / "minilm.html"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["report", "--model", str(minilm_path()), "--prompt", PROMPT, "--out", str(out)])
    assert code == EXIT_OK
    return out, _Page(out.read_text(encoding="utf-8")), stdout.getvalue()


@pytest.fixture(scope="module")
def reference():
    """The same model run here: tokens and a full cache of the prompt."""
    model, _ = minilm(torch.float32)
    tokens = model.to_tokens(PROMPT)
    _, cache = model.run_with_cache(tokens)
    return model, tokens, cache


def test_sections_in_order_and_the_omitted_ones_explained(cli_page):
    _, page, stdout = cli_page
    assert list(page.sections) == list(ENCODER_DISPLAY_ORDER)
    omitted = page.sections["omitted"]["text"]
    for what in ("logit lens", "induction heads", "W_out W_U", "OV circuits read out with W_U"):
        assert what in omitted, what
    assert "no MLM head" in omitted and "Instead:" in omitted
    assert "Logit lens" not in page.sections["attribution"]["heading"]
    detector_titles = [layout["title"]["text"] for _, layout in page.section_figures("detectors")]
    assert not any("induction" in title for title in detector_titles)
    assert "Not shown for an encoder" in stdout and "report written to" in stdout


def test_tokens_and_attention_patterns_in_the_page_are_the_models(cli_page, reference):
    _, page, _ = cli_page
    model, tokens, cache = reference
    assert str(tokens[0].tolist()) in page.sections["tokens"]["text"]
    traces = page.figure_titled("attention", "attention pattern of")
    n_heads = model.cfg.n_heads
    assert [trace["name"] for trace in traces] == [
        f"L{l}H{h}" for l in range(model.cfg.n_layers) for h in range(n_heads)
    ]
    for index, trace in enumerate(traces):
        expected = cache["pattern", index // n_heads][0, index % n_heads].double()
        torch.testing.assert_close(as_tensor(trace["z"]), expected, atol=5.1e-5, rtol=0)  # the page keeps 4 decimals


def test_detector_scores_in_the_page_are_the_detectors(cli_page, reference):
    _, page, _ = cli_page
    model, tokens, cache = reference
    cls_id, sep_id = model.tokenizer.cls_token_id, model.tokenizer.sep_token_id
    random_tokens = attention.repeated_random_tokens(model, 20, 4, seed=0, bos=cls_id, eos=sep_id)
    _, random_cache = model.run_with_cache(random_tokens, names_filter=attention.pattern_hook_names(model))
    expected = {
        "previous-token": attention.previous_token_scores(random_cache),
        "next-token": attention.next_token_scores(random_cache),
        "duplicate-token": attention.duplicate_token_scores(random_cache, random_tokens),
    }
    for name, scores in expected.items():
        data = page.figure_titled("detectors", f"{name} score<br><sup>repeated random tokens")
        torch.testing.assert_close(as_tensor(data[0]["z"]), scores.double(), atol=1e-6, rtol=1e-5)
    on_prompt = page.figure_titled("detectors", "duplicate-token score<br><sup>on the prompt")
    torch.testing.assert_close(
        as_tensor(on_prompt[0]["z"]), attention.duplicate_token_scores(cache, tokens).double(), atol=1e-6, rtol=1e-5
    )


def test_attribution_in_the_page_splits_the_sentence_embedding(cli_page, reference):
    _, page, _ = cli_page
    model, tokens, cache = reference
    embedding = model.mean_pooled_embedding(tokens)[0].detach()
    assert f"the norm is {float(embedding.norm()):.4g}" in page.sections["attribution"]["text"]
    attr = encoder_direct_attribution(cache, embedding / embedding.norm(), pos="mean")
    heads = page.figure_titled("attribution", "direct contribution of heads")
    torch.testing.assert_close(as_tensor(heads[0]["z"]), attr.heads[..., 0].double(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(attr.total(), embedding.norm()[None], atol=1e-4, rtol=1e-5)


def test_the_page_is_self_contained(cli_page):
    _, page, _ = cli_page
    assert not [url for url in page.urls if url.startswith(("http://", "https://", "//"))]
    assert sum(get_plotlyjs()[:300] in script for script in page.scripts) == 1
    n_divs = sum(len(section["figures"]) for section in page.sections.values())
    assert len(page.figures) == n_divs > 0


def test_an_mlm_encoder_reads_its_ov_circuits_out_with_its_decoder():
    model, hf = random_mlm()
    prompt = torch.tensor([2, 9, 14, 9, 40, 14, 3])
    report = build_report(model, prompt, title="random MLM")
    assert [section.key for section in report.sections] == list(ENCODER_DISPLAY_ORDER)
    circuits = report["circuits"].data
    assert circuits["read_out"] == "unembed"
    ids = torch.tensor(circuits["token_ids"])
    W_U = hf.cls.predictions.decoder.weight.T[:, ids]
    for head in circuits["heads"]:
        dense = model.W_E[ids] @ model.W_V[head["layer"], head["head"]] @ model.W_O[head["layer"], head["head"]] @ W_U
        torch.testing.assert_close(head["ov"], dense)
    whats = [part["what"] for part in report["omitted"].data["parts"]]
    assert "OV circuits read out with W_U" not in whats and len(whats) == 3
    assert report["attribution"].data["total"] == pytest.approx(report["attribution"].data["value"], abs=1e-9)


def test_one_prompt_only():
    model, _ = minilm(torch.float32)
    with pytest.raises(ValueError, match="different token lengths"):
        build_report(model, ["A short one.", "A much longer second sentence here."], title="two")
    with pytest.raises(ValueError, match="one prompt"):
        build_report(model, torch.tensor([[101, 7592, 102], [101, 2088, 102]]), title="two")

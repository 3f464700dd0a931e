"""The report of an encoder-decoder: its sections follow the capabilities, and the alignment heatmap is read in
Chromium."""

import pytest
import torch

from analysis.report import build_report
from interp_transformer.pretrained import load_shipped_metadata, load_translation_model

from .browser import BrowserSession, require_browser
from .encoder_decoder_helpers import DECODER_INPUT, SOURCE, converted

SOURCE_TEXT = "three hundred forty two thousand six hundred five"


@pytest.fixture(scope="module")
def translation_report():
    model = load_translation_model()
    card = load_shipped_metadata("translate-tiny")
    return model, build_report(model, SOURCE_TEXT, title="translate-tiny", metadata={"curve": card["curve"]})


def test_the_translation_report_has_the_encoder_decoder_sections(translation_report):
    model, report = translation_report
    assert [s.key for s in report.sections] == [
        "model",
        "translation",
        "interpretation",
        "omitted",
        "cross_attention",
        "alignment",
        "attribution",
        "patching",
    ]
    translation = report["translation"].data
    assert translation.source_tokens == SOURCE_TEXT.split() + ["</s>"]
    assert translation.target_tokens == ["<s>", "3", "4", "2", "6", "0", "5"]
    assert translation.alignment == [0, 2, 3, 5, -1, 7, -1]
    assert len(report["model"].figures) == 1  # the training curve


def test_the_alignment_section_finds_the_aligned_head(translation_report):
    _, report = translation_report
    alignment = report["alignment"].data
    assert alignment.kind == "known alignment" and alignment.best[2] > 0.6
    heatmap = report["alignment"].figures[1]
    assert list(heatmap.layout.xaxis.ticktext) == SOURCE_TEXT.split() + ["&lt;/s&gt;"]
    assert heatmap.layout.xaxis.title.text == "key_pos (source)"
    circles = heatmap.data[1]
    assert list(circles.x) == [0, 2, 3, 5, 7] and list(circles.y) == [0, 1, 2, 3, 5]
    assert any("follows the known alignment" in line for line in report.summary)


def test_the_attribution_sums_to_the_predicted_logits(translation_report):
    model, report = translation_report
    data = report["attribution"].data
    assert data.values.shape == (len(data.components), 7)
    decoder_input = torch.tensor([report["translation"].data.target])
    logits = model(model.to_tokens(SOURCE_TEXT), decoder_input)[0]
    predicted = torch.tensor(data.predicted)
    torch.testing.assert_close(data.values.sum(dim=0), logits[torch.arange(7), predicted], atol=1e-4, rtol=0)


def test_a_post_norm_models_report_leaves_out_attribution_and_says_why():
    ours, _ = converted("bart")
    report = build_report(ours, SOURCE[0, :7], title="bart", decoder_input=DECODER_INPUT[:1])
    assert "attribution" not in [s.key for s in report.sections]
    omitted = report["omitted"].data.parts
    assert any(part["what"].startswith("direct logit attribution") and "post-norm" in part["why"] for part in omitted)
    assert report["alignment"].data.kind == "diagonal"


def test_decoder_input_is_refused_for_a_decoder_only_model(small_model):
    with pytest.raises(ValueError, match="decoder_input is the target of an encoder-decoder"):
        build_report(small_model, torch.tensor([1, 2, 3]), decoder_input=torch.tensor([1]))


def test_the_alignment_heatmap_renders_in_chromium(translation_report, tmp_path):
    require_browser()
    _, report = translation_report
    path = report.save(tmp_path / "translate.html")
    heatmap = "document.querySelectorAll('#alignment .js-plotly-plot')[1]"
    with BrowserSession() as browser:
        check = browser.check_html(path, tmp_path / "translate.png")
        with browser.open_page(path, viewport=(1280, 1400)) as opened:
            page = opened.page
            page.wait_for_function(f"{heatmap} && {heatmap}.querySelector('.main-svg') !== null")
            ticks = page.evaluate(f"Array.from({heatmap}.querySelectorAll('.xtick text')).map(t => t.textContent)")
            title = page.evaluate(f"{heatmap}.layout.title.text")
            z = page.evaluate(f"{heatmap}.data[0].z")
            circles = page.evaluate(f"{heatmap}.querySelectorAll('.scatterlayer .point').length")
    assert check.n_rendered_plots == check.n_plots == len(report.figures)
    assert check.console_errors == [] and check.page_errors == [] and check.external_requests == []
    assert ticks == SOURCE_TEXT.split() + ["</s>"]
    assert title.startswith("alignment heatmap")
    pattern = report["alignment"].data.pattern
    assert torch.allclose(torch.tensor(z, dtype=pattern.dtype), pattern, atol=1e-6)
    assert circles == 5
    assert check.screenshot_path.stat().st_size > 10_000

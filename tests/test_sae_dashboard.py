"""Feature dashboards: their numbers against the tensors they come from, and the pages as a reader's browser sees them.

The browser half opens the saved pages in headless Chromium (``tests/browser.py``): no
console error, no request leaves the machine, the plots render, and the numbers read back
from the DOM (each highlighted token's value, each logit row, the histogram's bars) equal
the tensors. Skipped when Chromium or playwright is missing, unless REQUIRE_BROWSER=1.
"""

import html
import re

import numpy as np
import pytest
import torch

from analysis.sae_features import feature_dashboards, feature_logit_effect, read_features
from analysis.sae_features.examples import PAD
from analysis.views.inputs import decimals_for
from tests.browser import BrowserSession, require_browser

from .sae_helpers import gpt2_with_tokenizer, prose_files, random_sae

FEATURES = [10, 11, 42]
OPTIONS = dict(k=5, left=4, right=2, context_length=32, batch_size=8)


@pytest.fixture(scope="module")
def model():
    return gpt2_with_tokenizer(n_embd=32)


@pytest.fixture(scope="module")
def sae():
    return random_sae("standard", "blocks.1.hook_resid_pre", d_in=32, d_sae=48, seed=len("blocks.1.hook_resid_pre"))


@pytest.fixture(scope="module")
def dashboards(model, sae):
    return feature_dashboards(model, sae, prose_files(), FEATURES, n_logits=6, progress=False, **OPTIONS)


@pytest.fixture(scope="module")
def reference(model, sae):
    reading = read_features(model, sae, prose_files(), FEATURES, progress=False, **OPTIONS)
    return reading, feature_logit_effect(model, sae, FEATURES, k=6)


def test_dashboard_numbers_are_the_tensors(model, dashboards, reference):
    reading, effect = reference
    found = reading.examples
    assert [d.feature for d in dashboards] == FEATURES
    for row, dashboard in enumerate(dashboards):
        filled = [j for j in range(OPTIONS["k"]) if float(found.values[row, j]) not in (0.0, float("-inf"))]
        assert [e.value for e in dashboard.examples] == [float(found.values[row, j]) for j in filled] and filled
        for example, j in zip(dashboard.examples, filled):
            inside = found.window_tokens[row, j] != PAD
            ids = found.window_tokens[row, j][inside]
            assert example.tokens == model.to_str_tokens(ids)
            assert example.acts == found.window_acts[row, j][inside].tolist()
            assert example.acts[example.hit] == example.value  # the activating token is the window's hit
            assert (example.text_index, example.position) == (
                int(found.text_index[row, j]),
                int(found.position[row, j]),
            )
        assert dashboard.counts == reading.histograms.counts[row].tolist()
        assert dashboard.firing_rate == pytest.approx(float(reading.histograms.firing_rate[row]))
        assert [(i, v) for _, i, v in dashboard.promoted] == list(
            zip(effect.top_tokens[row].tolist(), effect.top_values[row].tolist())
        )
        assert [(i, v) for _, i, v in dashboard.suppressed] == list(
            zip(effect.bottom_tokens[row].tolist(), effect.bottom_values[row].tolist())
        )
        assert [t for t, _, _ in dashboard.promoted] == model.to_str_tokens(effect.top_tokens[row])


def test_pages_are_self_contained(dashboards, tmp_path):
    index = dashboards.save(tmp_path / "features")
    assert sorted(p.name for p in index.parent.iterdir()) == [
        "feature_10.html",
        "feature_11.html",
        "feature_42.html",
        "index.html",
    ]
    page = (index.parent / "feature_11.html").read_text()
    assert page.count("window.interpTransformerViews = {version") == 1  # the views' library, once
    assert page.count('<script type="text/javascript">/**\n* plotly.js') == 1  # plotly.js, once
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.S)  # plotly.js itself holds URL strings
    assert "<script src" not in page and not re.search(r"<link|(src|href)=\"(https?:)?//", markup)
    assert page.count('class="example"') == len(dashboards[11].examples)
    links = re.findall(r'href="([^"#]+)"', index.read_text())
    assert links == [f"feature_{f}.html" for f in FEATURES] and "<script" not in index.read_text()


def test_a_model_without_linear_logits_gets_a_note_instead(sae):
    from .encoder_helpers import random_mlm

    encoder = random_mlm(dtype=torch.float32)[0]
    tokens = torch.randint(0, 61, (6, 12), generator=torch.Generator().manual_seed(0))
    encoder_sae = random_sae("standard", "blocks.1.hook_resid_pre", d_in=32, d_sae=8)
    dashboards = feature_dashboards(encoder, encoder_sae, tokens, [0, 1], progress=False, k=3)
    assert dashboards[0].promoted == [] and "linear" in dashboards[0].logits_note
    page = dashboards[0].to_html()
    assert html.escape(dashboards[0].logits_note) in page and 'id="promoted"' not in page
    assert dashboards[0].examples[0].tokens[0].isdigit()  # no tokenizer: token ids as text


# --------------------------------------------------------------------------- in the browser

_TOKEN_VALUES_JS = """(rank) => Array.from(document.querySelectorAll(`.example[data-rank="${rank}"] .itv-token`))
    .map((span) => [span.textContent, Number(span.getAttribute('data-value'))])"""
_TABLE_JS = """(id) => Array.from(document.querySelectorAll(`#${id} tr[data-token-id]`))
    .map((row) => [Number(row.getAttribute('data-token-id')), Number(row.getAttribute('data-value'))])"""


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with BrowserSession() as session:
        yield session


def test_feature_pages_in_the_browser(browser, dashboards, tmp_path):
    index = dashboards.save(tmp_path / "features")
    for dashboard in dashboards:
        with browser.open_page(index.parent / f"feature_{dashboard.feature}.html") as opened:
            page = opened.page
            page.wait_for_function(
                "document.querySelectorAll('.itv-view[data-itv-mounted]').length === "
                f"{len(dashboard.examples)}"
                " && document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2",
                timeout=15_000,
            )
            for rank, example in enumerate(dashboard.examples):
                shown = page.evaluate(_TOKEN_VALUES_JS, rank)
                acts = np.asarray(example.acts)
                assert [value for _, value in shown] == np.round(acts, decimals_for(acts)).tolist()
                assert len(shown) == len(example.tokens)
            for table, rows in (("promoted", dashboard.promoted), ("suppressed", dashboard.suppressed)):
                assert page.evaluate(_TABLE_JS, table) == [[i, v] for _, i, v in rows]
            bars = page.evaluate("() => Array.from(document.getElementById('histogram-plot')._fullData[0].y)")
            assert bars == dashboard.counts
            assert page.evaluate("() => document.querySelectorAll('.js-plotly-plot').length") == 2
            assert (opened.console_errors, opened.page_errors, opened.external_requests) == ([], [], [])
    with browser.open_page(index) as opened:
        assert opened.page.evaluate("() => document.querySelectorAll('tr[data-feature] a').length") == len(FEATURES)
        assert (opened.console_errors, opened.page_errors, opened.external_requests) == ([], [], [])

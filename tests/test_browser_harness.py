"""Tests for tests/browser.py: the headless-Chromium check used on HTML reports.

The reference is the browser itself: a page written by plotly with plotly.js
embedded must render every figure with no error and no network request, and
pages broken on purpose (a throwing script, plotly.js from a CDN, no plots)
must each be caught by the matching field, so the check can fail.

Skipped when Chromium or playwright is missing, unless REQUIRE_BROWSER=1
(set it in CI after `.ci/install_browser.sh`, so a missing browser fails
instead of skipping quietly).
"""

import struct
from pathlib import Path

import plotly
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from tests.browser import BrowserCheck, BrowserSession, check_html, is_external, require_browser


@pytest.fixture(scope="module")
def browser():
    # One browser for the module: starting Chromium is most of a check's cost.
    require_browser()
    with BrowserSession() as session:
        yield session


def _heatmap() -> go.Figure:
    z = [[(i - j) / 4 for j in range(8)] for i in range(8)]
    fig = go.Figure(go.Heatmap(z=z, colorscale="RdBu", zmid=0))
    fig.update_layout(title="heatmap: query_pos vs key_pos", width=600, height=400)
    return fig


def _lines() -> go.Figure:
    fig = go.Figure(go.Scatter(x=list(range(10)), y=[x * x for x in range(10)], mode="lines+markers"))
    fig.update_layout(title="line: layer vs value", width=600, height=400)
    return fig


def _page(title: str, body: str) -> str:
    head = f'<head><meta charset="utf-8"><title>{title}</title></head>'
    return f"<!DOCTYPE html>\n<html>{head}\n<body>\n{body}\n</body></html>\n"


def _write(tmp_path: Path, name: str, html: str) -> Path:
    path = tmp_path / name
    path.write_text(html, encoding="utf-8")
    return path


def _check(browser: BrowserSession, tmp_path: Path, html_path: Path) -> BrowserCheck:
    return browser.check_html(html_path, tmp_path / (html_path.stem + ".png"), timeout_s=20)


def test_is_external_classifies_schemes():
    assert not is_external("file:///tmp/report.html")
    assert not is_external("data:image/png;base64,AAAA")
    assert not is_external("blob:null/1234")
    assert not is_external("about:blank")
    assert is_external("https://cdn.plot.ly/plotly-3.0.0.min.js")
    assert is_external("http://127.0.0.1:8000/x.js")
    assert is_external("ws://localhost/socket")


def test_self_contained_report_renders_offline(browser, tmp_path):
    # Two figures in one page, plotly.js embedded once, as a report writes them.
    body = "<h1>two figures</h1>\n" + _heatmap().to_html(include_plotlyjs=True, full_html=False)
    body += "\n" + _lines().to_html(include_plotlyjs=False, full_html=False)
    report = _write(tmp_path, "report.html", _page("self-contained report", body))

    result = _check(browser, tmp_path, report)

    assert result.page_errors == []
    assert result.console_errors == []
    assert result.external_requests == []
    assert result.n_plots == 2
    assert result.n_rendered_plots == 2
    assert result.n_plot_svgs >= 2
    assert not result.timed_out
    assert result.title == "self-contained report"
    png = result.screenshot_path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # IHDR holds width and height. A heading plus two 400 px figures is taller
    # than the 800 px viewport: a viewport-only capture would stop at 800.
    width, height = struct.unpack(">II", png[16:24])
    assert width == 1280
    assert height > 2 * 400, (width, height)


def test_waits_for_late_plot_and_allows_local_script_files(browser, tmp_path):
    # plotly.js as a sibling file (file:// is local, not external), and a figure
    # drawn 500 ms after "load": counting at load time would find it undrawn.
    (tmp_path / "plotly.min.js").write_text(plotly.offline.get_plotlyjs(), encoding="utf-8")
    body = """<script src="plotly.min.js"></script>
<div id="late" class="plotly-graph-div" style="width:500px;height:300px"></div>
<script>
window.addEventListener("load", () => setTimeout(
    () => Plotly.newPlot("late", [{y: [3, 1, 2], type: "bar"}], {title: {text: "drawn late"}}), 500));
</script>"""
    page = _write(tmp_path, "late.html", _page("late plot", body))

    result = _check(browser, tmp_path, page)

    assert (result.n_plots, result.n_rendered_plots) == (1, 1)
    assert not result.timed_out
    assert result.page_errors == result.console_errors == result.external_requests == []


def test_write_html_full_page_renders(tmp_path):
    # The one-shot check_html (its own browser), on a page from plotly.io.write_html.
    require_browser()
    report = tmp_path / "one_figure.html"
    pio.write_html(_lines(), report, include_plotlyjs=True, full_html=True)

    result = check_html(report, tmp_path / "one_figure.png", timeout_s=20)

    assert (result.n_plots, result.n_rendered_plots) == (1, 1)
    assert result.page_errors == result.console_errors == result.external_requests == []


def test_script_error_is_reported(browser, tmp_path):
    # No plotly.js here: parsing its 4.7 MB costs a second or more per page, and
    # the rendering path is covered above; this page only has to throw.
    body = "<p>before the error</p>\n<script>console.error('deliberate console error'); notAFunction();</script>"
    page = _write(tmp_path, "broken_script.html", _page("broken script", body))

    result = _check(browser, tmp_path, page)

    assert len(result.page_errors) == 1
    assert "notAFunction" in result.page_errors[0]
    assert result.console_errors == ["deliberate console error"]
    assert result.external_requests == []


def test_cdn_plotly_is_an_external_request(browser, tmp_path):
    body = _lines().to_html(include_plotlyjs="cdn", full_html=False)
    body += "\n<script>fetch('https://example.invalid/data.json').catch(() => {});</script>"
    page = _write(tmp_path, "cdn.html", _page("cdn", body))

    result = _check(browser, tmp_path, page)

    assert any(url.startswith("https://cdn.plot.ly/") for url in result.external_requests), result.external_requests
    assert "https://example.invalid/data.json" in result.external_requests
    # Without its script the figure cannot draw, and the check says so at once.
    assert result.n_plots == 1
    assert result.n_rendered_plots == 0
    assert any("Plotly" in error for error in result.page_errors), result.page_errors


def test_page_without_plots_counts_none(browser, tmp_path):
    page = _write(tmp_path, "empty.html", _page("no plots", "<h1>nothing to see</h1><p>text only</p>"))

    result = _check(browser, tmp_path, page)

    assert (result.n_plots, result.n_rendered_plots, result.n_plot_svgs) == (0, 0, 0)
    assert result.page_errors == result.console_errors == result.external_requests == []
    assert result.title == "no plots"

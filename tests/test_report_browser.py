"""The report as a reader sees it: opened offline in headless Chromium (see ``tests/browser.py``).

Skips, saying why, when no Chromium or no playwright package is installed
(``bash .ci/install_browser.sh`` installs Chromium; ``pip install -e '.[dev]'`` playwright).
"""

import importlib.util

import pytest
import torch

from analysis.report import build_report

from .browser import CHROMIUM_ARGS, check_html, find_chromium

PROMPT = torch.tensor([0, 5, 9, 13, 7, 5, 9, 13, 7, 5])


def _skip_reason():
    if find_chromium() is None:
        return "no Chromium on this machine: run `bash .ci/install_browser.sh` (or set CHROMIUM_PATH)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is missing: pip install -e '.[dev]'"
    return None


@pytest.fixture(scope="module")
def browser_check(small_model, tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("report_browser")
    report = build_report(small_model, PROMPT, title="browser check")
    path = report.save(directory / "report.html")
    check = check_html(path, directory / "report.png", timeout_s=60)
    print(f"screenshot: {check.screenshot_path}")
    return report, check, path


def test_every_figure_renders_as_plotly_svg(browser_check):
    report, check, _ = browser_check
    assert not check.timed_out
    assert check.n_plots == len(report.figures)
    assert check.n_rendered_plots == check.n_plots
    assert check.n_plot_svgs >= check.n_plots  # plotly draws two or three .main-svg per figure
    assert check.title == "browser check"


def test_no_script_errors_and_nothing_fetched(browser_check):
    _, check, _ = browser_check
    assert check.console_errors == []
    assert check.page_errors == []
    assert check.external_requests == []


def test_screenshot_is_saved(browser_check):
    _, check, _ = browser_check
    assert check.screenshot_path.is_file()
    assert check.screenshot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert check.screenshot_path.stat().st_size > 10_000  # a blank page compresses to far less


def test_the_head_menu_switches_the_attention_pattern(browser_check, small_model):
    from playwright.sync_api import sync_playwright

    _, _, path = browser_check
    plot = "document.querySelector('#attention .js-plotly-plot')"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(), args=list(CHROMIUM_ARGS), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1200})
            page.goto(path.resolve().as_uri(), wait_until="load")
            page.wait_for_function(f"{plot} !== null && {plot}.querySelector('.main-svg') !== null")
            before = page.evaluate(f"{plot}.data.map(trace => trace.visible === true).indexOf(true)")
            target = (before + 1) % (small_model.cfg.n_layers * small_model.cfg.n_heads)
            page.locator("#attention .updatemenu-header").first.click()
            page.locator("#attention .updatemenu-dropdown-button").nth(target).click()
            page.wait_for_function(f"{plot}.data[{target}].visible === true")
            visible = page.evaluate(f"{plot}.data.map(trace => trace.visible === true)")
            title = page.evaluate(f"{plot}.layout.title.text")
        finally:
            browser.close()
    n_heads = small_model.cfg.n_heads
    assert visible == [index == target for index in range(len(visible))]
    assert title == f"attention pattern of L{target // n_heads}H{target % n_heads}"

"""analysis.views as a reader sees them: opened offline in headless Chromium (see ``tests/browser.py``).

The reference is the tensor: after each hover, click, key press or menu choice,
every token's ``data-value`` must equal the matching row (or column) of the
pattern, or column of the values, rounded to 4 decimals, and its computed
background must be ``colours.colour_of`` of that value. Canvas pixels of the
pattern grid are read back and compared the same way.

Skipped when Chromium or playwright is missing, unless REQUIRE_BROWSER=1.
"""

import numpy as np
import pytest
import torch

from analysis.views import activation_view, attention_view, colours, page_html, pattern_grid
from tests.browser import BrowserSession, require_browser

TOKENS = ["<bos>", "When", " Mary", " and", " John", " went", " to", "\n", " the"]
N = len(TOKENS)

_PAINTED_JS = """(selector) => Array.from(document.querySelectorAll(selector)).map((span) => {
    const style = getComputedStyle(span);
    return [Number(span.getAttribute('data-value')), style.backgroundColor, style.color];
})"""

_CANVAS_JS = """([selector, cell]) => {
    const canvas = document.querySelector(selector);
    const ctx = canvas.getContext('2d');
    const n = canvas.width / cell, cells = [];
    for (let q = 0; q < n; q++) {
        const row = [];
        for (let k = 0; k < n; k++) {
            const p = ctx.getImageData(k * cell + Math.floor(cell / 2), q * cell + Math.floor(cell / 2), 1, 1).data;
            row.push(`rgb(${p[0]}, ${p[1]}, ${p[2]})`);
        }
        cells.push(row);
    }
    return cells;
}"""


def causal_pattern(n_heads: int, n_pos: int, seed: int = 0) -> torch.Tensor:
    scores = 2 * torch.randn(n_heads, n_pos, n_pos, generator=torch.Generator().manual_seed(seed))
    causal = torch.ones(n_pos, n_pos).tril().bool()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


PATTERN = causal_pattern(3, N)
VALUES = torch.randn(N, 3, generator=torch.Generator().manual_seed(2)) * torch.tensor([1.0, 1.0, 40.0])
VALUES[:, 1] = VALUES[:, 1].relu()  # a column >= 0: sequential scale
VALUES[:, 2] = VALUES[:, 2].abs()


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with BrowserSession() as session:
        yield session


def css(rgb) -> str:
    return "rgb({}, {}, {})".format(*rgb)


def expect_painted(page, selector: str, values, scale: dict) -> None:
    """Each token under ``selector`` shows ``values`` (rounded as the page holds them) in ``scale``'s colours."""
    expected = [float(v) for v in np.round(np.asarray(values, dtype=np.float64), 4)]
    got = page.evaluate(_PAINTED_JS, selector)
    assert [value for value, _, _ in got] == expected
    assert [background for _, background, _ in got] == [css(colours.colour_of(v, scale)) for v in expected]
    assert [text for _, _, text in got] == [
        css(int(colours.text_colour(colours.colour_of(v, scale))[i : i + 2], 16) for i in (1, 3, 5)) for v in expected
    ]


def open_views(
    browser: BrowserSession, tmp_path, views, name: str, *, script_in_each: bool = False, viewport=(1280, 800)
):
    """Write ``views`` as one page and open it. ``script_in_each``: every fragment carries the library, as in a
    notebook."""
    if script_in_each:
        body = "\n".join(f"<h2>view {i}</h2>{view.to_html()}" for i, view in enumerate(views))
        html = (
            f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{name}</title></head><body>{body}</body></html>'
        )
    else:
        html = page_html(views, title=name)
    path = tmp_path / f"{name}.html"
    path.write_text(html, encoding="utf-8")
    return browser.open_page(path, viewport=viewport)


def mounted_ids(page, count: int) -> list[str]:
    page.wait_for_function(
        f"document.querySelectorAll('.itv-view[data-itv-mounted]').length === {count}", timeout=10_000
    )
    return page.evaluate("() => Array.from(document.querySelectorAll('.itv-view')).map((v) => v.id)")


def assert_clean(opened) -> None:
    assert opened.page_errors == []
    assert opened.console_errors == []
    assert opened.external_requests == []


def test_attention_view_hover_click_direction_and_head(browser, tmp_path):
    scale = colours.sequential_scale(1.0)
    pattern = PATTERN.double().numpy()
    with open_views(
        browser, tmp_path, [attention_view(TOKENS, PATTERN, ["L0H0", "L0H1", "L0H2"])], "attention"
    ) as opened:
        page = opened.page
        (root,) = mounted_ids(page, 1)
        text = f"#{root} > .itv-tokens .itv-token"
        expect_painted(page, text, pattern[0, N - 1], scale)  # starts on the last token's row

        page.hover(f"{text}[data-pos='2']")
        assert page.get_attribute(f"#{root}", "data-token") == "2"
        expect_painted(page, text, pattern[0, 2], scale)
        page.mouse.move(1, 1)
        expect_painted(page, text, pattern[0, N - 1], scale)  # leaving the text goes back to the kept token

        page.click(f"{text}[data-pos='4']")
        page.mouse.move(1, 1)
        expect_painted(page, text, pattern[0, 4], scale)
        assert page.get_attribute(f"{text}[data-pos='4']", "aria-selected") == "true"

        page.check(f"#{root} input[type=radio][value=to]")
        assert page.get_attribute(f"#{root}", "data-direction") == "to"
        expect_painted(page, text, pattern[0, :, 4], scale)  # the column: who attends to token 4

        page.select_option(f"#{root} select", "2")
        assert page.get_attribute(f"#{root}", "data-head") == "2"
        expect_painted(page, text, pattern[2, :, 4], scale)
        title = page.get_attribute(f"{text}[data-pos='6']", "title")
        assert title == f'pos 6 " to": {round(float(pattern[2, 6, 4]), 4)} (attention to pos 4)'
        status = page.text_content(f"#{root} .itv-status")
        assert status.startswith('L0H2: attention to " John" (pos 4) from each token')
        assert_clean(opened)


def test_attention_view_by_keyboard(browser, tmp_path):
    scale = colours.sequential_scale(1.0)
    pattern = PATTERN.double().numpy()
    with open_views(browser, tmp_path, [attention_view(TOKENS, PATTERN)], "attention_keys") as opened:
        page = opened.page
        (root,) = mounted_ids(page, 1)
        text = f"#{root} > .itv-tokens .itv-token"
        page.focus(f"#{root} select")
        page.keyboard.press("ArrowDown")  # a closed <select> changes with the arrow keys
        assert page.get_attribute(f"#{root}", "data-head") == "1"
        for _ in range(3):  # select -> radio group -> "all heads" -> the text (one tab stop)
            page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.getAttribute('data-pos')") == str(N - 1)
        page.keyboard.press("ArrowLeft")
        page.keyboard.press("ArrowLeft")
        assert page.get_attribute(f"#{root}", "data-token") == str(N - 3)  # focus previews
        page.keyboard.press("Enter")
        page.keyboard.press("Home")
        expect_painted(page, text, pattern[1, 0], scale)
        page.keyboard.press("Shift+Tab")  # leaving the text shows the token kept with Enter
        expect_painted(page, text, pattern[1, N - 3], scale)
        page.keyboard.press("Tab")
        page.keyboard.press("End")
        page.keyboard.press(" ")
        page.keyboard.press("Shift+Tab")
        expect_painted(page, text, pattern[1, N - 1], scale)
        assert_clean(opened)


def test_attention_view_all_heads(browser, tmp_path):
    scale = colours.sequential_scale(1.0)
    pattern = PATTERN.double().numpy()
    with open_views(browser, tmp_path, [attention_view(TOKENS, PATTERN, initial_token=5)], "attention_all") as opened:
        page = opened.page
        (root,) = mounted_ids(page, 1)
        assert page.is_hidden(f"#{root} .itv-multiples")
        page.check(f"#{root} input[type=checkbox]")
        assert page.locator(f"#{root} .itv-card").count() == 3
        for head in range(3):
            expect_painted(page, f"#{root} .itv-card[data-head='{head}'] .itv-token", pattern[head, 5], scale)
        page.hover(f"#{root} > .itv-tokens .itv-token[data-pos='7']")  # the small copies follow the pointer too
        for head in range(3):
            expect_painted(page, f"#{root} .itv-card[data-head='{head}'] .itv-token", pattern[head, 7], scale)
        page.click(f"#{root} .itv-card[data-head='2'] button")
        assert page.get_attribute(f"#{root}", "data-head") == "2"
        assert page.input_value(f"#{root} select") == "2"
        assert "itv-current" in page.get_attribute(f"#{root} .itv-card[data-head='2']", "class")
        page.uncheck(f"#{root} input[type=checkbox]")
        assert page.is_hidden(f"#{root} .itv-multiples")
        assert_clean(opened)


def test_activation_view_column_menu_and_values_on_hover(browser, tmp_path):
    view = activation_view(TOKENS, VALUES, ["signed", "relu", "large"])
    scales = view.data["scales"]
    values = VALUES.double().numpy()
    with open_views(browser, tmp_path, [view], "activations") as opened:
        page = opened.page
        (root,) = mounted_ids(page, 1)
        text = f"#{root} > .itv-tokens .itv-token"
        assert scales[0]["min"] == -scales[0]["max"] and scales[1]["min"] == 0.0
        expect_painted(page, text, values[:, 0], scales[0])
        negative = int(np.argmin(values[:, 0]))
        background = page.evaluate(_PAINTED_JS, text)[negative][1]
        red, _, blue = (int(c) for c in background[4:-1].split(","))
        assert blue > red  # below zero is blue on the diverging scale

        page.select_option(f"#{root} select", "1")
        assert page.get_attribute(f"#{root}", "data-column") == "1"
        expect_painted(page, text, values[:, 1], scales[1])
        page.select_option(f"#{root} select", "2")
        expect_painted(page, text, values[:, 2], scales[2])

        value = round(float(values[3, 2]), 4)
        assert page.get_attribute(f"{text}[data-pos='3']", "title") == f'pos 3 " and": large = {value}'
        page.hover(f"{text}[data-pos='3']")
        assert page.text_content(f"#{root} .itv-status") == f'" and" (pos 3): large = {value}'
        legend = page.text_content(f"#{root} .itv-legend")
        assert legend == f"large0{scales[2]['max']}"
        assert_clean(opened)


def test_pattern_grid_thumbnails_and_enlarged_head(browser, tmp_path):
    scale = colours.sequential_scale(1.0)
    pattern = np.round(PATTERN.double().numpy(), 4)
    expected = [[[css(colours.colour_of(v, scale)) for v in row] for row in head] for head in pattern]
    with open_views(browser, tmp_path, [pattern_grid(PATTERN, TOKENS)], "grid") as opened:
        page = opened.page
        (root,) = mounted_ids(page, 1)
        assert page.locator(f"#{root} .itv-thumb").count() == 3
        for head in range(3):
            assert page.evaluate(_CANVAS_JS, [f"#{root} .itv-thumb[data-head='{head}'] canvas", 1]) == expected[head]
        assert page.is_hidden(f"#{root} .itv-enlarged")

        page.click(f"#{root} .itv-thumb[data-head='2']")
        panel = f"#{root} .itv-enlarged"
        assert page.get_attribute(panel, "data-head") == "2"
        assert page.get_attribute(f"#{root} .itv-thumb[data-head='2']", "aria-pressed") == "true"
        canvas = f"{panel} canvas"
        cell = page.evaluate(f"() => document.querySelector({canvas!r}).width") // N
        assert cell >= 14
        assert page.evaluate(_CANVAS_JS, [canvas, cell]) == expected[2]
        labels = page.evaluate(
            f"() => Array.from(document.querySelectorAll('{panel} .itv-row-labels div')).map((d) => d.textContent)"
        )
        assert labels == [token.replace("\n", "\u21b5") for token in TOKENS]
        assert page.locator(f"{panel} .itv-col-labels div").count() == N

        box = page.locator(canvas).bounding_box()
        page.mouse.move(box["x"] + (2 + 0.5) * box["width"] / N, box["y"] + (6 + 0.5) * box["height"] / N)
        assert (page.get_attribute(panel, "data-query"), page.get_attribute(panel, "data-key")) == ("6", "2")
        assert float(page.get_attribute(panel, "data-value")) == pattern[2, 6, 2]
        status = page.text_content(f"{panel} .itv-status")
        assert status == f'query " to" (pos 6) \u2192 key " Mary" (pos 2): {pattern[2, 6, 2]}'

        page.focus(f"#{root} .itv-thumb[data-head='0']")
        page.keyboard.press("Enter")
        assert page.get_attribute(panel, "data-head") == "0"
        page.focus(canvas)  # the cursor starts at the last query, first key
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowUp")
        assert (page.get_attribute(panel, "data-query"), page.get_attribute(panel, "data-key")) == (str(N - 2), "1")
        assert float(page.get_attribute(panel, "data-value")) == pattern[0, N - 2, 1]
        assert_clean(opened)


@pytest.mark.parametrize("script_in_each", [True, False], ids=["script-in-each-fragment", "script-once-in-head"])
def test_two_views_of_each_kind_share_one_definition(browser, tmp_path, script_in_each):
    other = causal_pattern(3, N, seed=7)
    views = [
        attention_view(TOKENS, PATTERN),
        attention_view(TOKENS, other),
        activation_view(TOKENS, VALUES),
        activation_view(TOKENS, -VALUES),
        pattern_grid(PATTERN, TOKENS),
        pattern_grid(other, TOKENS),
    ]
    scale = colours.sequential_scale(1.0)
    with open_views(browser, tmp_path, views, f"six_{script_in_each}", script_in_each=script_in_each) as opened:
        page = opened.page
        ids = mounted_ids(page, 6)
        assert page.evaluate("() => window.interpTransformerViews.definitions") == 1
        styles = page.evaluate("() => document.querySelectorAll('style[data-itv-style]').length")
        assert styles == 1

        first, second = (f"#{ids[i]} > .itv-tokens .itv-token" for i in (0, 1))
        page.hover(f"{second}[data-pos='3']")
        expect_painted(page, second, other[0, 3].double().numpy(), scale)
        expect_painted(page, first, PATTERN[0, N - 1].double().numpy(), scale)  # the other view did not move

        page.select_option(f"#{ids[3]} select", "2")
        assert page.get_attribute(f"#{ids[3]}", "data-column") == "2"
        assert page.get_attribute(f"#{ids[2]}", "data-column") == "0"
        expect_painted(
            page, f"#{ids[3]} > .itv-tokens .itv-token", -VALUES[:, 2].double().numpy(), views[3].data["scales"][2]
        )

        page.click(f"#{ids[5]} .itv-thumb[data-head='1']")
        assert page.get_attribute(f"#{ids[5]} .itv-enlarged", "data-head") == "1"
        assert page.is_hidden(f"#{ids[4]} .itv-enlarged")
        assert_clean(opened)


def test_narrow_screen_wraps_without_a_page_wide_scrollbar(browser, tmp_path):
    tokens = [f" word{i}" for i in range(60)] + [" a_rather_long_token_without_any_break_in_it" * 3]
    n = len(tokens)
    pattern = causal_pattern(12, n)
    views = [attention_view(tokens, pattern), activation_view(tokens, torch.randn(n, 4)), pattern_grid(pattern, tokens)]
    with open_views(browser, tmp_path, views, "narrow", viewport=(360, 640)) as opened:
        page = opened.page
        ids = mounted_ids(page, 3)
        page.check(f"#{ids[0]} input[type=checkbox]")
        page.click(f"#{ids[2]} .itv-thumb[data-head='0']")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 360
        # The enlarged pattern is wider than the screen; it scrolls inside its own box.
        scroll = page.evaluate(
            f"() => {{ const s = document.querySelector('#{ids[2]} .itv-scroll'); "
            "return [s.scrollWidth, s.clientWidth]; }"
        )
        assert scroll[0] > scroll[1] and scroll[1] <= 360
        assert_clean(opened)


def test_the_reports_views_mount_once_scripted_and_show_the_models_pattern(browser, tmp_path, small_model):
    """In the report the views share one copy of the script (in the page head) and show the prompt's own patterns."""
    from analysis.report import build_report

    prompt = torch.tensor([0, 5, 9, 13, 7, 5, 9, 13, 7, 5])
    report = build_report(small_model, prompt, title="views in the report")
    path = report.save(tmp_path / "report.html")
    assert path.read_text(encoding="utf-8").count("definitions: (previous ? previous.definitions : 0) + 1") == 1
    layer, head = report["attention"].data.view_heads[0]
    expected = report["attention"].data.patterns[layer, head].double().numpy()
    with browser.open_page(path) as opened:
        page = opened.page
        roots = mounted_ids(page, 2)  # the attention view and the neuron view
        text = f"#{roots[0]} > .itv-tokens .itv-token"
        page.hover(f"{text}[data-pos='6']")
        expect_painted(page, text, expected[6], colours.sequential_scale(1.0))
        assert_clean(opened)

"""analysis.views at the Python level: input checks, the HTML and the data it embeds, the colour scales.

What the page does with the data is tested in the browser (tests/test_views_browser.py).
"""

import fnmatch
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.views import View, activation_view, attention_view, colours, library_script, page_html, pattern_grid
from analysis.views import view as view_module

TOKENS = ["<bos>", "When", " Mary", " and", " John", " went"]


def causal_pattern(n_heads: int, n_pos: int, seed: int = 0) -> torch.Tensor:
    scores = torch.randn(n_heads, n_pos, n_pos, generator=torch.Generator().manual_seed(seed))
    causal = torch.ones(n_pos, n_pos).tril().bool()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


class _Elements(HTMLParser):
    """Every start tag's name and attributes, and the text inside <script> elements."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._open_script = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._open_script = (dict(attrs), [])

    def handle_data(self, data):
        if self._open_script is not None:
            self._open_script[1].append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._open_script is not None:
            self.scripts.append((self._open_script[0], "".join(self._open_script[1])))
            self._open_script = None


def parse(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    parser.close()
    return parser


def embedded_data(html: str) -> list[dict]:
    return [json.loads(text) for attrs, text in parse(html).scripts if attrs.get("type") == "application/json"]


def all_views() -> list[View]:
    pattern = causal_pattern(3, len(TOKENS))
    values = torch.randn(len(TOKENS), 2, generator=torch.Generator().manual_seed(1))
    return [attention_view(TOKENS, pattern), activation_view(TOKENS, values, ["a", "b"]), pattern_grid(pattern, TOKENS)]


# --- the HTML is self-contained ---------------------------------------------------------------------------


@pytest.mark.parametrize("view", all_views(), ids=lambda v: v.kind)
def test_html_names_no_url_and_loads_nothing(view):
    for html in (view.to_html(), view.to_html(full_page=True), view._repr_html_()):
        elements = parse(html)
        loading = [
            (tag, attrs)
            for tag, attrs in elements.tags
            if {"src", "href"} & set(attrs) or tag in ("link", "iframe", "img")
        ]
        assert loading == []
        # No URL of any kind in scripts or styles: no fetch, import, @import, url(), font.
        assert not re.search(
            r"https?:|//[a-z]|url\(|@import|@font-face|import\(|fetch\(|XMLHttpRequest|WebSocket", html, re.I
        )


def test_the_data_round_trips_rounded_to_4_decimals():
    pattern = causal_pattern(2, len(TOKENS))
    (data,) = embedded_data(attention_view(TOKENS, pattern).to_html())
    assert data["kind"] == "attention" and data["tokens"] == TOKENS and data["heads"] == ["H0", "H1"]
    embedded = np.array(data["pattern"])
    assert embedded.shape == (2, len(TOKENS), len(TOKENS))
    np.testing.assert_allclose(embedded, pattern.double().numpy(), atol=5e-5, rtol=0)
    assert np.array_equal(embedded, np.round(pattern.double().numpy(), 4))
    assert data["initialToken"] == len(TOKENS) - 1 and data["initialHead"] == 0


def test_activation_values_keep_4_significant_digits_when_small():
    values = torch.tensor([1.234567e-5, -2.5e-6, 0.0])
    (data,) = embedded_data(activation_view(["a", "b", "c"], values).to_html())
    assert data["columns"] == [[1.235e-5, -2.5e-6, 0]]
    assert data["scales"][0]["min"] == -1.235e-5  # signed: diverging, symmetric about 0


def test_activation_scales_follow_the_sign_of_each_column():
    values = torch.tensor([[0.0, -2.0, 0.0], [3.0, 1.0, 0.0]])
    view = activation_view(["x", "y"], values, ["relu", "signed", "zero"])
    relu, signed, zero = view.data["scales"]
    assert (relu["min"], relu["max"], relu["stops"][0][1]) == (0.0, 3.0, [255, 255, 255])
    assert (signed["min"], signed["max"]) == (-2.0, 2.0)
    assert signed["stops"] == colours.scale(colours.DIVERGING, -1, 1)["stops"]
    assert (zero["min"], zero["max"]) == (0.0, 1.0)
    forced = activation_view(["x", "y"], values[:, [0]], signed=True).data["scales"][0]
    assert (forced["min"], forced["max"]) == (-3.0, 3.0)


def test_tokens_that_look_like_html_cannot_break_out():
    tokens = ["</script><script>alert(1)</script>", "<!--", " & ", "\u2028", "\n"]
    html = attention_view(tokens, torch.eye(5)).to_html()
    assert html.lower().count("</script>") == 2  # the data block's and the mount script's own
    assert "<!--" not in html
    (data,) = embedded_data(html)
    assert data["tokens"] == tokens
    assert "&lt;/script&gt;" in html  # the plain-text fallback is escaped too


def test_each_fragment_gets_unique_ids():
    view = all_views()[0]
    first, second = view.to_html(), view.to_html()
    ids = [attrs["id"] for html in (first, second) for tag, attrs in parse(html).tags if "id" in attrs]
    assert len(ids) == 2 and len(set(ids)) == 2


def test_a_fragment_carries_the_guarded_library_and_a_page_carries_it_once():
    views = all_views() * 2
    library = view_module.library_source()
    assert "if (!previous || previous.version !== " in library
    fragment = views[0].to_html()
    assert fragment.count(library) == 1
    assert library not in views[0].to_html(include_script=False)
    page = page_html(views, title="six views")
    assert page.count(library) == 1 and page.count('class="itv-view"') == 6
    assert page.startswith("<!DOCTYPE html>") and "<title>six views</title>" in page
    assert library_script() == f"<script>{library}</script>"


def test_save_writes_a_standalone_page(tmp_path):
    view = all_views()[2]
    path = view.save(tmp_path / "deep" / "grid.html", title="grid")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "<title>grid</title>" in text and view_module.library_source() in text
    assert len(embedded_data(text)) == 1


def test_page_size_stays_small():
    # 12 heads x 64 positions: the numbers, not the script, make up the page.
    view = attention_view([f" t{i}" for i in range(64)], causal_pattern(12, 64))
    html = view.to_html()
    assert len(html) < 12 * 64 * 64 * 7 + 40_000


def test_repr_says_what_it_shows():
    assert [repr(v) for v in all_views()] == [
        "<View attention: 3 heads over 6 tokens>",
        "<View activations: 2 columns over 6 tokens>",
        "<View grid: 3 heads over 6 tokens>",
    ]


def test_page_html_takes_views_only():
    with pytest.raises(TypeError, match="non-empty sequence of View"):
        page_html([])
    with pytest.raises(TypeError, match="str"):
        page_html(["<div>"])


# --- colour scales ---------------------------------------------------------------------------------------------


def test_sequential_scale_darkens_monotonically():
    # Lightness alone orders the values, whatever hues a reader can tell apart.
    lum = [colours.relative_luminance(colours.colour_of(v, colours.sequential_scale())) for v in np.linspace(0, 1, 101)]
    assert all(a > b for a, b in zip(lum, lum[1:]))
    assert lum[0] == pytest.approx(1.0)


def test_diverging_scale_is_white_at_zero_and_darkens_both_ways():
    scale = colours.diverging_scale(2.0)
    assert colours.colour_of(0.0, scale) == (255, 255, 255)
    negative = [colours.relative_luminance(colours.colour_of(-v, scale)) for v in np.linspace(0, 2, 51)]
    positive = [colours.relative_luminance(colours.colour_of(v, scale)) for v in np.linspace(0, 2, 51)]
    assert all(a > b for a, b in zip(negative, negative[1:]))
    assert all(a > b for a, b in zip(positive, positive[1:]))
    blue, orange = colours.colour_of(-2.0, scale), colours.colour_of(2.0, scale)
    assert blue[2] > blue[0] and orange[0] > orange[2]  # blue below zero, orange above: no red/green pair


def test_colour_of_clamps_and_interpolates():
    scale = colours.scale([(0.0, (0, 0, 0)), (1.0, (255, 100, 10))], 0.0, 2.0)
    assert colours.colour_of(1.0, scale) == (128, 50, 5)  # 127.5 rounds half up, like JavaScript's Math.round
    assert colours.colour_of(-5.0, scale) == (0, 0, 0) and colours.colour_of(9.0, scale) == (255, 100, 10)
    with pytest.raises(ValueError, match="vmin < vmax"):
        colours.scale(colours.SEQUENTIAL, 1.0, 1.0)


def test_text_stays_readable_on_every_background():
    # WCAG AA contrast (4.5:1) for the token text on every colour of both scales.
    def contrast(a, b):
        la, lb = sorted((colours.relative_luminance(a), colours.relative_luminance(b)), reverse=True)
        return (la + 0.05) / (lb + 0.05)

    for scale in (colours.sequential_scale(), colours.diverging_scale(1.0)):
        for v in np.linspace(scale["min"], scale["max"], 201):
            background = colours.colour_of(v, scale)
            text = (255, 255, 255) if colours.text_colour(background) == "#ffffff" else (0, 0, 0)
            assert contrast(background, text) >= 4.5, (v, background)


# --- bad input ---------------------------------------------------------------------------------------------


def test_a_batch_of_patterns_is_refused_with_how_to_pick_a_row():
    with pytest.raises(ValueError, match=r"\[batch, head_index, query_pos, key_pos\].*pattern\[0\]") as error:
        attention_view(TOKENS, causal_pattern(3, 6)[None].expand(2, 3, 6, 6))
    assert "(2, 3, 6, 6)" in str(error.value)
    with pytest.raises(ValueError, match=r"pattern\[0\]"):
        pattern_grid(causal_pattern(3, 6)[None], TOKENS)


def test_a_batch_of_values_is_refused_with_how_to_pick_a_row():
    with pytest.raises(ValueError, match=r"\[batch, pos, n\].*values\[0\]") as error:
        activation_view(TOKENS, torch.zeros(2, 6, 4))
    assert "(2, 6, 4)" in str(error.value)
    with pytest.raises(ValueError, match=r"values\.T.*values\[0\]"):
        activation_view(TOKENS, torch.zeros(1, 6))


def test_tokens_and_pattern_of_different_lengths():
    with pytest.raises(ValueError, match=r"got 5 tokens but a pattern over 6 positions \(shape \(3, 6, 6\)\)"):
        attention_view(TOKENS[:5], causal_pattern(3, 6))
    # [batch, query_pos, key_pos] of one head looks like heads: say it may be a batch axis.
    with pytest.raises(ValueError, match=r"batch axis.*pattern\[0\]"):
        attention_view(TOKENS[:2], causal_pattern(2, 6))


def test_tokens_and_values_of_different_lengths():
    with pytest.raises(ValueError, match=r"got 6 tokens but values of shape \(4,\): expected \[pos=6\]"):
        activation_view(TOKENS, torch.zeros(4))


def test_non_square_pattern():
    with pytest.raises(ValueError, match=r"square.*\(2, 6, 5\).*query_pos=6 and key_pos=5"):
        attention_view(TOKENS, torch.rand(2, 6, 5))
    with pytest.raises(ValueError, match="square"):
        pattern_grid(torch.rand(6, 5), TOKENS)


def test_nan_is_refused_with_its_index():
    values = torch.zeros(6, 3)
    values[4, 1] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"values must be finite, got 1 NaN or infinite entries of 18 \(the first at "
        r"index \[4, 1\]",
    ):
        activation_view(TOKENS, values)
    pattern = causal_pattern(2, 6)
    pattern[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"pattern must be finite.*\[1, 2, 0\]"):
        attention_view(TOKENS, pattern)


def test_scores_instead_of_a_pattern():
    scores = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(0)) * 5
    with pytest.raises(ValueError, match=r"weights in \[0, 1\].*hook_attn_scores"):
        attention_view(TOKENS, scores)


def test_names_of_the_wrong_count():
    with pytest.raises(ValueError, match=r"expected 3 column names \(one per column\), got 2"):
        activation_view(TOKENS, torch.zeros(6, 3), ["a", "b"])
    with pytest.raises(ValueError, match=r"expected 3 head names \(one per head\), got 4"):
        attention_view(TOKENS, causal_pattern(3, 6), ["a", "b", "c", "d"])
    with pytest.raises(ValueError, match=r"expected 3 head names"):
        pattern_grid(causal_pattern(3, 6), TOKENS, head_names=["L0H0"])
    with pytest.raises(TypeError, match="sequence of str"):
        activation_view(TOKENS, torch.zeros(6), names="neuron")


def test_tokens_must_be_a_list_of_str():
    with pytest.raises(TypeError, match=r"single str.*to_str_tokens"):
        attention_view("When Mary and", torch.eye(3))
    with pytest.raises(TypeError, match="to_str_tokens"):
        activation_view(torch.tensor([1, 2, 3]), torch.zeros(3))
    with pytest.raises(TypeError, match=r"non-str entries \(pos, type\): \[\(1, 'int'\)\]"):
        activation_view(["a", 7], torch.zeros(2))
    with pytest.raises(ValueError, match="at least one token"):
        pattern_grid(torch.zeros(0, 0), [])


def test_other_bad_arguments():
    with pytest.raises(ValueError, match=r"initial_head=3 is out of range for 3 heads"):
        attention_view(TOKENS, causal_pattern(3, 6), initial_head=3)
    with pytest.raises(TypeError, match="initial_token must be an int"):
        attention_view(TOKENS, causal_pattern(3, 6), initial_token=1.0)
    with pytest.raises(TypeError, match="complex"):
        activation_view(TOKENS, torch.zeros(6, dtype=torch.complex64))
    with pytest.raises(TypeError, match="torch.Tensor or numpy array"):
        activation_view(TOKENS, "0 1 2 3 4 5")
    with pytest.raises(ValueError, match="signed=False.*negatives"):
        activation_view(TOKENS, -torch.ones(6), signed=False)
    with pytest.raises(ValueError, match=r"\[pos\] or \[pos, n\].*shape \(\)"):
        activation_view(TOKENS, torch.tensor(1.0))


def test_numpy_and_lists_are_taken_too():
    pattern = causal_pattern(2, 6).numpy()
    assert (
        attention_view(TOKENS, pattern).data["pattern"]
        == attention_view(TOKENS, torch.from_numpy(pattern)).data["pattern"]
    )
    assert activation_view(["a", "b"], [1, -1]).data["columns"] == [[1, -1]]
    assert attention_view(TOKENS, torch.eye(6)).data["heads"] == ["H0"]  # one head's [query_pos, key_pos]


def test_every_static_file_is_package_data():
    # A file under static/ that pyproject's package-data misses would be absent from an installed package.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    static = Path(view_module.__file__).parent / "static"
    files = sorted(path.name for path in static.iterdir())
    assert {"core.js", "views.css"} <= set(files)
    assert [
        name for name in files if not any(fnmatch.fnmatch(f"static/{name}", p) for p in patterns["analysis.views"])
    ] == []

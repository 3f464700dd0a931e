"""Open a self-contained HTML file in headless Chromium and report what happened.

Used by tests that check our HTML reports the way a reader sees them: the
plotly figures really render, no script fails, and nothing is fetched from
the network (the report must work offline, with plotly.js embedded).

Import it from any test as ``from tests.browser import BrowserSession, check_html, require_browser``
(``tests`` is a package, and pytest puts the repository root on ``sys.path``).
``BrowserSession.open_page`` gives a loaded page to interact with (hover, click,
type) while the same console errors and requests are recorded.

Requirements, both optional so that importing this module never fails:

- a Chromium binary: Debian's ``chromium`` (``bash .ci/install_browser.sh``),
  or any binary named by the ``CHROMIUM_PATH`` environment variable;
- the Python package ``playwright`` (the ``dev`` extra). Only its driver is
  used, with ``executable_path`` pointing at the system Chromium; never run
  ``playwright install``, which downloads a browser build of its own.

Why Playwright: it reports console messages, uncaught page errors and every
request (including ones that fail) as events, and can block a request before
it reaches the network, with no separate chromedriver version to keep in step.
"""

import contextlib
import importlib.util
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Chromium as this machine's closed network needs it: without the
# background-networking flags it keeps trying (and failing) to reach Google.
# Playwright gives every launch a fresh, empty temporary profile directory,
# which is what a fresh ``--user-data-dir`` would do.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

# URL schemes that never leave the machine.
LOCAL_SCHEMES = frozenset({"file", "data", "blob", "about"})

# Divs written by plotly.io.to_html / write_html, and divs Plotly has drawn into.
PLOT_DIV_SELECTOR = ".plotly-graph-div, .js-plotly-plot"

_COUNT_PLOTS_JS = """
(selector) => {
    const divs = Array.from(document.querySelectorAll(selector));
    return {
        n_plots: divs.length,
        n_rendered_plots: divs.filter((d) => d.querySelector('.main-svg') !== null).length,
        n_plot_svgs: document.querySelectorAll('.main-svg').length,
        plotly_loaded: typeof window.Plotly !== 'undefined',
    };
}
"""

# Two animation frames: let the browser paint what Plotly has just laid out.
_TWO_FRAMES_JS = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"


@dataclass
class BrowserCheck:
    """What headless Chromium saw when it opened one HTML file.

    n_plots: plot divs on the page (``.plotly-graph-div`` or ``.js-plotly-plot``).
    n_rendered_plots: those of them that hold a plotly ``.main-svg``.
    n_plot_svgs: all ``.main-svg`` elements (plotly draws 2-3 per figure).
    console_errors: ``console.error`` messages, including Chromium's own
        "Failed to load resource" lines.
    page_errors: uncaught exceptions thrown by scripts on the page.
    external_requests: every URL the page asked for whose scheme is not
        file, data, blob or about. They are recorded and then aborted, so
        none of them reaches the network.
    timed_out: True when the plots had not all rendered within the timeout.
    """

    n_plot_svgs: int
    n_plots: int
    n_rendered_plots: int
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    title: str = ""
    screenshot_path: Path | None = None
    timed_out: bool = False


@dataclass
class OpenedPage:
    """A page opened by ``BrowserSession.open_page``, with what it has logged and asked for so far."""

    page: Any
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)


def find_chromium() -> str | None:
    """Path of a runnable Chromium, or None.

    ``CHROMIUM_PATH`` wins when set (and must then be executable); otherwise
    the first of ``chromium`` and ``chromium-browser`` on ``PATH``.
    """
    override = os.environ.get("CHROMIUM_PATH")
    if override:
        return override if os.access(override, os.X_OK) else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_browser() -> None:
    """Skip the calling test when Chromium or playwright is missing; fail instead when ``REQUIRE_BROWSER=1``.

    CI sets ``REQUIRE_BROWSER=1`` after ``.ci/install_browser.sh``, so a missing
    browser fails there instead of skipping quietly.
    """
    import pytest

    missing = None
    if find_chromium() is None:
        missing = "chromium not installed: run .ci/install_browser.sh"
    elif importlib.util.find_spec("playwright") is None:
        missing = "playwright not installed: pip install -e '.[dev]'"
    if missing is None:
        return
    if os.environ.get("REQUIRE_BROWSER") == "1":
        pytest.fail(missing + " (REQUIRE_BROWSER=1)")
    pytest.skip(missing)


def is_external(url: str) -> bool:
    """True when fetching ``url`` would leave the machine (any non-local scheme)."""
    return urlsplit(url).scheme.lower() not in LOCAL_SCHEMES


class BrowserSession:
    """One headless Chromium kept open for several checks (a browser start costs ~1-2 s).

    Each ``check_html`` call gets its own fresh browser context (no shared
    cookies, cache or storage), so checks cannot leak into each other::

        with BrowserSession() as browser:
            first = browser.check_html("a.html", "a.png")
            second = browser.check_html("b.html", "b.png")

    Raises RuntimeError on entry when no Chromium or no playwright package is
    available.
    """

    def __init__(self) -> None:
        self._playwright = None
        self._browser = None

    def __enter__(self) -> "BrowserSession":
        executable = find_chromium()
        if executable is None:
            raise RuntimeError("no Chromium found: run `bash .ci/install_browser.sh` or set CHROMIUM_PATH")
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as error:
            raise RuntimeError("the playwright package is missing: pip install -e '.[dev]'") from error
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=executable, args=list(CHROMIUM_ARGS), headless=True
            )
        except BaseException:
            self._playwright.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if self._browser is not None:
                self._browser.close()
        finally:
            if self._playwright is not None:
                self._playwright.stop()
            self._browser = self._playwright = None

    @contextlib.contextmanager
    def open_page(
        self,
        path: str | os.PathLike,
        viewport: tuple[int, int] = (1280, 800),
        timeout_s: float = 30,
    ) -> Iterator["OpenedPage"]:
        """Open ``path`` in a fresh context and yield it loaded, recording what ``BrowserCheck`` records.

        For tests that interact with a page (hover, click, type) and then assert on
        ``opened.console_errors``, ``opened.page_errors`` and ``opened.external_requests``.
        External requests are aborted before they reach the network. The context is
        closed on exit.
        """
        if self._browser is None:
            raise RuntimeError("BrowserSession is not open: use it as `with BrowserSession() as browser:`")
        html = Path(path).resolve()
        if not html.is_file():
            raise FileNotFoundError(f"expected an HTML file to open, got {str(html)!r}, which does not exist")
        opened = OpenedPage(page=None)

        def on_request(request) -> None:
            if is_external(request.url):
                opened.external_requests.append(request.url)

        def block_external(route) -> None:
            # Abort before DNS: the request is already recorded by on_request,
            # and the check stays fast and offline even on a machine with internet.
            if is_external(route.request.url):
                route.abort("blockedbyclient")
            else:
                route.continue_()

        width, height = viewport
        context = self._browser.new_context(viewport={"width": width, "height": height})
        try:
            context.on("request", on_request)
            context.route("**/*", block_external)
            page = opened.page = context.new_page()
            page.on("console", lambda msg: opened.console_errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda error: opened.page_errors.append(str(error)))
            page.on("websocket", on_request)
            page.goto(html.as_uri(), wait_until="load", timeout=timeout_s * 1000)
            yield opened
        finally:
            context.close()

    def check_html(
        self,
        path: str | os.PathLike,
        screenshot_path: str | os.PathLike,
        timeout_s: float = 30,
    ) -> BrowserCheck:
        """Open ``path``, wait for its plots, save a full-page PNG; see module ``check_html``."""
        screenshot = Path(screenshot_path)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        with self.open_page(path, timeout_s=timeout_s) as opened:
            page = opened.page
            deadline = time.monotonic() + timeout_s
            counts = page.evaluate(_COUNT_PLOTS_JS, PLOT_DIV_SELECTOR)
            # After "load" every inline script has run; rendering that has not
            # started by now will not start if Plotly is missing or a script threw.
            while counts["n_rendered_plots"] < counts["n_plots"] and counts["plotly_loaded"] and not opened.page_errors:
                if time.monotonic() > deadline:
                    break
                page.wait_for_timeout(50)
                counts = page.evaluate(_COUNT_PLOTS_JS, PLOT_DIV_SELECTOR)
            timed_out = counts["n_rendered_plots"] < counts["n_plots"] and time.monotonic() > deadline

            page.evaluate(_TWO_FRAMES_JS)
            page.screenshot(path=str(screenshot), full_page=True)
            title = page.title()

        return BrowserCheck(
            n_plot_svgs=counts["n_plot_svgs"],
            n_plots=counts["n_plots"],
            n_rendered_plots=counts["n_rendered_plots"],
            console_errors=opened.console_errors,
            page_errors=opened.page_errors,
            external_requests=opened.external_requests,
            title=title,
            screenshot_path=screenshot,
            timed_out=timed_out,
        )


def check_html(
    path: str | os.PathLike,
    screenshot_path: str | os.PathLike,
    timeout_s: float = 30,
) -> BrowserCheck:
    """Open ``path`` in headless Chromium, wait for its plots, save a full-page PNG.

    Waiting stops as soon as every plot div holds a ``.main-svg``, or when
    nothing more can render: plotly.js never loaded, or a script threw. It
    gives up after ``timeout_s`` seconds and says so in ``timed_out``; it does
    not raise, so a caller can assert on exactly what went wrong.

    Starts and stops its own browser; for several files, one
    ``BrowserSession`` is faster. It runs in a worker thread because
    Playwright's sync API refuses to start in a thread that already runs an
    event loop (an open ``BrowserSession``, or an async test).

    Raises FileNotFoundError for a missing HTML file and RuntimeError when no
    Chromium or no playwright package is available.
    """
    html = Path(path)
    if not html.is_file():
        raise FileNotFoundError(f"expected an HTML file to open, got {str(html)!r}, which does not exist")

    def run() -> BrowserCheck:
        with BrowserSession() as browser:
            return browser.check_html(html, screenshot_path, timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()

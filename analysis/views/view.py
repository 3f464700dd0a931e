"""``View``: one interactive view as self-contained HTML, for notebooks, pages and the report.

A view's HTML fragment is a ``<div>`` holding its data as JSON, and one
``<script>``. The script carries the shared library (``static/*.js`` and
``static/views.css``, written for this package, nothing fetched) inside a guard on
the global ``window.interpTransformerViews``: the first fragment on a page defines
it, every later one finds it and only asks it to mount its own ``<div>``. A page can
also carry the library once and fragments without it (``page_html``,
``to_html(include_script=False)`` with ``library_script()``).

Nothing in the HTML names a URL: no external script, style sheet or font, no request.
"""

import hashlib
import html
import json
import uuid
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path

GLOBAL_NAME = "interpTransformerViews"
PENDING_NAME = "interpTransformerViewsPending"
# Order matters: core.js defines the helpers the kinds use.
_SCRIPT_FILES = ("core.js", "attention.js", "activations.js", "grid.js", "circuit.js", "graph_view.js")
_STYLE_FILE = "views.css"

_PAGE_STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:1rem auto;"
    "max-width:64rem;padding:0 1rem;color:#111;background:#fff}"
)


def _static(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _script_safe_json(value) -> str:
    """JSON that cannot end its ``<script>`` element early, whatever strings it holds."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@lru_cache(maxsize=1)
def library_source() -> str:
    """The shared JavaScript of every view, guarded so that a page defines it only once.

    The guard compares a version (a hash of the sources), so a page that already
    holds an older library, e.g. a notebook after an upgrade, takes the new one.
    ``definitions`` counts how often a page ran a definition (1 on a page of one version).
    """
    body = "\n".join(_static(name) for name in _SCRIPT_FILES)
    css = _static(_STYLE_FILE)
    version = hashlib.sha256((body + css).encode("utf-8")).hexdigest()[:16]
    source = (
        "(function () {\n"
        f"var previous = window.{GLOBAL_NAME};\n"
        f'if (!previous || previous.version !== "{version}") {{\n'
        f'var lib = window.{GLOBAL_NAME} = {{version: "{version}", kinds: {{}}, '
        "definitions: (previous ? previous.definitions : 0) + 1};\n"
        f"(function (lib, CSS, PENDING_NAME) {{\n{body}\n}})(lib, {_script_safe_json(css)}, "
        f"{json.dumps(PENDING_NAME)});\n"
        "}\n"
        f"window.{GLOBAL_NAME}.mountPending();\n"
        "})();"
    )
    if "</script" in source.lower() or "<!--" in source:
        raise RuntimeError("the views' JavaScript must not contain '</script' or '<!--': it is inlined in HTML")
    return source


def library_script() -> str:
    """The ``<script>`` element with the shared library, for a page that embeds it once."""
    return f"<script>{library_source()}</script>"


class View:
    """An interactive view of text: ``_repr_html_`` for notebooks, ``to_html`` and ``save`` for pages.

    Made by ``attention_view``, ``activation_view`` and ``pattern_grid``; ``kind`` names
    which, ``data`` is what the page receives as JSON, ``fallback`` the plain text shown
    where scripts do not run (an untrusted notebook).
    """

    def __init__(self, kind: str, data: dict, fallback: str, description: str) -> None:
        self.kind = kind
        self.data = data
        self.fallback = fallback
        self.description = description

    def __repr__(self) -> str:
        return f"<View {self.kind}: {self.description}>"

    def to_html(self, full_page: bool = False, *, include_script: bool = True, title: str | None = None) -> str:
        """The view as HTML.

        ``full_page=False`` (the default) gives a fragment to place in a page or a
        notebook output: a ``<div>`` with a fresh unique id, its data, and a script
        that mounts it (with the shared library unless ``include_script=False``, for a
        page that holds ``library_script()`` once). ``full_page=True`` gives a whole
        standalone page; ``title`` is its ``<title>`` and heading.
        """
        if full_page:
            return page_html([self], title=title)
        element_id = f"itv-{uuid.uuid4().hex[:12]}"
        data = {**self.data, "kind": self.kind}
        library = (
            library_source() if include_script else f"if (window.{GLOBAL_NAME}) window.{GLOBAL_NAME}.mountPending();"
        )
        return (
            f'<div class="itv-view" id="{element_id}" data-itv-kind="{self.kind}">'
            '<div class="itv-fallback" '
            f'style="font-family:monospace;white-space:pre-wrap">{html.escape(self.fallback)}\n'
            "(This view is interactive when its script runs: trust the notebook, or open the saved page in a browser.)"
            "</div>"
            f'<script type="application/json" class="itv-data">{_script_safe_json(data)}</script>'
            f"</div><script>(window.{PENDING_NAME} = window.{PENDING_NAME} || []).push("
            f'{{id: "{element_id}", script: document.currentScript}});\n{library}</script>'
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def save(self, path: str | Path, title: str | None = None) -> Path:
        """Write a standalone HTML page with this view (parent directories are created); returns the path."""
        return save_page([self], path, title=title)


def page_html(views: Sequence[View], title: str | None = None) -> str:
    """A whole HTML page with ``views`` in order, the shared script embedded once in its head."""
    views = list(views)
    bad = [type(v).__name__ for v in views if not isinstance(v, View)]
    if bad or not views:
        raise TypeError(
            f"page_html takes a non-empty sequence of View, got {len(views)} items with non-View types {bad}"
        )
    title = title if title is not None else "; ".join(v.kind for v in views) + " view"
    fragments = "\n".join(view.to_html(include_script=False) for view in views)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_PAGE_STYLE}</style>\n{library_script()}\n</head>\n"
        f"<body><h1>{html.escape(title)}</h1>\n{fragments}\n</body></html>\n"
    )


def save_page(views: Sequence[View], path: str | Path, title: str | None = None) -> Path:
    """Write ``page_html(views, title)`` to ``path`` (parent directories are created); returns the path."""
    text = page_html(views, title=title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path

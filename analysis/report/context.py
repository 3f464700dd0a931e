"""What every report section reads and returns: the context of one prompt, the section, its typed data.

``ReportContext`` holds the model, the prompt and its full cache; each section builder
(``analysis.report.sections``) returns a ``ReportSection`` whose ``data`` is a small
dataclass of the numbers behind it (what tests and the written interpretation read:
``section.data.seq_len``, or ``section.data["seq_len"]``, as a dict would give it).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import plotly.graph_objects as go
from torch import Tensor

from interp_transformer import ActivationCache

from .. import _checks

MAX_PATTERN_CELLS = 2**22  # per-head views: at most this many numbers over all heads (a few MB of HTML)


@dataclass
class SectionData:
    """The numbers behind a section. Fields are typed; ``data["name"]`` and ``data.get`` read them too."""

    def __getitem__(self, key: str):
        names = [f.name for f in fields(self)]
        if key not in names:
            raise KeyError(f"{type(self).__name__} has no {key!r}; it has {names}")
        return getattr(self, key)

    def get(self, key: str, default=None):
        return getattr(self, key) if key in self.keys() else default

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]


@dataclass
class ReportSection:
    """One section of the report: prose, optional pre-rendered HTML, figures and the numbers behind them.

    ``paragraphs`` are plain text (escaped when rendered); ``html`` is trusted markup
    built by the section from escaped values (tables, token lists).
    """

    key: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    figures: list[go.Figure] = field(default_factory=list)
    data: SectionData | None = None
    html: str = ""


@dataclass
class ReportContext:
    """What every section reads: the model, the prompt ``tokens [1, pos]``, its labels and full cache.

    ``logits`` is the model's output on the prompt: next-token logits for a decoder, the
    hidden states (or MLM logits) for an encoder. ``eos`` is the token a bidirectional
    model's random detector sequences end with (``None`` for a causal one).
    ``sections`` fills in build order: later sections read earlier ones. For an encoder-decoder,
    ``tokens`` is the source, ``decoder_input [1, target_pos]`` the target the decoder read and
    ``target_str_tokens`` its labels.
    """

    model: _checks.AnyModel
    tokens: Tensor
    str_tokens: list[str]
    cache: ActivationCache
    logits: Tensor
    token_label: Callable[[int], str]
    bos: int | None
    metadata: dict = field(default_factory=dict)
    sections: dict = field(default_factory=dict)
    eos: int | None = None
    decoder_input: Tensor | None = None
    target_str_tokens: list[str] | None = None

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]

    def shown_positions(self) -> int:
        """How many leading positions the per-head views show: all, unless every head's ``pos x pos`` is too much."""
        n_heads = self.model.cfg.n_layers * self.model.cfg.n_heads
        return min(self.n_pos, math.isqrt(MAX_PATTERN_CELLS // n_heads))


# ---- names and figure sizes shared by the sections ---------------------------------------------


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def ranked_heads(scores: Tensor) -> list[tuple[int, int, float]]:
    """``(layer, head, score)`` for every head, highest score first."""
    n_heads = scores.shape[1]
    order = scores.flatten().argsort(descending=True).tolist()
    return [(i // n_heads, i % n_heads, float(scores.flatten()[i])) for i in order]


def sized(fig: go.Figure, height: int, width: int | None = None) -> go.Figure:
    fig.update_layout(height=height, width=width, margin=dict(l=60, r=20, t=70, b=50), title_font_size=14)
    return fig


def head_figure(fig: go.Figure, n_layers: int, n_heads: int, unit_range: bool = False) -> go.Figure:
    """Size a ``layer x head_index`` heatmap, tick every layer and head; ``unit_range`` fixes colours to [0, 1]."""
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(dtick=1)
    if unit_range:
        fig.update_traces(zmin=0.0, zmax=1.0)
    fig.update_layout(plot_bgcolor="white")
    return sized(fig, min(700, 170 + 30 * n_layers), min(1100, 260 + 40 * n_heads))


def square_figure(fig: go.Figure, n_rows: int) -> go.Figure:
    side = min(640, 160 + 18 * n_rows)
    fig.update_layout(plot_bgcolor="white")  # blank (NaN) cells stay white
    return sized(fig, side + 60, side + 150)


__all__ = [
    "MAX_PATTERN_CELLS",
    "ReportContext",
    "ReportSection",
    "SectionData",
    "head_figure",
    "head_name",
    "ranked_heads",
    "sized",
    "square_figure",
]

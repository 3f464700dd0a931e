"""Feature dashboards: what one SAE feature reads and writes, as numbers and as a self-contained HTML page.

``feature_dashboards(model, sae, corpus, features)`` reads the corpus once
(``read_features``), computes each feature's direct logit effect (``feature_logit_effect``,
when the model's logits are linear in its residual stream) and returns
``FeatureDashboards``: one ``FeatureDashboard`` per feature, holding

- the activation histogram (nonzero activations; the firing rate over every position read),
- the top-activating examples, each a window of tokens with the feature's activation on
  every token (shown by ``analysis.views.activation_view``),
- the tokens whose logits one unit of the feature raises and lowers most.

``dashboard.save(path)`` writes one page; ``dashboards.save(folder)`` writes a page per
feature and ``index.html`` linking them. Every page opens offline: plotly's JavaScript and
the views' script are embedded once in the page head, and nothing is fetched (no CDN, no
font). The page HTML is built in ``dashboard_html``.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go
from torch import Tensor

from interp_transformer.sae import SAE
from interp_transformer.sae.data import TokenBatches, TokenSource

from .. import _checks
from ..plots import plot_feature_histogram, plot_token_values
from ..views import View, activation_view
from .examples import PAD
from .logits import FeatureLogitEffect, feature_logit_effect, why_no_logit_effect
from .reading import FeatureReading, read_features


@dataclass
class Example:
    """One top activation: ``value`` at ``position`` of text ``text_index``; its window's tokens and activations."""

    value: float
    text_index: int
    position: int
    tokens: list[str]
    acts: list[float]
    hit: int  # index of the activating token within ``tokens``


@dataclass
class FeatureDashboard:
    """Everything one feature's page shows (module docstring)."""

    feature: int
    hook_name: str
    d_sae: int
    n_tokens: int
    firing_rate: float
    edges: list[float]
    counts: list[int]
    examples: list[Example]
    promoted: list[tuple[str, int, float]] = field(default_factory=list)  # (token, id, logit effect), largest first
    suppressed: list[tuple[str, int, float]] = field(default_factory=list)  # most negative first
    logits_note: str = ""  # why there is no logit effect, when there is none
    description: str = ""  # the corpus read

    @property
    def title(self) -> str:
        return f"Feature {self.feature} of the SAE at {self.hook_name}"

    @property
    def max_activation(self) -> float:
        return max((example.value for example in self.examples), default=0.0)

    def histogram_figure(self) -> go.Figure:
        return plot_feature_histogram(self.edges, self.counts, title=f"feature {self.feature}: nonzero activations")

    def logits_figure(self) -> go.Figure | None:
        if not self.promoted:
            return None
        rows = self.promoted + self.suppressed[::-1]
        return plot_token_values(
            [value for _, _, value in rows],
            [token for token, _, _ in rows],
            title=f"feature {self.feature}: direct logit effect per unit activation",
        )

    def views(self) -> list[View]:
        """One ``activation_view`` per example: the window coloured by the feature's activation."""
        return [activation_view(example.tokens, example.acts, [f"feature {self.feature}"]) for example in self.examples]

    def to_html(self, index_link: str | None = None) -> str:
        from .dashboard_html import feature_page

        return feature_page(self, index_link)

    def save(self, path: str | Path, index_link: str | None = None) -> Path:
        """Write the page (parent directories are created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_html(index_link), encoding="utf-8")
        return path


class FeatureDashboards:
    """The dashboards of several features, by feature number; ``save(folder)`` writes them and an index."""

    def __init__(self, dashboards: Sequence[FeatureDashboard]):
        self.dashboards = list(dashboards)

    def __len__(self) -> int:
        return len(self.dashboards)

    def __iter__(self):
        return iter(self.dashboards)

    def __getitem__(self, feature: int) -> FeatureDashboard:
        return _checks.find(self.dashboards, "feature", feature, f"no dashboard for feature {feature}; features", 20)

    @staticmethod
    def page_name(feature: int) -> str:
        return f"feature_{feature}.html"

    def index_html(self) -> str:
        from .dashboard_html import index_page

        return index_page(self.dashboards, self.page_name)

    def save(self, folder: str | Path) -> Path:
        """Write ``feature_<f>.html`` for each feature and ``index.html``; returns the index's path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for dashboard in self.dashboards:
            dashboard.save(folder / self.page_name(dashboard.feature), index_link="index.html")
        index = folder / "index.html"
        index.write_text(self.index_html(), encoding="utf-8")
        return index


def token_strings(model, ids: Sequence[int]) -> list[str]:
    """Each id as its text (``str(id)`` for a model without a tokenizer)."""
    if getattr(model, "tokenizer", None) is None:
        return [str(i) for i in ids]
    return [str(token) for token in model.to_str_tokens(list(ids))]


def _examples(model, reading: FeatureReading, row: int) -> list[Example]:
    found = reading.examples
    examples = []
    for j in range(found.values.shape[1]):
        value = float(found.values[row, j])
        if value == float("-inf") or value == 0.0:
            continue  # an unfilled slot, or a position where the feature is off
        window = found.window_tokens[row, j]
        inside = (window != PAD).nonzero()[:, 0]
        first, last = int(inside[0]), int(inside[-1])
        examples.append(
            Example(
                value=value,
                text_index=int(found.text_index[row, j]),
                position=int(found.position[row, j]),
                tokens=token_strings(model, window[first : last + 1].tolist()),
                acts=found.window_acts[row, j, first : last + 1].tolist(),
                hit=found.left - first,
            )
        )
    return examples


def build_dashboards(
    model: _checks.AnyModel,
    sae: SAE,
    reading: FeatureReading,
    effect: FeatureLogitEffect | None = None,
    logits_note: str = "",
) -> FeatureDashboards:
    """Dashboards from a ``read_features`` result and (optionally) ``feature_logit_effect`` of the same features."""
    dashboards = []
    histograms = reading.histograms
    for row, feature in enumerate(reading.examples.features.tolist()):
        dashboard = FeatureDashboard(
            feature=feature,
            hook_name=reading.hook_name,
            d_sae=sae.d_sae,
            n_tokens=reading.n_tokens,
            firing_rate=float(histograms.firing_rate[row]),
            edges=histograms.edges[row].tolist(),
            counts=histograms.counts[row].tolist(),
            examples=_examples(model, reading, row),
            logits_note=logits_note or "",
            description=reading.description,
        )
        if effect is not None:
            at = int((effect.features == feature).nonzero()[0, 0])
            pairs = [
                (effect.top_tokens[at], effect.top_values[at]),
                (effect.bottom_tokens[at], effect.bottom_values[at]),
            ]
            dashboard.promoted, dashboard.suppressed = [
                list(zip(token_strings(model, ids.tolist()), ids.tolist(), values.tolist())) for ids, values in pairs
            ]
        dashboards.append(dashboard)
    return FeatureDashboards(dashboards)


def feature_dashboards(
    model: _checks.AnyModel,
    sae: SAE,
    source: TokenBatches | TokenSource,
    features: None | int | Sequence[int] | Tensor = None,
    *,
    n_logits: int = 10,
    progress: bool = True,
    **read_options,
) -> FeatureDashboards:
    """Read ``source`` once (``read_features(..., **read_options)``) and build each feature's dashboard."""
    reading = read_features(model, sae, source, features, progress=progress, **read_options)
    effect, note = None, why_no_logit_effect(model, sae)
    if note is None:
        effect = feature_logit_effect(model, sae, reading.examples.features, k=min(n_logits, model.cfg.d_vocab))
    return build_dashboards(model, sae, reading, effect, note)


__all__ = [
    "Example",
    "FeatureDashboard",
    "FeatureDashboards",
    "build_dashboards",
    "feature_dashboards",
    "token_strings",
]

"""Colour scales of the views, defined once here and handed to the browser as data.

Both scales change lightness monotonically away from their low (sequential) or
central (diverging) end, so a reader who cannot tell hues apart still reads the
order from lightness alone, and they avoid the red/green pair that the common
colour-vision deficiencies (deuteranopia, protanopia) confuse:

- ``SEQUENTIAL``: white at 0, then the viridis hues (yellow, green, teal, blue,
  purple) growing darker. For attention weights and other values >= 0.
- ``DIVERGING``: blue below zero, white at zero, orange above. For signed values,
  with the range made symmetric so that white always means exactly 0.

A scale is a list of ``(t, (r, g, b))`` stops with ``t`` rising from 0 to 1; a value
``v`` on a scale spanning ``[vmin, vmax]`` sits at ``t = (v - vmin) / (vmax - vmin)``
(clamped to ``[0, 1]``) and its colour is the per-channel linear interpolation
between the two stops around ``t``, rounded half up. ``views/static/core.js`` does
the same arithmetic on the same stops, so a colour in the page can be checked
against ``colour_of`` here.
"""

import math
from collections.abc import Sequence

RGB = tuple[int, int, int]
Stops = Sequence[tuple[float, RGB]]

SEQUENTIAL: list[tuple[float, RGB]] = [
    (0.0, (255, 255, 255)),
    (0.2, (253, 231, 37)),
    (0.4, (94, 201, 98)),
    (0.6, (33, 145, 140)),
    (0.8, (59, 82, 139)),
    (1.0, (68, 1, 84)),
]

DIVERGING: list[tuple[float, RGB]] = [
    (0.0, (33, 102, 172)),
    (0.25, (146, 197, 222)),
    (0.5, (255, 255, 255)),
    (0.75, (253, 184, 99)),
    (1.0, (179, 88, 6)),
]


def scale(stops: Stops, vmin: float, vmax: float) -> dict:
    """A scale as the page reads it: ``{"stops": [[t, [r, g, b]], ...], "min": vmin, "max": vmax}``."""
    if not vmax > vmin:
        raise ValueError(f"a colour scale needs vmin < vmax, got vmin={vmin}, vmax={vmax}")
    return {"stops": [[t, list(rgb)] for t, rgb in stops], "min": vmin, "max": vmax}


def sequential_scale(vmax: float = 1.0) -> dict:
    """``SEQUENTIAL`` over ``[0, vmax]``."""
    return scale(SEQUENTIAL, 0.0, vmax)


def diverging_scale(vmax: float) -> dict:
    """``DIVERGING`` over ``[-vmax, vmax]``: white is exactly 0."""
    return scale(DIVERGING, -vmax, vmax)


def _round_half_up(x: float) -> int:
    # JavaScript's Math.round: Python's round() would round 0.5 to even.
    return int(math.floor(x + 0.5))


def colour_of(value: float, scale_: dict) -> RGB:
    """The ``(r, g, b)`` the page paints for ``value`` on ``scale_`` (a dict from ``scale``).

    >>> colour_of(0.0, sequential_scale()), colour_of(1.0, sequential_scale())
    ((255, 255, 255), (68, 1, 84))
    >>> colour_of(0.0, diverging_scale(3.0))
    (255, 255, 255)
    """
    vmin, vmax, stops = scale_["min"], scale_["max"], scale_["stops"]
    t = min(1.0, max(0.0, (value - vmin) / (vmax - vmin)))
    for (t0, rgb0), (t1, rgb1) in zip(stops, stops[1:]):
        if t <= t1:
            f = 0.0 if t1 == t0 else (t - t0) / (t1 - t0)
            return tuple(_round_half_up(c0 + (c1 - c0) * f) for c0, c1 in zip(rgb0, rgb1))  # type: ignore[return-value]
    return tuple(stops[-1][1])  # type: ignore[return-value]


def relative_luminance(rgb: Sequence[int]) -> float:
    """WCAG relative luminance of an sRGB colour, in ``[0, 1]`` (0 black, 1 white)."""

    def linear(channel: int) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# Below this luminance, white text has more contrast than black text (WCAG contrast ratios cross here).
DARK_BACKGROUND = 0.179


def text_colour(rgb: Sequence[int]) -> str:
    """The text colour the page uses on a background ``rgb``: white on dark colours, black otherwise."""
    return "#ffffff" if relative_luminance(rgb) < DARK_BACKGROUND else "#000000"

"""How an SAE normalizes its input, and undoes that on its reconstruction (SAELens' modes).

``normalize(mode, x)`` returns the normalized input and the statistics that
``denormalize(mode, y, stats)`` needs to map a reconstruction back; both work
over the last axis (``d_in``) of ``x [..., d_in]``:

=============================  =====================================================  ==========================
mode                           input                                                  reconstruction
=============================  =====================================================  ==========================
``none``                       ``x``                                                  ``y``
``expected_average_only_in``   ``x`` (see below)                                      ``y``
``constant_norm_rescale``      ``x * c`` with ``c = sqrt(d_in) / |x|``                 ``y / c``
``layer_norm``                 ``(x - mu) / (sigma + 1e-5)``, ``mu`` the mean and     ``y * sigma + mu``
                               ``sigma`` the *unbiased* standard deviation of ``x``
=============================  =====================================================  ==========================

``expected_average_only_in``: the SAE was trained on activations multiplied by
one constant (so that their average norm was ``sqrt(d_in)``). SAELens folds that
constant into the weights when it knows it (``fold_activation_norm_scaling_factor``
when loading a release from its registry, or at the end of training) and
otherwise runs the SAE on the unscaled input; so does this module. If you know
the constant, call ``SAE.fold_activation_norm_scaling_factor(c)``.

Transcoders normalize their input but, as in SAELens, never denormalize their
output (it lives at another hook).
"""

from typing import NamedTuple

from torch import Tensor

LAYER_NORM_EPS = 1e-5  # SAELens' run_time_activation_ln_in default


class InputStats(NamedTuple):
    """What ``denormalize`` needs from the input: ``scale`` and ``shift``, each ``[..., 1]``.

    ``constant_norm_rescale`` keeps ``c`` in ``scale``; ``layer_norm`` keeps
    ``sigma`` in ``scale`` and ``mu`` in ``shift``.
    """

    scale: Tensor
    shift: Tensor | None = None

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.scale.shape[:-1])


def needs_stats(mode: str) -> bool:
    """True when decoding in this mode needs the statistics of the input."""
    return mode in ("constant_norm_rescale", "layer_norm")


def normalize(mode: str, x: Tensor) -> tuple[Tensor, InputStats | None]:
    """``x [..., d_in]`` normalized as ``mode`` says, and the statistics to undo it (see the module docstring)."""
    if mode == "constant_norm_rescale":
        coefficient = x.shape[-1] ** 0.5 / x.norm(dim=-1, keepdim=True)
        return x * coefficient, InputStats(coefficient)
    if mode == "layer_norm":
        mu = x.mean(dim=-1, keepdim=True)
        centred = x - mu
        sigma = centred.std(dim=-1, keepdim=True)
        return centred / (sigma + LAYER_NORM_EPS), InputStats(sigma, mu)
    return x, None


def denormalize(mode: str, y: Tensor, stats: InputStats | None) -> Tensor:
    """Map a reconstruction ``y [..., d_in]`` back to the input's scale (``mode`` as in ``normalize``)."""
    if not needs_stats(mode):
        return y
    if stats is None:
        raise ValueError(
            f"decoding with normalize_activations={mode!r} needs the statistics of the encoded input: "
            "call encode(x) right before decode(feature_acts), or use forward(x)"
        )
    if stats.batch_shape != tuple(y.shape[:-1]):
        raise ValueError(
            f"decode got feature activations for batch shape {tuple(y.shape[:-1])}, but the last encode(x) was "
            f"for batch shape {stats.batch_shape}; with normalize_activations={mode!r} decoding reuses the "
            "statistics of that input"
        )
    if mode == "constant_norm_rescale":
        return y / stats.scale
    if stats.shift is None:  # layer_norm's statistics always carry the mean
        raise ValueError(f"decoding with normalize_activations={mode!r} needs the input's mean, got none")
    return y * stats.scale + stats.shift


def denormalize_affine(mode: str, stats: InputStats | None) -> tuple[Tensor | None, Tensor | None]:
    """``(multiplier, shift)`` with ``denormalize(mode, y, stats) == y * multiplier + shift``; ``None`` stands for 1 and
    0.

    Denormalizing is affine in ``y``: what lets a reconstruction be split into one
    term per feature plus a bias (``SAE.decode_affine``). Each is ``[..., 1]``.
    """
    if not needs_stats(mode):
        return None, None
    if stats is None:
        raise ValueError(
            f"normalize_activations={mode!r} needs the statistics of the encoded input (encode_with_state)"
        )
    if mode == "constant_norm_rescale":
        return 1 / stats.scale, None
    return stats.scale, stats.shift


__all__ = ["InputStats", "LAYER_NORM_EPS", "denormalize", "denormalize_affine", "needs_stats", "normalize"]

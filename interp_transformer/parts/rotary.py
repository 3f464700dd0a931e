"""Rotary positions (RoPE): each head's queries and keys are rotated by an angle proportional to their position.

The first ``rotary_dim`` dimensions of a head are taken as ``rotary_dim / 2`` pairs;
pair ``i`` at position ``p`` is rotated by the angle ``p * inv_freq[i]``, with
``inv_freq[i] = base^(-2i / rotary_dim)`` (then rescaled by ``scaling``, if any). A
query at ``p`` and a key at ``p'`` rotated this way have a dot product that depends on
their positions only through ``p - p'``. The remaining ``d_head - rotary_dim`` dimensions
(partial rotary) pass unchanged.

Two conventions pair the dimensions differently; both are the same rotation of a
differently ordered vector:

===============  ==========================================================  =====================
``interleaved``  pairs                                                       used by
===============  ==========================================================  =====================
False            ``(i, i + rotary_dim/2)``: the two halves ("rotate_half")  Llama, Mistral, Qwen, GPT-NeoX
True             ``(2i, 2i + 1)``: adjacent dimensions ("rotate every two")  GPT-J, llama.cpp
===============  ==========================================================  =====================

For each pair ``(a, b)`` with angle ``t``: ``(a, b) -> (a cos t - b sin t, b cos t + a sin t)``.

LongRoPE (Phi-3, ``RopeScaling("longrope", ...)``) keeps two sets of frequencies,
``inv_freq[i] = base^(-2i / rotary_dim) / ext[i]`` with ``ext`` its ``short_factor`` or its
``long_factor``, and multiplies every cos and sin by its ``attention_factor`` (so the
rotated dimensions of q and k both grow by it, their scores by its square). Which set a
row uses is decided by its length: the short one while the row holds at most
``original_max_position_embeddings`` positions, the long one for every position of a longer
row. A key/value cache filled with the short set is therefore stale once its rows grow past
that length: ``length_thresholds()`` gives the lengths where this happens, a model refuses
such a cache, and ``generate`` runs the whole sequence again at that step, as Hugging Face's
Phi-3 does.

Precision. The angles and their cos/sin are computed in float32 whatever the model's
dtype, in the same operations as Hugging Face's rotary embedding, and only then cast to
the activations' dtype: this is what the checkpoints were trained and are run with, so
a float64 copy of the model still matches Hugging Face's float64 run to float64 rounding.
The frequencies are therefore a plain float32 tensor, not a buffer: casting the model or
building it on the meta device must not touch them.
"""

import math
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts.yarn import yarn_attention_factor, yarn_frequencies

ROPE_SCALING_TYPES = ("linear", "llama3", "longrope", "yarn")


def _is_positive_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class RopeScaling:
    """How the rotary frequencies are stretched for contexts longer than the pretraining one.

    ``"linear"`` (position interpolation): every frequency divided by ``factor``.
    ``"llama3"`` (Llama 3.1): wavelengths shorter than ``original_max_position_embeddings
    / high_freq_factor`` kept, longer than ``original_max_position_embeddings /
    low_freq_factor`` divided by ``factor``, and smoothly interpolated in between.
    ``"longrope"`` (Phi-3): frequency ``i`` divided by ``short_factor[i]`` for rows of at most
    ``original_max_position_embeddings`` positions, by ``long_factor[i]`` for longer rows, and
    cos and sin multiplied by ``cos_sin_scale()`` (see the module docstring).
    ``"yarn"`` (gpt-oss): low frequencies divided by ``factor``, high ones kept, a ramp between set by
    ``beta_fast`` and ``beta_slow``, and cos and sin multiplied by ``cos_sin_scale()``
    (``components.yarn``).
    """

    kind: str  # "linear", "llama3", "longrope" or "yarn"
    factor: float  # how many times longer the context is than in pretraining
    low_freq_factor: float = 1.0  # llama3 only: wavelengths above original / low_freq_factor are fully scaled
    high_freq_factor: float = 4.0  # llama3 only: wavelengths below original / high_freq_factor are kept
    original_max_position_embeddings: int = 8192  # llama3, longrope and yarn: the pretraining context
    short_factor: tuple[float, ...] = ()  # longrope only: one divisor per frequency, rows up to the original context
    long_factor: tuple[float, ...] = ()  # longrope only: one divisor per frequency, rows longer than it
    attention_factor: float | None = None  # longrope and yarn: multiplies cos and sin (None: from factor, see below)
    beta_fast: float = 32.0  # yarn only: pairs turning more than this often over the original context are kept
    beta_slow: float = 1.0  # yarn only: pairs turning less than this often are divided by factor
    truncate: bool = True  # yarn only: the ramp's ends rounded outwards to whole pairs

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALING_TYPES:
            raise ValueError(f"rope scaling kind must be one of {ROPE_SCALING_TYPES}, got {self.kind!r}")
        for field in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"rope scaling {field} must be a number > 0, got {value!r}")
        self._check_longrope_fields()
        self._check_yarn_fields()
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                "llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
                f"high_freq_factor={self.high_freq_factor} "
                f"and low_freq_factor={self.low_freq_factor}"
            )
        value = self.original_max_position_embeddings
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"rope scaling original_max_position_embeddings must be a positive int, got {value!r}")

    def _check_longrope_fields(self) -> None:
        longrope_fields = ("short_factor", "long_factor") + (() if self.kind == "yarn" else ("attention_factor",))
        if self.kind != "longrope":
            given = [field for field in longrope_fields if getattr(self, field) not in ((), None)]
            if given:
                raise ValueError(f"rope scaling {given} belong to kind 'longrope', got kind {self.kind!r}")
            return
        for field in ("short_factor", "long_factor"):
            value = getattr(self, field)
            if not isinstance(value, tuple) or not value or not all(_is_positive_number(x) for x in value):
                raise ValueError(f"longrope {field} must be a non-empty tuple of finite numbers > 0, got {value!r}")
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                f"longrope short_factor and long_factor need one entry per frequency each, got "
                f"{len(self.short_factor)} and {len(self.long_factor)}"
            )
        if self.attention_factor is not None and not _is_positive_number(self.attention_factor):
            raise ValueError(
                f"longrope attention_factor must be a finite number > 0 or None, got {self.attention_factor!r}"
            )

    def _check_yarn_fields(self) -> None:
        defaults = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
        if self.kind != "yarn":
            given = [field for field, default in defaults.items() if getattr(self, field) != default]
            if given:
                raise ValueError(f"rope scaling {given} belong to kind 'yarn', got kind {self.kind!r}")
            return
        for field in ("beta_fast", "beta_slow") + (("attention_factor",) if self.attention_factor is not None else ()):
            if not _is_positive_number(getattr(self, field)):
                raise ValueError(f"yarn {field} must be a finite number > 0, got {getattr(self, field)!r}")
        if not isinstance(self.truncate, bool):
            raise TypeError(f"yarn truncate must be a bool, got {self.truncate!r}")

    def cos_sin_scale(self) -> float:
        """What cos and sin are multiplied by: LongRoPE's or YaRN's ``attention_factor``, 1 for the other kinds.

        An ``attention_factor`` of None is Hugging Face's default: ``sqrt(1 + ln(factor) /
        ln(original_max_position_embeddings))`` for LongRoPE, ``0.1 ln(factor) + 1`` for YaRN,
        or 1 when ``factor <= 1``.
        """
        if self.kind == "yarn":
            return yarn_attention_factor(self.factor, self.attention_factor)
        if self.kind != "longrope":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings))


def rotary_frequencies(rotary_dim: int, base: float, scaling: RopeScaling | None = None) -> Float[Tensor, "half"]:
    """``inv_freq [rotary_dim / 2]`` in float32: ``base^(-2i / rotary_dim)``, rescaled by ``scaling``.

    Written in the same float32 operations as Hugging Face's ``compute_default_rope_parameters``
    and ``_compute_llama3_parameters``, so the frequencies agree bit for bit.
    """
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    if scaling is not None and scaling.kind == "longrope":  # the short set; long_rope_frequencies gives the long one
        return 1.0 / (torch.tensor(scaling.short_factor, dtype=torch.float32, device="cpu") * base**exponents)
    if scaling is not None and scaling.kind == "yarn":
        return yarn_frequencies(rotary_dim, base, scaling)
    inv_freq = 1.0 / (base**exponents)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelength = old_context / scaling.low_freq_factor
    high_freq_wavelength = old_context / scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelength < high_freq_wavelength) * ~(wavelength > low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled)


def long_rope_frequencies(rotary_dim: int, base: float, scaling: RopeScaling) -> Float[Tensor, "half"]:
    """LongRoPE's long set, ``1 / (long_factor[i] * base^(2i / rotary_dim))`` in float32 (Hugging Face's
    ``_compute_longrope_parameters`` for a sequence longer than the original context)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    return 1.0 / (torch.tensor(scaling.long_factor, dtype=torch.float32, device="cpu") * base**exponents)


class Rotary(nn.Module):
    """Rotates the first ``rotary_dim`` dimensions of every head by its position (see the module docstring).

    ``forward(x, positions)`` takes queries or keys ``[batch, pos, head_index, d_head]`` and
    their position ids ``[batch, pos]`` (an attention reads them from its ``TokenLayout``, so
    a key/value cache offset and left padding are accounted for) and returns them rotated.
    No parameters and no hooks: the attention that holds it hooks the rotated q and k.
    """

    def __init__(
        self,
        d_head: int,
        rotary_dim: int | None = None,
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: RopeScaling | None = None,
    ):
        super().__init__()
        rotary_dim = d_head if rotary_dim is None else rotary_dim
        if (
            isinstance(rotary_dim, bool)
            or not isinstance(rotary_dim, int)
            or not 0 < rotary_dim <= d_head
            or rotary_dim % 2
        ):
            raise ValueError(f"rotary_dim must be an even int in [2, d_head={d_head}], got {rotary_dim!r}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"rotary base must be a number > 1, got {base!r}")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling or None, got {type(scaling).__name__}")
        if scaling is not None and scaling.kind == "longrope" and len(scaling.short_factor) != rotary_dim // 2:
            raise ValueError(
                f"longrope short_factor and long_factor need rotary_dim/2={rotary_dim // 2} entries (one per "
                f"frequency), got {len(scaling.short_factor)}"
            )
        self.d_head, self.rotary_dim, self.base = d_head, rotary_dim, float(base)
        self.interleaved, self.scaling = bool(interleaved), scaling
        self.inv_freq = rotary_frequencies(rotary_dim, self.base, scaling)  # float32, not a buffer (module docstring)
        long_rope = scaling is not None and scaling.kind == "longrope"
        self.long_inv_freq = (
            long_rope_frequencies(rotary_dim, self.base, scaling) if scaling is not None and long_rope else None
        )
        self.cos_sin_scale = 1.0 if scaling is None else scaling.cos_sin_scale()

    def length_thresholds(self) -> tuple[int, ...]:
        """Row lengths above which every position rotates differently (LongRoPE's original context; else none).

        Keys rotated while a row was no longer than a threshold are stale once it grows past it.
        """
        # long_inv_freq is set only with a (LongRoPE) scaling
        return (
            ()
            if self.long_inv_freq is None or self.scaling is None
            else (self.scaling.original_max_position_embeddings,)
        )

    def frequencies(self, positions: Int[Tensor, "batch pos"]) -> Tensor:
        """``inv_freq`` as ``[half]``, or per row ``[batch, 1, half]`` for LongRoPE (long where the row is longer than
        the original context: its largest position + 1, the cached positions included)."""
        inv_freq = self.inv_freq.to(positions.device)
        if self.long_inv_freq is None or self.scaling is None:  # set only with a (LongRoPE) scaling
            return inv_freq
        row_length = positions.max(dim=-1).values + 1
        is_long = (row_length > self.scaling.original_max_position_embeddings)[:, None, None]
        return torch.where(is_long, self.long_inv_freq.to(positions.device), inv_freq)

    def cos_sin(self, positions: Int[Tensor, "batch pos"], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` of every angle, ``[batch, pos, rotary_dim]`` in ``dtype``, laid out like the pairs.

        Entry ``j`` holds the angle of the pair dimension ``j`` belongs to: pair ``j mod
        rotary_dim/2`` for the half split, pair ``j // 2`` when interleaved. Both are multiplied
        by ``cos_sin_scale`` (LongRoPE's or YaRN's attention factor; 1 otherwise).
        """
        angles = positions[..., None].float() * self.frequencies(positions)
        if self.interleaved:
            angles = einops.repeat(angles, "batch pos pair -> batch pos (pair two)", two=2)
        else:
            angles = torch.cat((angles, angles), dim=-1)  # [first half | second half]
        cos, sin = angles.cos(), angles.sin()
        if self.cos_sin_scale != 1.0:  # the attention factor, applied in float32 as Hugging Face does
            cos, sin = cos * self.cos_sin_scale, sin * self.cos_sin_scale
        return cos.to(dtype), sin.to(dtype)

    def rotate_pairs(self, x: Float[Tensor, "... rotary_dim"]) -> Float[Tensor, "... rotary_dim"]:
        """``(a, b) -> (-b, a)`` for every pair: what ``sin`` multiplies in ``x cos + rotate_pairs(x) sin``."""
        if self.interleaved:
            pairs = einops.rearrange(x, "... (pair two) -> ... pair two", two=2)
            rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1)
            return einops.rearrange(rotated, "... pair two -> ... (pair two)")
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)

    @shape_checked
    def forward(
        self, x: Float[Tensor, "batch pos head_index d_head"], positions: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "batch pos head_index d_head"]:
        cos, sin = (
            einops.rearrange(t, "batch pos rotary_dim -> batch pos 1 rotary_dim")
            for t in self.cos_sin(positions, x.dtype)
        )
        rotated, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        rotated = rotated * cos + self.rotate_pairs(rotated) * sin
        return torch.cat((rotated, passed), dim=-1) if passed.shape[-1] else rotated

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling}" if self.scaling is not None else ""
        dims = f"rotary_dim={self.rotary_dim}, d_head={self.d_head}"
        return f"{dims}, base={self.base}, interleaved={self.interleaved}{scaling}"


__all__ = ["ROPE_SCALING_TYPES", "RopeScaling", "Rotary", "long_rope_frequencies", "rotary_frequencies"]

"""SAE architectures as parts: which tensors each holds, and how each turns an input into features.

Every architecture computes, from the (normalized, centred) input ``sae_in [..., d_in]``,

=====================  ====================================================================
``standard``           ``pre = sae_in W_enc + b_enc``, ``acts = relu(pre)``
``topk``               ``acts`` = ``relu(pre)`` on the ``k`` largest entries of ``pre`` per
                       position, 0 elsewhere (with ``rescale_acts_by_decoder_norm`` the
                       ranking uses ``pre * |W_dec[f]|``, and decoding divides by it again)
``abstopk``            the ``k`` entries of largest ``|pre|`` keep their signed value
``jumprelu``           ``acts = relu(pre) * (pre > threshold)``
``gated``              ``pre = sae_in (W_enc * exp(r_mag)) + b_mag`` (the magnitude path),
                       ``acts = (sae_in W_enc + b_gate > 0) * relu(pre)``
``transcoder``         as ``standard``, but decoding writes ``d_out`` wide, at another hook
``skip_transcoder``    a transcoder plus ``x W_skip^T`` (``W_skip [d_out, d_in]``)
``jumprelu_transcoder``  a transcoder with the JumpReLU activation
``jumprelu_skip_transcoder``  both
=====================  ====================================================================

``pre`` is what ``hook_sae_acts_pre`` sees, ``acts`` what ``hook_sae_acts_post``
sees. Every architecture decodes ``acts W_dec + b_dec``. The math and its
order of operations follow SAELens 6 (``sae_lens/saes/*.py``).

A new architecture is an encoder function and one ``ARCHITECTURES`` entry.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp_transformer.core.shape_checks import shape_checked

# Shape of every tensor an architecture may hold, in named axes.
PARAMETER_AXES: dict[str, tuple[str, ...]] = {
    "W_enc": ("d_in", "d_sae"),
    "b_enc": ("d_sae",),
    "b_gate": ("d_sae",),
    "r_mag": ("d_sae",),
    "b_mag": ("d_sae",),
    "threshold": ("d_sae",),
    "W_dec": ("d_sae", "d_out"),
    "b_dec": ("d_out",),
    "W_skip": ("d_out", "d_in"),
}

HookFn = Callable[[Tensor], Tensor]  # applies (or skips) hook_sae_acts_pre


@shape_checked
def linear(
    x: Float[Tensor, "*batch d_in"], W: Float[Tensor, "d_in d_out"], b: Float[Tensor, "d_out"]
) -> Float[Tensor, "*batch d_out"]:
    """``x W + b`` over the last axis (``@``, the product SAELens uses, so results match it bit for bit)."""
    return x @ W + b


def encode_relu(sae, sae_in: Tensor, hook_pre: HookFn) -> Tensor:
    hidden_pre = hook_pre(linear(sae_in, sae.W_enc, sae.b_enc))
    return hidden_pre.relu()


def encode_jumprelu(sae, sae_in: Tensor, hook_pre: HookFn) -> Tensor:
    hidden_pre = hook_pre(linear(sae_in, sae.W_enc, sae.b_enc))
    return hidden_pre.relu() * (hidden_pre > sae.threshold).to(hidden_pre.dtype)


def _ranked_pre(sae, sae_in: Tensor, hook_pre: HookFn) -> Tensor:
    hidden_pre = hook_pre(linear(sae_in, sae.W_enc, sae.b_enc))
    if sae.cfg.rescale_acts_by_decoder_norm:
        hidden_pre = hidden_pre * sae.W_dec.norm(dim=-1)
    return hidden_pre


def encode_topk(sae, sae_in: Tensor, hook_pre: HookFn) -> Tensor:
    hidden_pre = _ranked_pre(sae, sae_in, hook_pre)
    values, indices = torch.topk(hidden_pre, k=sae.cfg.k, dim=-1, sorted=False)
    return torch.zeros_like(hidden_pre).scatter(-1, indices, values.relu())


def encode_abstopk(sae, sae_in: Tensor, hook_pre: HookFn) -> Tensor:
    hidden_pre = _ranked_pre(sae, sae_in, hook_pre)
    indices = torch.topk(hidden_pre.abs(), k=sae.cfg.k, dim=-1, sorted=False).indices
    return torch.zeros_like(hidden_pre).scatter(-1, indices, hidden_pre.gather(-1, indices))


def encode_gated(sae, sae_in: Tensor, hook_pre: HookFn) -> Tensor:
    gate_open = (linear(sae_in, sae.W_enc, sae.b_gate) > 0).to(sae_in.dtype)
    magnitude_pre = hook_pre(linear(sae_in, sae.W_enc * sae.r_mag.exp(), sae.b_mag))
    return gate_open * magnitude_pre.relu()


@dataclass(frozen=True)
class Architecture:
    """One SAE architecture: its tensors, its encoder, and whether it is a (skip) transcoder."""

    name: str
    parameters: tuple[str, ...]  # names in PARAMETER_AXES, in state-dict order
    encode: Callable[..., Tensor]  # (sae, sae_in, hook_pre) -> acts, before hook_sae_acts_post
    transcoder: bool = False  # reads hook_name, writes hook_name_out (d_out wide)
    top_k: bool = False  # has k and rescale_acts_by_decoder_norm

    @property
    def skip(self) -> bool:
        return "W_skip" in self.parameters

    def shapes(self, d_in: int, d_sae: int, d_out: int) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor this architecture holds."""
        sizes = {"d_in": d_in, "d_sae": d_sae, "d_out": d_out}
        return {name: tuple(sizes[axis] for axis in PARAMETER_AXES[name]) for name in self.parameters}


_LINEAR = ("W_enc", "b_enc", "W_dec", "b_dec")
ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture("standard", _LINEAR, encode_relu),
        Architecture("gated", ("W_enc", "b_gate", "r_mag", "b_mag", "W_dec", "b_dec"), encode_gated),
        Architecture("topk", _LINEAR, encode_topk, top_k=True),
        Architecture("abstopk", _LINEAR, encode_abstopk, top_k=True),
        Architecture("jumprelu", (*_LINEAR, "threshold"), encode_jumprelu),
        Architecture("transcoder", _LINEAR, encode_relu, transcoder=True),
        Architecture("skip_transcoder", (*_LINEAR, "W_skip"), encode_relu, transcoder=True),
        Architecture("jumprelu_transcoder", (*_LINEAR, "threshold"), encode_jumprelu, transcoder=True),
        Architecture("jumprelu_skip_transcoder", (*_LINEAR, "threshold", "W_skip"), encode_jumprelu, transcoder=True),
    )
}
# SAELens architecture names that cannot be read here, and why.
UNSUPPORTED_ARCHITECTURES = {
    "batchtopk": "a training checkpoint: SAELens saves BatchTopK SAEs for inference as 'jumprelu'",
    "matryoshka_batchtopk": "a training checkpoint: SAELens saves it for inference as 'jumprelu'",
    "temporal": "not supported yet",
    "matching_pursuit": "not supported yet",
}


def architecture_named(name) -> Architecture:
    """The ``Architecture`` called ``name``; ``ValueError`` naming the known ones otherwise."""
    if isinstance(name, str) and name in ARCHITECTURES:
        return ARCHITECTURES[name]
    why = f" ({UNSUPPORTED_ARCHITECTURES[name]})" if isinstance(name, str) and name in UNSUPPORTED_ARCHITECTURES else ""
    raise ValueError(f"unknown SAE architecture {name!r}{why}; known architectures: {list(ARCHITECTURES)}")


__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "PARAMETER_AXES",
    "UNSUPPORTED_ARCHITECTURES",
    "architecture_named",
    "linear",
]

"""Where an SAE's features write: its output split into exact terms, and the map into the residual stream.

An SAE (or transcoder) writes at its hook ``h`` (``hook_name_out`` for a transcoder).
Given its input ``x`` at one position, decoding is affine in the feature activations
(``SAE.decode_affine``), so what it writes at ``h`` is exactly::

    output = sum_f acts_f * m * directions[f]  +  offset  +  skip
    (the activation at h) = output + error,    error = activation - output

``m`` undoes the input normalization (1 without one), ``offset`` is ``b_dec`` mapped
back the same way, ``skip`` is a skip transcoder's ``x W_skip^T`` (0 otherwise).

Vectors at ``h`` reach the residual stream linearly for three kinds of hooks, which is
what direct logit attribution of features needs (``ResidualWrite``):

==============================================  ===============================================
``h``                                           into the residual stream
==============================================  ===============================================
the stream itself or a write added to it        as they are (``hook_resid_pre/mid/post``,
                                                ``hook_attn_out``, ``hook_mlp_out``, the embeddings)
``blocks.L.attn.hook_z``                        ``sum_h z_h W_O[L, h]`` (one head ``h`` for an SAE
                                                with ``hook_head_index``); ``b_O`` is not the SAE's
``blocks.L.mlp.hook_post``                      ``post W_out[L]``; ``b_out`` is not the SAE's
==============================================  ===============================================

Any other hook (queries, patterns, a norm's output ...) reaches the logits non-linearly or
not at all, and ``residual_write`` refuses it.
"""

from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from interp_transformer.sae import SAE

from .. import _checks

STREAM_HOOKS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


@dataclass
class ResidualWrite:
    """How vectors at ``hook_name`` enter the residual stream: ``v @ matrix`` (``matrix [d_out, d_model]``; None: as
    they are)."""

    hook_name: str
    kind: str  # "stream", "z" or "post"
    matrix: Float[Tensor, "d_out d_model"] | None

    def to_residual(self, vectors: Float[Tensor, "... d_out"]) -> Float[Tensor, "... d_model"]:
        return vectors if self.matrix is None else vectors @ self.matrix

    def pull(self, direction: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_out"]:
        """The direction ``g`` at the hook with ``to_residual(v) . direction = v . g``."""
        return direction if self.matrix is None else direction @ self.matrix.T


def _short_names(model, names, layer=None) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            full = model.act_name(name, layer)
        except KeyError:
            continue
        if full in model.hook_dict:
            found[full] = name
    return found


def residual_write(model: _checks.AnyModel, sae: SAE) -> ResidualWrite:
    """The linear map from ``sae``'s write hook into ``model``'s residual stream (module docstring); ``ValueError`` if
    none."""
    hook = sae.hook_name_out or sae.hook_name
    stream = set(_short_names(model, model.hook_names.input_writers)) | {
        model.hook_names.final_residual_name(model.cfg.n_layers)
    }
    for layer in range(model.cfg.n_layers):
        stream |= set(_short_names(model, STREAM_HOOKS, layer))
        if hook in _short_names(model, ["z"], layer):
            W_O = model.blocks[layer].attn.W_O  # [head_index, d_head, d_model]
            head = sae.cfg.hook_head_index
            matrix = (
                W_O[head]
                if head is not None
                else einops.rearrange(W_O, "head_index d_head d_model -> (head_index d_head) d_model")
            )
            return ResidualWrite(hook, "z", matrix)
        if hook in _short_names(model, ["post"], layer):
            return ResidualWrite(hook, "post", model.blocks[layer].mlp.W_out)
    if hook in stream:
        return ResidualWrite(hook, "stream", None)
    raise ValueError(
        f"the SAE writes at {hook!r}, which does not reach the residual stream linearly; direct logit effects "
        f"need an SAE on the residual stream or an attention or MLP output ({', '.join(STREAM_HOOKS)}), on the "
        "heads' z or on the MLP neurons (post)"
    )


@dataclass
class DecodedTerms:
    """``sae``'s output split into exact terms (module docstring), for inputs ``[*batch, d_in]``.

    ``acts [*batch, d_sae]``, ``multiplier [*batch, 1]``, ``directions [d_sae, d_out]``,
    ``offset [*batch, d_out]``, ``skip [*batch, d_out]`` (zeros unless a skip transcoder),
    ``output [*batch, d_out]`` (the SAE's own forward, heads flattened), ``error`` =
    activation - output when the activation at the write hook was given.
    """

    acts: Tensor
    multiplier: Tensor
    directions: Tensor
    offset: Tensor
    skip: Tensor
    output: Tensor
    error: Tensor | None

    def feature_sum(self) -> Tensor:
        """``sum_f acts_f * m * directions[f]``: what the features write, ``[*batch, d_out]``."""
        return (self.acts * self.multiplier) @ self.directions


def flat(sae: SAE, vectors: Tensor) -> Tensor:
    """A hook_z SAE's ``[..., head_index, d_head]`` vectors as ``[..., d_in]``; others as they are."""
    if sae.cfg.reshape_activations == "hook_z":
        return einops.rearrange(vectors, "... head_index d_head -> ... (head_index d_head)")
    return vectors


@torch.no_grad()
def decoded_terms(sae: SAE, x: Tensor, activation: Tensor | None = None) -> DecodedTerms:
    """Split ``sae``'s output on input ``x`` into its terms; ``activation`` (what the model has at the write hook) gives
    the error."""
    sae.check_input(x)
    acts, state = sae.encode_with_state(x, hooked=False)
    directions, multiplier, offset = sae.decode_affine(state)
    output = flat(sae, sae.reconstruct(x, hooked=False))
    skip = sae.skip_term(x)
    skip = torch.zeros_like(output) if skip is None else skip
    offset = offset.expand_as(output)
    error = None if activation is None else flat(sae, activation).to(output.dtype) - output
    return DecodedTerms(acts, multiplier.expand(*acts.shape[:-1], 1), directions, offset, skip, output, error)


__all__ = ["DecodedTerms", "ResidualWrite", "decoded_terms", "flat", "residual_write"]

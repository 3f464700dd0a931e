"""A token embedding followed by a norm (BLOOM's ``word_embeddings_layernorm``).

::

    embed = ln(W_E[tokens])         hook_embed, the stream entering block 0 (with no positional embedding)

The norm is the part's child ``ln``, so its hooks are ``embed.ln.hook_scale`` and
``embed.ln.hook_normalized``, and ``hook_embed`` holds the normalized embedding: as
TransformerLens' ``post_embedding_ln``, and unlike DESIGN section 3's plain ``W_E[tokens]``.
``W_E`` is the table as stored; a token's write to the stream is ``ln(W_E[token])``, not
linear in ``W_E``.

Weight processing: the write depends on each token's own mean and scale, so no weight
holds its mean over ``d_model`` and ``output_weights()`` is empty: centring the writing
weights centres every other writer (which changes nothing downstream, every reader being
a LayerNorm) and leaves this one as it is. The norm is not folded into anything: its
output is the residual stream itself.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts.writers import Part


class NormedEmbed(nn.Module):
    """``embed = ln(W_E[tokens])`` (see the module docstring)."""

    def __init__(self, cfg, ln: Part):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.ln = ln

    def output_weights(self) -> list[Tensor]:
        """Nothing: the write ``ln(W_E[token])`` keeps a mean no weight holds (see the module docstring)."""
        return []

    def writes(self) -> Float[Tensor, "d_vocab d_model"]:
        """What each token writes into the residual stream: ``ln(W_E)`` row by row (no hook fires)."""
        return self.ln.normalize(self.W_E)

    @shape_checked
    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.ln(self.W_E[tokens])


__all__ = ["NormedEmbed"]

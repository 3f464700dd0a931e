"""Where the tokens of one forward pass sit: what positional parts and attention masks read.

A ``TokenLayout`` is made once per forward pass by the model and handed to every block.
It separates two things that coincide in an unpadded batch:

- *slots*: the index of a token in its row of the key sequence. Query ``i`` of this pass
  is key slot ``offset + i``, where ``offset`` counts the positions a key/value cache
  already holds. Causality is about slots: a query sees keys in earlier slots.
- *positions*: the position id a positional embedding or a rotation reads, ``[batch, pos]``.
  Without padding it equals the slot; it is per row so that a padded row can count its
  positions from its first real token.

``key_is_real [batch, key_pos]`` is False at padding keys (cached ones included), or
``None`` when nothing is padded. Padding positions take the position of the last real
token before them (0 before the first), so no position id is out of range.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor


@dataclass(frozen=True)
class TokenLayout:
    """Slots, positions and padding of the tokens of one forward pass (see the module docstring)."""

    positions: Int[Tensor, "batch pos"]
    offset: int = 0
    key_is_real: Bool[Tensor, "batch key_pos"] | None = None

    @classmethod
    def contiguous(
        cls,
        batch: int,
        pos: int,
        offset: int = 0,
        device: str | torch.device | None = None,
        key_is_real: Bool[Tensor, "batch key_pos"] | None = None,
    ) -> "TokenLayout":
        """``pos`` new tokens per row after ``offset`` cached ones: positions ``offset .. offset + pos - 1`` in every
        row."""
        positions = torch.arange(offset, offset + pos, device=device).expand(batch, pos)
        return cls(positions, offset, key_is_real)

    @classmethod
    def from_attention_mask(
        cls, attention_mask: Int[Tensor, "batch pos"], past_key_is_real: Bool[Tensor, "batch offset"] | None = None
    ) -> "TokenLayout":
        """The layout of a padded batch: ``attention_mask`` is 1 on real tokens, 0 on padding.

        ``past_key_is_real`` is the padding of the positions a key/value cache already holds
        (None: they are all real, or there are none). Each row counts positions from its
        first real token, so a left-padded row embeds its text exactly as it would alone;
        without any padding the layout is ``contiguous``.
        """
        batch, pos = attention_mask.shape
        offset = 0 if past_key_is_real is None else past_key_is_real.shape[1]
        key_is_real = attention_mask.bool()
        if past_key_is_real is not None:
            key_is_real = torch.cat([past_key_is_real.to(key_is_real.device), key_is_real], dim=1)
        if bool(key_is_real.all()):
            return cls.contiguous(batch, pos, offset, attention_mask.device)
        positions = (key_is_real.long().cumsum(dim=-1) - 1).clamp(min=0)[:, offset:]
        return cls(positions, offset, key_is_real)

    @property
    def n_queries(self) -> int:
        return self.positions.shape[1]

    @property
    def n_keys(self) -> int:
        """Keys a query of this pass can be compared with: the cached ones and the new ones."""
        return self.offset + self.n_queries

    def query_slots(self) -> Int[Tensor, "query_pos"]:
        return torch.arange(self.offset, self.n_keys, device=self.positions.device)

    def key_slots(self) -> Int[Tensor, "key_pos"]:
        return torch.arange(self.n_keys, device=self.positions.device)


__all__ = ["TokenLayout"]

"""The one residual stack: embeddings in, blocks, then the final norm and read-out its holder has.

``DemoTransformer``, ``EncoderTransformer`` and both stacks of an ``EncoderDecoderTransformer``
are this stack. They differ only in which parts they hold (None where absent) and in what
each block reads besides the stream (a key/value cache, the encoder's output)::

    residual = hook_embed(embed)
             + hook_token_type_embed(token_type_embed(token_type_ids))    (if any: BERT)
             + hook_pos_embed(pos_embed(positions))                      (if any: learned or fixed positions)
    residual = embed_ln(residual)                                        (if any: BERT, BART)
    layout   = BiasedLayout(layout, rel_pos_bias(layout))                (if any: T5, computed once)
    residual = block(residual, layout, *block_inputs(L))                 for the blocks that run

The holder sets every part attribute, None where it has no such part, and keeps its
composition and its forward: the read-out differs (logits, an MLM head, the decoder's logits).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.hooks import HookPoint
from interp_transformer.parts import TokenLayout
from interp_transformer.parts.relative_position_bias import BiasedLayout

STACK_PARTS = ("token_type_embed", "pos_embed", "embed_ln", "rel_pos_bias")  # each None where a stack has none


class ResidualStack:
    """Embed → blocks (see the module docstring); mixed into a module holding the parts."""

    if TYPE_CHECKING:  # a mixin of the model class: it reads that class's attributes and calls its forward

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def enter_stream(
        self,
        embed: Float[Tensor, "batch pos d_model"],
        tokens: Int[Tensor, "batch pos"],
        layout: TokenLayout,
        token_type_ids: Int[Tensor, "batch pos"] | None = None,
    ) -> tuple[Float[Tensor, "batch pos d_model"], TokenLayout]:
        """The residual stream entering block 0, and the layout every block reads."""
        residual = self.hook_embed(embed)
        positions = None  # learned or fixed positions; rotary ones act inside attention
        if self.pos_embed is not None:
            positions = self.hook_pos_embed(self.pos_embed(tokens, layout.offset, layout.positions))
        if self.token_type_embed is not None:  # BERT's order: hooks embed, pos, types; sums embed + types + pos
            residual = residual + self.hook_token_type_embed(self.token_type_embed(token_type_ids))
        if positions is not None:
            residual = residual + positions
        if self.embed_ln is not None:
            residual = self.embed_ln(residual)
        if self.rel_pos_bias is not None:  # computed once, read by every layer
            layout = BiasedLayout.of(layout, self.rel_pos_bias(layout))
        return residual, layout

    def run_blocks(
        self,
        residual: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout,
        layers: slice = slice(None),
        block_inputs: Callable[[int], tuple] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """The blocks ``layers`` selects, in order; block ``L`` also reads ``block_inputs(L)``."""
        for layer, block in list(enumerate(self.blocks))[layers]:
            residual = block(residual, layout, *(block_inputs(layer) if block_inputs is not None else ()))
        return residual


def hold_embedding_hooks(holder, pos_embed) -> None:
    """Give ``holder`` ``hook_embed``, the ``pos_embed`` part (None: no learned or fixed positions) and, with one,
    ``hook_pos_embed``, in that order."""
    holder.hook_embed = HookPoint()
    holder.pos_embed = pos_embed
    if pos_embed is not None:
        holder.hook_pos_embed = HookPoint()


def hold_no_parts(holder, *names: str) -> None:
    """Set each of ``names`` (from ``STACK_PARTS``) to None on ``holder``: a stack without those parts."""
    unknown = set(names) - set(STACK_PARTS)
    if unknown:
        raise ValueError(f"stack parts are {STACK_PARTS}, got {sorted(unknown)}")
    for name in names:
        setattr(holder, name, None)


__all__ = ["ResidualStack", "STACK_PARTS", "hold_embedding_hooks", "hold_no_parts"]

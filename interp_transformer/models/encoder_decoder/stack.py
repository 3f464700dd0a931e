"""The two stacks of an encoder-decoder: embeddings in, blocks, a final norm.

Each stack adds its positions to the token embedding it is given, normalizes the sum if
the architecture says so (BART's ``embed_ln``), turns a relative position bias into the
``BiasedLayout`` every layer reads (T5), runs its blocks and its final norm::

    residual = hook_embed(embed) + hook_pos_embed(pos_embed(positions))      (positions: if any)
    residual = embed_ln(residual)                                            (if any)
    residual = block(residual, layout[, kv_cache, source])                   for each block
    output   = ln_final(residual)                                            (NoNorm in post-norm stacks)

``DecoderStack`` passes each block the encoder's output (``CrossAttentionSource``) and its
key/value cache. Both stacks expose their weights stacked over blocks, like a model does:
``stack.W_Q [layer, head_index, d_model, d_head]`` ...; the decoder also its
cross-attention's, ``stack.W_Q_cross`` ... and the factored ``QK_cross``/``OV_cross``.
"""

from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.families.encoder_decoder import StackParts
from interp_transformer.models.base import ATTENTION_WEIGHTS, MLP_WEIGHTS, stacked_views
from interp_transformer.models.encoder_decoder.kv_cache import EncoderDecoderKVCache
from interp_transformer.models.stack import ResidualStack, hold_embedding_hooks, hold_no_parts
from interp_transformer.parts import TokenLayout
from interp_transformer.parts.cross_attention import CrossAttentionSource


class EncoderStack(ResidualStack, nn.Module):
    """The encoder: bidirectional blocks over the source (see the module docstring)."""

    def __init__(self, parts: StackParts):
        super().__init__()
        if not isinstance(parts, StackParts):
            raise TypeError(f"a stack is built from StackParts, got {type(parts).__name__}")
        hold_embedding_hooks(self, parts.pos_embed)
        self.embed_ln = parts.embed_ln
        self.rel_pos_bias = parts.rel_pos_bias
        hold_no_parts(self, "token_type_embed")
        self.blocks = nn.ModuleList(parts.blocks)
        self.ln_final = parts.ln_final

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @shape_checked
    def forward(
        self, embed: Float[Tensor, "batch pos d_model"], tokens: Int[Tensor, "batch pos"], layout: TokenLayout
    ) -> Float[Tensor, "batch pos d_model"]:
        residual, layout = self.enter_stream(embed, tokens, layout)
        return self.ln_final(self.run_blocks(residual, layout))

    # stacked weights, as a model gives them
    W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O = stacked_views("attn", ATTENTION_WEIGHTS)
    W_in, b_in, W_out, b_out = stacked_views("mlp", MLP_WEIGHTS)


class DecoderStack(EncoderStack):
    """The decoder: causal blocks over the target, each reading the source through cross-attention."""

    @shape_checked
    def forward(  # type: ignore[override]  # the decoder's forward also reads the source (and a cache)
        self,
        embed: Float[Tensor, "batch pos d_model"],
        tokens: Int[Tensor, "batch pos"],
        layout: TokenLayout,
        source: CrossAttentionSource,
        kv_cache: EncoderDecoderKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        residual, layout = self.enter_stream(embed, tokens, layout)
        residual = self.run_blocks(
            residual, layout, block_inputs=lambda layer: (kv_cache[layer] if kv_cache is not None else None, source)
        )
        return self.ln_final(residual)

    W_Q_cross, W_K_cross, W_V_cross, W_O_cross, b_Q_cross, b_K_cross, b_V_cross, b_O_cross = stacked_views(
        "cross_attn", ATTENTION_WEIGHTS
    )

    @property
    def QK_cross(self):
        """``W_Q_cross W_K_cross^T`` per layer and head: ``FactoredMatrix [layer, head_index, d_model, d_model]``,
        rows reading the decoder's stream (queries), columns the encoder's output (keys)."""
        from interp_transformer.circuits.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_Q_cross, self.W_K_cross.transpose(-2, -1))

    @property
    def OV_cross(self):
        """``W_V_cross W_O_cross`` per layer and head: from the encoder's output to the decoder's stream."""
        from interp_transformer.circuits.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_V_cross, self.W_O_cross)


__all__ = ["DecoderStack", "EncoderStack"]

"""EncoderDecoderTransformer: an encoder-decoder (T5, BART, Marian, the Transformer) whose every weight and activation
you can read.

Forward pass (``source [batch, key_pos]`` ids, ``target [batch, pos]`` the decoder's input)::

    encoder_out = encoder(embed(source))                     bidirectional; source padding masked
    residual    = decoder(embed(target), encoder_out)        causal self-attention, then cross-attention
                                                             (decoder_embed(target) where the target has its own)
                                                             over encoder_out, then the MLP, per block
    logits      = unembed(residual)                          [batch, pos, d_vocab]: logits[:, t] predicts target[t + 1]

Hook names carry their stack (``encoder.blocks.0.attn.hook_pattern``,
``decoder.blocks.0.cross_attn.hook_pattern``), and so do short cache keys
(``cache["pattern", 0, "cross"]``); see ``interp_transformer.families.encoder_decoder``.
The cross-attention pattern is ``[batch, head_index, query_pos, key_pos]`` with
``query_pos`` over the target and ``key_pos`` over the source.
"""

from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.core.kv_cache import require_kv_cache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.families.encoder_decoder import EncoderDecoderParts
from interp_transformer.models.base import HookedTransformerBase, WeightView
from interp_transformer.models.encoder_decoder.inputs import SourceText, SourceTokens, check_decoder_input, check_source
from interp_transformer.models.encoder_decoder.kv_cache import EncoderDecoderKVCache
from interp_transformer.models.encoder_decoder.stack import DecoderStack, EncoderStack
from interp_transformer.parts import TokenLayout
from interp_transformer.parts.cross_attention import CrossAttentionSource

TokensLike = Int[Tensor, "batch pos"] | Int[Tensor, "pos"] | str | list | SourceTokens


class PerStack(WeightView):
    """A model-level weight an encoder-decoder keeps per stack: reading it says where to look instead."""

    def __init__(self):
        super().__init__("", "", "")

    def __get__(self, model, owner=None):
        if model is None:
            return self
        raise AttributeError(self.missing(model))

    def missing(self, model) -> str:
        per_head = self.name[:2] in ("W_", "b_") and self.name[2] in "QKVO"
        cross = f", model.decoder.{self.name}_cross (cross-attention)" if per_head else ""
        stacks = f"model.encoder.{self.name}, model.decoder.{self.name}"
        return f"{self.name}: an encoder-decoder keeps it per stack: {stacks}{cross}"


class EncoderDecoderTransformer(HookedTransformerBase):
    """An encoder-decoder with explicit per-head weights and a hook point on every activation (see the module
    docstring).

    ``model(tokens, decoder_input, attention_mask=None)`` returns the decoder's logits
    ``[batch, pos, d_vocab]``. ``tokens`` is the source: ids ``[batch, key_pos]`` (``[key_pos]``
    is a batch of one), text (tokenized with its padding mask when the model has a
    tokenizer) or a ``SourceTokens``; ``attention_mask`` is 1 on real source tokens, 0 on
    padding, and a source holding the padding id needs one. ``decoder_input`` is the
    target the decoder reads, starting with ``cfg.decoder_start_token_id`` (default: that
    token alone). ``encode`` and ``decode`` run the halves; ``generate`` translates.
    """

    kind = "encoder-decoder"
    TOKENIZER_HINT = "the checkpoint's Hugging Face tokenizer"

    parts_class = EncoderDecoderParts

    def hold_parts(self, parts) -> None:
        self.embed = parts.embed
        self.decoder_embed = parts.decoder_embed  # None: the decoder reads the source's embedding too
        self.encoder = EncoderStack(parts.encoder)
        self.decoder = DecoderStack(parts.decoder)
        self.unembed = parts.unembed

    # --- forward -----------------------------------------------------------------------------
    def forward(
        self,
        tokens: TokensLike,
        decoder_input: Int[Tensor, "batch pos"] | None = None,
        *,
        attention_mask: Int[Tensor, "batch key_pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_vocab"]:
        return self.decode(decoder_input, self.encode(tokens, attention_mask))

    def encode(self, tokens: TokensLike, attention_mask: Tensor | None = None) -> CrossAttentionSource:
        """Run the encoder: its output ``[batch, key_pos, d_model]`` with the source's padding, as cross-attention reads
        them."""
        ids, key_is_real = self.prepare_source(tokens, attention_mask)
        layout = TokenLayout.contiguous(ids.shape[0], ids.shape[1], device=ids.device, key_is_real=key_is_real)
        return CrossAttentionSource(self.encoder(self.embed(ids), ids, layout), key_is_real)

    def decode(
        self,
        decoder_input: Int[Tensor, "batch pos"] | None,
        source: CrossAttentionSource,
        kv_cache: EncoderDecoderKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Run the decoder on ``decoder_input`` reading ``source`` (from ``encode``); with ``kv_cache``, after its
        positions.

        A ``kv_cache`` that is not an ``EncoderDecoderKVCache`` raises ``TypeError``; one with
        another number of layers than the decoder's, ``ValueError``.
        """
        if not isinstance(source, CrossAttentionSource):
            raise TypeError(
                f"source must be the CrossAttentionSource that encode() returns, got {type(source).__name__}"
            )
        if kv_cache is not None:
            n_layers = self.cfg.n_decoder_layers
            require_kv_cache(kv_cache, EncoderDecoderKVCache, f"EncoderDecoderKVCache({n_layers})")
            if len(kv_cache) != n_layers:
                raise ValueError(
                    f"this key/value cache has {len(kv_cache)} layers, the decoder {n_layers}: "
                    f"make it with EncoderDecoderKVCache({n_layers})"
                )
        if source.encoder_out is not None:
            batch = source.encoder_out.shape[0]
        elif source.key_is_real is not None:
            batch = len(source.key_is_real)
        else:
            raise ValueError("source holds neither the encoder's output nor its padding: pass what encode() returns")
        offset = kv_cache.n_positions if kv_cache is not None else 0
        decoder_input = check_decoder_input(decoder_input, batch, self.cfg, offset, allow_meta=self.W_E.is_meta)
        decoder_input = decoder_input.to(self.W_E.device)
        return self._decode(decoder_input, source, kv_cache, offset)

    @shape_checked
    def _decode(
        self,
        decoder_input: Int[Tensor, "batch pos"],
        source: CrossAttentionSource,
        kv_cache: EncoderDecoderKVCache | None,
        offset: int,
    ) -> Float[Tensor, "batch pos d_vocab"]:
        layout = TokenLayout.contiguous(decoder_input.shape[0], decoder_input.shape[1], offset, decoder_input.device)
        embed = self.embed if self.decoder_embed is None else self.decoder_embed
        residual = self.decoder(embed(decoder_input), decoder_input, layout, source, kv_cache)
        return self.unembed(residual)

    # --- inputs --------------------------------------------------------------------------------
    def prepare_source(self, tokens: TokensLike, attention_mask: Tensor | None = None):
        """``(tokens [batch, key_pos], key_is_real [batch, key_pos] or None)`` on the model's device, checked."""
        if isinstance(tokens, SourceTokens):
            if attention_mask is not None:
                raise ValueError("tokens is a SourceTokens (it carries its own mask): pass no other attention_mask")
            tokens, attention_mask = tokens
        elif isinstance(tokens, str) or (
            isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens)
        ):
            if attention_mask is not None:
                raise ValueError("text is tokenized with its own attention mask: pass token ids to give a mask")
            tokens, attention_mask = self.to_tokens_and_mask(tokens)
        tokens, key_is_real = check_source(tokens, attention_mask, self.cfg, allow_meta=self.W_E.is_meta)
        device = self.W_E.device
        return tokens.to(device), None if key_is_real is None else key_is_real.to(device)

    def prepare_tokens(self, tokens: TokensLike) -> Int[Tensor, "batch pos"]:
        """The source as checked ``[batch, key_pos]`` ids (text is tokenized; a padded source needs
        ``prepare_source``)."""
        return self.prepare_source(tokens)[0]

    def act_name(self, name: str, layer=None, sub: str | None = None) -> str:
        """The full hook name of a short key: ``act_name("pattern", 0, "cross") ==
        "decoder.blocks.0.cross_attn.hook_pattern"``."""
        counts = {"encoder": self.cfg.n_layers, "decoder": self.cfg.n_decoder_layers}
        # an encoder-decoder's table is an EncoderDecoderHookNames (layers counted per stack); the type is the union
        return self.hook_names.full_name(name, layer, sub, n_layers=counts)  # type: ignore[arg-type]

    def default_backward_metric(self, output: Tensor, model_args: tuple) -> Tensor:
        raise ValueError(
            "run_with_cache(incl_bwd=True) on an encoder-decoder needs backward_metric=fn(logits) -> scalar "
            "(e.g. the loss of the target it was given)"
        )

    # --- generation ----------------------------------------------------------------------------
    def generate(self, tokens: TokensLike, *args, **kwargs):
        """Translate: greedy or beam search with a key/value cache; see
        ``interp_transformer.models.encoder_decoder.generate``."""
        from interp_transformer.models.encoder_decoder.generate import generate

        return generate(self, tokens, *args, **kwargs)

    # --- text: to_tokens_and_mask, to_tokens, to_str_tokens, to_string (of the source) ------------
    text_inputs = SourceText()

    def writer_blocks(self) -> list:
        """The decoder's blocks: the stack whose residual stream the logits read."""
        return list(self.decoder.blocks)

    # --- weights and blocks: per stack ------------------------------------------------------------
    blocks = PerStack()  # tools written for one stack of blocks read it: they learn where the two are
    W_pos = PerStack()
    W_Q, W_K, W_V, W_O = PerStack(), PerStack(), PerStack(), PerStack()
    b_Q, b_K, b_V, b_O = PerStack(), PerStack(), PerStack(), PerStack()
    W_in, b_in, W_out, b_out = PerStack(), PerStack(), PerStack(), PerStack()


__all__ = ["EncoderDecoderTransformer", "SourceTokens"]

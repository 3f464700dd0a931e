"""DemoTransformer: a decoder whose every weight and activation you can read, of any registered architecture."""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.kv_cache import KeyShape, KeyValueCache, check_rotations_current, require_kv_cache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.core.token_checks import as_id_tensor, check_attention_mask, check_token_ids, is_text
from interp_transformer.families import DecoderParts
from interp_transformer.models.base import HookedTransformerBase
from interp_transformer.models.stack import ResidualStack, hold_embedding_hooks, hold_no_parts
from interp_transformer.parts import TokenLayout
from interp_transformer.text.methods import DecoderText, PromptMethods

TokensLike = Int[Tensor, "batch pos"] | Int[Tensor, "pos"] | str | list


class DemoTransformer(PromptMethods, ResidualStack, HookedTransformerBase):
    """A causal decoder with explicit per-head weights and a hook point on every activation.

    ``DemoTransformer(cfg)`` builds the parts ``cfg``'s architecture picks (GPT-2 for a
    ``TransformerConfig``; see ``interp_transformer.families``) and runs them as the one
    residual stack (``interp_transformer.models.stack``), then reads the logits out::

        residual = hook_embed(embed(tokens)) + hook_pos_embed(pos_embed(positions))
        residual = block(residual)            for every block
        logits   = unembed(ln_final(residual))

    (``pos_embed`` only where the architecture has learned or fixed positions.)

    ``forward(tokens)`` returns logits ``[batch, pos, d_vocab]``. ``tokens`` is an
    integer tensor ``[batch, pos]``; a 1-D tensor ``[pos]`` is read as a batch of one,
    and a string or list of strings is tokenized first when the model has a tokenizer
    (a list is padded, with its mask). ``attention_mask [batch, pos]`` (1 real, 0 padding)
    makes a padded batch give each row exactly what it gives alone: padded keys are never
    attended and positions count from each row's first real token (left or right padding).
    ``stop_at_layer=L`` returns the residual stream entering block ``L`` instead (for
    ``L = n_layers``, the final residual stream, before the final norm).

    Text in and out (``to_tokens``, ``to_str_tokens``, ...) comes from ``text_methods`` through its
    input kind, ``DecoderText``; ``generate`` and ``test_prompt`` from ``PromptMethods``.
    """

    kind = "decoder"
    text_inputs = DecoderText()
    TOKENIZER_HINT = "e.g. model.tokenizer = interp_transformer.text.tokens.offline_gpt2_tokenizer()"

    parts_class = DecoderParts

    def hold_parts(self, parts) -> None:
        self.embed = parts.embed
        hold_embedding_hooks(self, parts.pos_embed)
        hold_no_parts(self, "token_type_embed", "embed_ln", "rel_pos_bias")
        self.blocks = nn.ModuleList(parts.blocks)
        self.ln_final = parts.ln_final
        self.unembed = parts.unembed

    def forward(
        self,
        tokens: TokensLike,
        *,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        stop_at_layer: int | None = None,
        kv_cache: KeyValueCache | None = None,
    ) -> Float[Tensor, "batch pos d_out"]:
        n_blocks = self.check_stop_at_layer(stop_at_layer)
        if kv_cache is not None:
            require_kv_cache(kv_cache, KeyValueCache, f"KeyValueCache({self.cfg.n_layers})")
            if stop_at_layer is not None:
                raise ValueError(
                    "kv_cache cannot be filled by a run that stops early (stop_at_layer): its later layers "
                    "would miss these positions; run the whole model, or leave out the cache"
                )
            kv_cache.check_fits(self.cfg.n_layers, self.kv_cache_key_shapes())
        tokens, layout = self.prepare_inputs(tokens, attention_mask, kv_cache)
        if kv_cache is not None:
            check_rotations_current(self.rotation_thresholds(), kv_cache, layout.positions.max(dim=-1).values + 1)
        output = self._forward(tokens, layout, n_blocks, kv_cache, stop_at_layer is not None)
        if kv_cache is not None:  # set once every layer took the new positions: a refused run leaves the cache be
            kv_cache.key_is_real = layout.key_is_real
        return output

    def rotation_thresholds(self) -> tuple[int, ...]:
        """Row lengths past which a part rotates every position differently (LongRoPE); a key/value cache filled
        before a row grew past one is stale after (``Rotary.length_thresholds``). Empty for most models."""
        lengths = (getattr(part, "length_thresholds", None) for part in self.modules())
        found = {t for thresholds in lengths if thresholds is not None for t in thresholds()}
        return tuple(sorted(found))

    def kv_cache_key_shapes(self) -> list[KeyShape | None]:
        """Per block, the ``(n_key_value_heads, d_head)`` of the keys and values it puts in a key/value cache.

        ``None`` for a block whose attention does not say (it is then not checked).
        """
        shapes = []
        for block in self.blocks:
            attn = getattr(block, "attn", None)
            heads, d_head = getattr(attn, "n_key_value_heads", None), getattr(attn, "d_head", None)
            shapes.append((heads, d_head) if isinstance(heads, int) and isinstance(d_head, int) else None)
        return shapes

    @shape_checked
    def _forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        layout: TokenLayout,
        n_blocks: int,
        kv_cache: KeyValueCache | None,
        return_residual: bool = False,
    ) -> Float[Tensor, "batch pos d_out"]:
        residual, layout = self.enter_stream(self.embed(tokens), tokens, layout)
        cache_of = (lambda layer: (kv_cache[layer],)) if kv_cache is not None else (lambda layer: (None,))
        residual = self.run_blocks(residual, layout, slice(n_blocks), cache_of)
        if return_residual:
            return residual
        return self.unembed(self.ln_final(residual))

    def prepare_inputs(
        self, tokens: TokensLike, attention_mask: Tensor | None = None, kv_cache: KeyValueCache | None = None
    ) -> tuple[Int[Tensor, "batch pos"], TokenLayout]:
        """Checked ``[batch, pos]`` ids on the model's device and their ``TokenLayout``.

        Text is tokenized with its padding mask (``to_tokens_and_mask``); passing a mask
        beside text raises ``ValueError``. The layout continues after the positions (and
        the padding) a key/value cache holds.
        """
        if is_text(tokens):
            if attention_mask is not None:
                raise ValueError("text is tokenized with its own attention mask: pass token ids to give a mask")
            # left padding: every row's last position is its last real token, as it would be alone
            tokens, attention_mask = self.to_tokens_and_mask(tokens, padding_side="left")
        offset = kv_cache.n_positions if kv_cache is not None else 0
        tokens = self.prepare_tokens(tokens, offset=offset)
        past = kv_cache.key_is_real if kv_cache is not None else None
        if attention_mask is None and past is None:
            return tokens, TokenLayout.contiguous(tokens.shape[0], tokens.shape[1], offset, tokens.device)
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens)
        mask = check_attention_mask(attention_mask, tokens, allow_empty_rows=past is not None).to(tokens.device)
        if past is not None and past.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"the key/value cache holds batch {past.shape[0]}, got tokens with batch {tokens.shape[0]}"
            )
        return tokens, TokenLayout.from_attention_mask(mask, past)

    def prepare_tokens(self, tokens: TokensLike, offset: int = 0) -> Int[Tensor, "batch pos"]:
        """Check ``tokens`` and return them as ``[batch, pos]`` int64 on the model's device.

        Raises ``TypeError`` for non-integer tokens and ``ValueError`` for ids outside
        ``[0, d_vocab)``, a sequence longer than ``n_ctx``, an empty sequence or a
        tensor that is not 1-D or 2-D.
        """
        if is_text(tokens):
            tokens = self.to_tokens(tokens)
        tokens = check_token_ids(
            as_id_tensor(tokens), self.cfg.d_vocab, self.cfg.n_ctx, offset, allow_meta=self.W_E.is_meta
        )
        return tokens.to(device=self.W_E.device)

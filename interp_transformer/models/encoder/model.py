"""EncoderTransformer: a BERT-style encoder whose every weight and activation you can read.

Forward pass (``x`` is the residual stream, ``key_is_real`` the padding mask)::

    x = embed_ln(W_E[tokens] + W_token_type[token_type_ids] + W_pos[positions])
    for each block:   (post-LayerNorm, see components.PostNormBlock)
        resid_mid = x + attn(x)
        x = ln2(ln1(resid_mid) + mlp(ln1(resid_mid)))
    hidden states = x                            [batch pos d_model]  (the output of a BertModel)
    mlm logits    = mlm_head(x)                  [batch pos d_vocab]  (the output of a BertForMaskedLM)
    pooled        = tanh(x[:, 0] W_pool + b_pool) [batch d_model]     (if it has the pooler)

Hook points. Same name, same value as in ``DemoTransformer`` (DESIGN section 3):
``hook_embed``, ``hook_pos_embed``, ``blocks.L.hook_resid_pre``, ``blocks.L.attn.hook_q/k/v``,
``hook_attn_scores`` (padding keys at ``-inf``), ``hook_pattern`` (padding keys at 0),
``hook_z``, ``blocks.L.hook_attn_out``, ``blocks.L.hook_resid_mid``
(``= resid_pre + attn_out``), ``blocks.L.mlp.hook_pre/post``, ``blocks.L.hook_mlp_out``.

Hooks that exist only here, or whose *meaning* differs because the block is post-norm:

==========================================  =============================================
``hook_token_type_embed``                   ``W_token_type[token_type_ids]``
``embed_ln.hook_scale/hook_normalized``     LayerNorm of the summed embeddings (= ``blocks.0.hook_resid_pre``)
``blocks.L.ln1.hook_normalized``            ``ln1(resid_mid)``: read by the MLP *and* the base of ``resid_post``
``blocks.L.hook_resid_post``                ``ln1(resid_mid) + mlp_out`` (not ``resid_mid + mlp_out``), before ``ln2``
``blocks.L.ln2.hook_normalized``            ``ln2(resid_post)``, the block's output
``blocks.L.hook_normalized_resid_post``     the same value, under TransformerLens' ``HookedEncoder`` name;
                                            ``= blocks.{L+1}.hook_resid_pre``; the last one is the hidden states
``mlm_head.hook_pre/hook_post``             ``x W_transform + b_transform`` and its activation
``mlm_head.ln.hook_scale/hook_normalized``  the head's LayerNorm (these fire when the forward returns MLM logits)
==========================================  =============================================

There is no ``ln_final``: each block ends in its own LayerNorm. Cache tools built on
pre-norm algebra (``decompose_resid``, ``accumulated_resid(apply_ln=True)``,
``apply_ln_to_stack``, ``logit_attrs``) raise on a post-norm model, saying why: the
residual stream is not a sum of component outputs here, it is renormalized twice per
block. ``analysis.readouts.post_norm`` splits an output direction exactly instead.
"""

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.families.bert.recipe import EncoderParts
from interp_transformer.hooks import HookPoint
from interp_transformer.models.base import HookedTransformerBase, WeightView, unembedding_directions
from interp_transformer.models.encoder.inputs import (
    EncoderText,
    EncoderTokens,
    check_attention_mask,
    check_token_type_ids,
    check_tokens,
)
from interp_transformer.models.stack import ResidualStack, hold_embedding_hooks, hold_no_parts
from interp_transformer.parts import TokenLayout

RETURN_TYPES = ("hidden", "mlm_logits", "pooled")


TokensLike = Int[Tensor, "batch pos"] | Int[Tensor, "pos"] | str | list | EncoderTokens


class EncoderTransformer(ResidualStack, HookedTransformerBase):
    """BERT architecture with explicit per-head weights and a hook point on every activation.

    ``forward(tokens, attention_mask=None, token_type_ids=None, return_type=None)``
    returns what the checkpoint's own Hugging Face class returns: the masked-language-model
    logits ``[batch, pos, d_vocab]`` for a model with an MLM head (``BertForMaskedLM``),
    else the final hidden states ``[batch, pos, d_model]`` (``BertModel``). Ask for one
    explicitly with ``return_type="hidden"``, ``"mlm_logits"`` or ``"pooled"`` (the
    pooler's ``[batch, d_model]``). ``mlm_logits(...)``, ``pooled_output(...)`` and
    ``mean_pooled_embedding(...)`` are shortcuts.

    ``tokens`` is an integer tensor ``[batch, pos]`` (``[pos]`` is a batch of one), text
    (tokenized with ``to_tokens_and_mask``, mask included), or an ``EncoderTokens``.
    ``attention_mask`` is 1 on real tokens and 0 on padding; ``None`` means no padding.
    """

    kind = "encoder"
    TOKENIZER_HINT = "a BERT tokenizer"

    parts_class = EncoderParts

    def hold_parts(self, parts) -> None:
        self.embed = parts.embed
        hold_embedding_hooks(self, parts.pos_embed)
        self.token_type_embed = parts.token_type_embed
        self.hook_token_type_embed = HookPoint()
        self.embed_ln = parts.embed_ln
        hold_no_parts(self, "rel_pos_bias")
        self.blocks = nn.ModuleList(parts.blocks)
        self.mlm_head = parts.mlm_head
        self.pooler = parts.pooler

    # --- forward ---------------------------------------------------------------------------
    def forward(
        self,
        tokens: TokensLike,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        return_type: str | None = None,
        stop_at_layer: int | None = None,
    ) -> Float[Tensor, "batch ..."]:
        if return_type is None:
            return_type = "hidden" if self.mlm_head is None or stop_at_layer is not None else "mlm_logits"
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
        if return_type == "mlm_logits" and self.mlm_head is None:
            raise ValueError("this model has no MLM head (cfg.has_mlm_head=False); load a BertForMaskedLM checkpoint")
        if return_type == "pooled" and self.pooler is None:
            raise ValueError(
                "this model has no pooler (cfg.has_pooler=False); load a BertModel checkpoint that has one"
            )
        n_blocks = self.check_stop_at_layer(stop_at_layer)
        if n_blocks < self.cfg.n_layers and return_type != "hidden":
            raise ValueError(
                f"stop_at_layer returns the residual stream; it needs return_type='hidden', got {return_type!r}"
            )
        tokens, key_is_real, token_type_ids = self.prepare_inputs(tokens, attention_mask, token_type_ids)
        return self._forward(tokens, key_is_real, token_type_ids, n_blocks, return_type)

    @shape_checked
    def _forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        key_is_real: Bool[Tensor, "batch pos"] | None,
        token_type_ids: Int[Tensor, "batch pos"],
        n_blocks: int,
        return_type: str,
    ) -> Float[Tensor, "batch ..."]:
        layout = TokenLayout.contiguous(tokens.shape[0], tokens.shape[1], device=tokens.device, key_is_real=key_is_real)
        residual, layout = self.enter_stream(self.embed(tokens), tokens, layout, token_type_ids)
        residual = self.run_blocks(residual, layout, slice(n_blocks))
        if return_type == "mlm_logits":
            return self.mlm_head(residual)
        if return_type == "pooled":
            return self.pooler(residual)
        return residual

    def mlm_logits(
        self, tokens: TokensLike, attention_mask=None, token_type_ids=None
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Masked-language-model logits ``[batch, pos, d_vocab]``: ``forward(..., return_type="mlm_logits")``."""
        return self(tokens, attention_mask, token_type_ids, return_type="mlm_logits")

    def pooled_output(
        self, tokens: TokensLike, attention_mask=None, token_type_ids=None
    ) -> Float[Tensor, "batch d_model"]:
        """The pooler's ``tanh(hidden[:, 0] W_pool + b_pool)``, ``[batch, d_model]``."""
        return self(tokens, attention_mask, token_type_ids, return_type="pooled")

    def mean_pooled_embedding(
        self, tokens: TokensLike, attention_mask=None, token_type_ids=None, *, normalize: bool = False
    ) -> Float[Tensor, "batch d_model"]:
        """Sentence embedding: the mean of the hidden states over real tokens, ``[batch, d_model]``.

        ``embedding[b] = sum_p mask[b, p] hidden[b, p] / sum_p mask[b, p]``; with
        ``normalize`` it is scaled to unit L2 norm (what sentence-transformers'
        all-MiniLM-L6-v2 outputs, so cosine similarity becomes a dot product).
        """
        tokens, key_is_real, token_type_ids = self.prepare_inputs(tokens, attention_mask, token_type_ids)
        hidden = self._forward(tokens, key_is_real, token_type_ids, self.cfg.n_layers, "hidden")
        weights = torch.ones_like(tokens, dtype=hidden.dtype) if key_is_real is None else key_is_real.to(hidden.dtype)
        summed = einops.einsum(hidden, weights, "batch pos d_model, batch pos -> batch d_model")
        embedding = summed / weights.sum(dim=-1, keepdim=True)
        return torch.nn.functional.normalize(embedding, dim=-1) if normalize else embedding

    # --- input checks ----------------------------------------------------------------------
    def prepare_inputs(
        self, tokens: TokensLike, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """Check the inputs; return ``(tokens, key_is_real, token_type_ids)`` on the model's device.

        ``tokens`` int64 ``[batch, pos]``; ``key_is_real`` bool ``[batch, pos]`` (or None:
        no padding); ``token_type_ids`` int64 ``[batch, pos]`` (zeros when not given).
        Raises ``TypeError``/``ValueError`` naming what was expected and what came.
        """
        if isinstance(tokens, EncoderTokens):
            if attention_mask is not None or token_type_ids is not None:
                raise ValueError(
                    "tokens is an EncoderTokens (it carries its own mask and token types): pass no other mask"
                )
            tokens, attention_mask, token_type_ids = tokens
        elif isinstance(tokens, (str, list)):
            if attention_mask is not None or token_type_ids is not None:
                raise ValueError("text is tokenized with its own mask and token types: pass token ids to give a mask")
            tokens, attention_mask, token_type_ids = self.to_tokens_and_mask(tokens)
        device = self.embed.W_E.device
        tokens = check_tokens(tokens, self.cfg, allow_meta=self.embed.W_E.is_meta)
        key_is_real = (
            None if attention_mask is None else check_attention_mask(attention_mask, tokens).to(device, torch.bool)
        )
        token_type_ids = (
            torch.zeros_like(tokens)
            if token_type_ids is None
            else check_token_type_ids(token_type_ids, tokens, self.cfg)
        )
        return tokens.to(device), key_is_real, token_type_ids.to(device)

    def prepare_tokens(self, tokens: Tensor | str | list | EncoderTokens) -> Int[Tensor, "batch pos"]:
        """Token ids ``[batch, pos]`` (int64, on the model's device) of inputs that need no padding mask.

        Text goes through ``to_tokens`` (``[CLS] ... [SEP]``; texts that would need padding
        raise ``ValueError``); tensors are checked like ``forward``'s; an ``EncoderTokens``
        is accepted when its mask marks every position real and its token types are 0.
        Like ``DemoTransformer.prepare_tokens``, this is what tools that run one unpadded
        prompt (the report, the command line) call.
        """
        if isinstance(tokens, (str, list)):
            tokens = self.to_tokens(tokens)
        if isinstance(tokens, EncoderTokens):
            if not bool(tokens.attention_mask.all()) or bool(tokens.token_type_ids.any()):
                raise ValueError(
                    "these EncoderTokens carry padding or segment ids, which token ids alone would lose: "
                    "pass them to the model whole instead"
                )
            tokens = tokens.tokens
        return check_tokens(tokens, self.cfg, allow_meta=self.embed.W_E.is_meta).to(self.embed.W_E.device)

    def tokens_to_residual_directions(self, tokens) -> Float[Tensor, "... d_model"]:
        """The MLM decoder's column of each token, ``W_U[:, token]``: shape ``tokens.shape + (d_model,)``.

        In a ``BertForMaskedLM`` the logit of token ``t`` is ``mlm_head.ln(post) . W_U[:, t] + b_U[t]``,
        so this direction lives in the space of ``mlm_head.ln.hook_normalized``, *after* the
        head's non-linear transform, not in the space of the hidden states (as ``W_U[:, t]``
        does for a decoder, up to ``ln_final``). A model without an MLM head has no such
        direction and raises ``ValueError``.
        """
        if self.mlm_head is None:
            raise ValueError(
                "tokens_to_residual_directions needs an MLM head (cfg.has_mlm_head=False here): a BertModel maps "
                "hidden states to no vocabulary; load a BertForMaskedLM checkpoint, or pick a direction in "
                "d_model yourself (e.g. for analysis.readouts.post_norm)"
            )
        return unembedding_directions(self.W_U, tokens)

    # --- text: to_tokens_and_mask(text, text_pair=None), to_tokens, to_str_tokens, to_string ---------
    text_inputs = EncoderText()

    # --- weights only an encoder has ------------------------------------------------------
    W_token_type = WeightView("token_type_embed", "W_token_type", "n_token_types d_model")
    W_U = WeightView("mlm_head.unembed", "W_U", "d_model d_vocab")
    b_U = WeightView("mlm_head.unembed", "b_U", "d_vocab")

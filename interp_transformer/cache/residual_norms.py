"""The norms of the residual-stream stacks: which norm reads where, frozen-scale reading, and logit attributions.

``ResidualNorms`` reads one ``ActivationCache`` (it holds the cache; ``ResidualStacks`` holds
one); the arguments follow TransformerLens' ``ActivationCache`` as described in ``residual_stacks``.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.hooks.slices import Slice, SliceInput

POST_NORM_INSTEAD = (
    "For an exact split of an output direction over embeddings, heads, MLPs and norm biases (every norm's scale frozen "
    "from the cache) use analysis.readouts.post_norm.encoder_direct_attribution(cache, direction)"
)
SliceLike = Slice | SliceInput


def _not_additive(model, what: str) -> ValueError:
    return ValueError(f"{what} has no meaning here: {model.capabilities.why_not_additive()}. {POST_NORM_INSTEAD}")


class ResidualNorms:
    """Norm lookups, ``apply_ln_to_stack`` and ``logit_attrs`` of one ``ActivationCache`` (see ``residual_stacks``)."""

    def __init__(self, cache):
        self.cache = cache

    @property
    def model(self):
        return self.cache.model

    def _require_additive(self, what: str) -> None:
        if not self.model.capabilities.additive_residual:
            raise _not_additive(self.model, what)

    def _input_layer(self, layer: int | None) -> int:
        """``layer`` as a block input in ``0 .. n_layers``; ``None`` and ``-1`` mean ``n_layers`` (the final
        residual)."""
        n_layers = self.model.cfg.n_layers
        if layer is None or (isinstance(layer, int) and layer == -1):
            return n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layers:
            raise ValueError(
                f"layer must be an int in [0, {n_layers}], or None or -1 for every layer through the final "
                f"residual stream (as in TransformerLens), got {layer!r}"
            )
        return layer

    def _norm_and_scale(self, layer: int, mlp_input: bool):
        """The norm that reads block ``layer``'s input (``n_layers``: the final norm) and its cached scale (None if it
        has none)."""
        key: tuple[str | int, ...]
        if layer == self.model.cfg.n_layers:
            if mlp_input:
                raise ValueError("mlp_input=True needs a block's MLP; layer=n_layers is the final norm's input")
            norm, key = self.model.final_norm, ("scale",)
            if norm is None:
                raise ValueError("this model has no final norm to apply")
        else:
            sub = self._reader_norm_name(layer, mlp_input)
            if sub is None:  # the sublayer reads the stream as it is (OLMo's blocks): the identity, no scale
                from interp_transformer.parts.no_norm import NoNorm

                return NoNorm(), None
            norm, key = getattr(self.model.blocks[layer], sub), ("scale", layer, sub)
        try:
            name = self.model.act_name(*key)
        except KeyError:  # the architecture names no scale there: its norm has none (no normalization at all)
            return norm, None
        return norm, (self.cache[name] if name in self.model.hook_dict else None)

    def _reader_norm_name(self, layer: int, mlp_input: bool) -> str | None:
        """The attribute name of the norm block ``layer``'s attention reads (``ln1``), or with ``mlp_input`` its MLP
        (``ln2``; GPT-J's shared ``ln1``), as the block's ``norm_readers()`` say; None where that part reads the
        stream unnormalized (OLMo's blocks, whose only norms are on the sublayers' outputs)."""
        block = self.model.blocks[layer]
        part = getattr(block, "mlp", None) if mlp_input else block.attn
        if part is None:
            raise ValueError(f"mlp_input=True: block {layer} has no norm read by an MLP (an attention-only block)")
        norm = next((norm for norm, reader in block.norm_readers() if reader is part), None)
        return None if norm is None else next(name for name, child in block.named_children() if child is norm)

    def _output_scale(self, writer, pos_slice: Slice) -> Tensor | None:
        """The cached scale of the norm ``writer``'s output passes through before the stream (Gemma 2's
        ``ln1_post``), at ``pos_slice``; None when the output is added as it is."""
        return None if writer.output_norm is None else pos_slice.apply(self.cache[writer.scale_hook], dim=-2)

    def apply_ln_to_stack(
        self,
        residual_stack: Float[Tensor, "component ... d_model"],
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: SliceLike = None,
        batch_slice: SliceLike = None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
    ) -> Float[Tensor, "component ... d_model"]:
        """Read each component through the norm at block ``layer``'s input, its scale frozen to the cached one.

        The norm is block ``layer``'s ``ln1`` (``ln2`` with ``mlp_input``), or the final
        norm for ``layer`` None/-1/``n_layers``; applied by its own ``apply_frozen`` (bias
        left out, so the components of a residual sum to ``normalized - b``). ``pos_slice``
        must be the one the stack was sliced with; ``batch_slice`` is applied to the stack's
        batch axis (axis 1, when ``has_batch_dim``) and to the scale. ``recompute_ln`` (final
        norm only) applies the whole final norm to each component with its own scale.
        Raises ``ValueError`` on a post-norm model.
        """
        self._require_additive("apply_ln_to_stack")
        layer, pos_slice, batch_slice = self._input_layer(layer), Slice(pos_slice), Slice(batch_slice)
        if has_batch_dim:
            residual_stack = batch_slice.apply(residual_stack, dim=1)
        norm, scale = self._norm_and_scale(layer, mlp_input)
        if recompute_ln and layer == self.model.cfg.n_layers:
            return norm.normalize(residual_stack)
        if scale is not None:
            scale = pos_slice.apply(scale, dim=-2)
            if self.cache.has_batch_dim:
                scale = batch_slice.apply(scale, dim=0)
        return norm.apply_frozen(residual_stack, scale)

    def logit_attrs(
        self,
        residual_stack: Float[Tensor, "component ... d_model"],
        tokens: str | int | Int[Tensor, "..."],
        incorrect_tokens: None | str | int | Int[Tensor, "..."] = None,
        pos_slice: SliceLike = None,
        batch_slice: SliceLike = None,
        has_batch_dim: bool = True,
    ) -> Float[Tensor, "component ..."]:
        """Each component's direct contribution to the logit of ``tokens`` (minus ``incorrect_tokens``).

        The stack is read through the final norm first (``apply_ln_to_stack(stack, -1,
        pos_slice=..., batch_slice=..., has_batch_dim=...)``, scale frozen), then dotted with
        ``W_U[:, token]`` (no ``b_U``): pass the stack as the cache gives it, not already
        normalized. ``tokens`` is a token id, a single-token string or an id tensor
        broadcasting against the stack's batch/pos axes; ``incorrect_tokens`` must have the
        same shape. Raises ``ValueError`` on a post-norm model.
        """
        self._require_additive("logit_attrs")
        tokens = self._token_ids(tokens)
        direction = self.model.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            incorrect_tokens = self._token_ids(incorrect_tokens)
            if tokens.shape != incorrect_tokens.shape:
                raise ValueError(
                    f"tokens and incorrect_tokens must have the same shape, got {tuple(tokens.shape)} and "
                    f"{tuple(incorrect_tokens.shape)}"
                )
            direction = direction - self.model.tokens_to_residual_directions(incorrect_tokens)
        scaled = self.apply_ln_to_stack(
            residual_stack, -1, pos_slice=pos_slice, batch_slice=batch_slice, has_batch_dim=has_batch_dim
        )
        try:
            torch.broadcast_shapes(scaled.shape[1:], direction.shape)
        except RuntimeError:
            raise ValueError(
                f"tokens of shape {tuple(direction.shape[:-1])} do not match the stack's batch/pos axes "
                f"{tuple(scaled.shape[1:-1])}"
            ) from None
        return (scaled * direction.to(scaled.dtype)).sum(dim=-1)

    def _token_ids(self, tokens) -> Tensor:
        if isinstance(tokens, str):
            from interp_transformer.text.tokens import single_token_id

            tokens = single_token_id(self.model._require_tokenizer(), tokens)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            tokens = torch.tensor(tokens)
        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens must be a token id, a single-token str or an integer tensor, got {tokens!r:.80}")
        return tokens


__all__ = ["POST_NORM_INSTEAD", "ResidualNorms", "SliceLike"]

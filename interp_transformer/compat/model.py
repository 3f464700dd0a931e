"""``HookedTransformer``: a ``DemoTransformer`` with TransformerLens' forward pass, defaults and methods.

It *is* a ``DemoTransformer`` (built from a ``HookedTransformerConfig`` through the
registered compatibility architecture), so every tool of this library works on it; it adds
what code written for TransformerLens' classic ``HookedTransformer`` calls:

- ``forward(input, return_type="logits" | "loss" | "both" | None, loss_per_token, prepend_bos,
  padding_side, start_at_layer, tokens, shortformer_pos_embed, attention_mask, stop_at_layer,
  past_kv_cache)`` with TransformerLens' semantics (text is tokenized with ``to_tokens``; the
  attention mask is inferred from leading pad tokens when the tokenizer pads on the left or a
  key/value cache is given, ``utils.get_attention_mask``), and ``input_to_embed``;
- ``run_with_cache(..., pos_slice=, return_cache_object=)``;
- the text methods of ``compat.text``, the toggles of ``compat.toggles``, loading and weight
  processing of ``compat.pretrained``, ``generate`` of ``compat.generation``.

Our own keywords still work: ``model(tokens, attention_mask=mask, kv_cache=KeyValueCache(...))``.
"""

from typing import Any, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

# registers the architecture HookedTransformerConfig builds
from interp_transformer.compat import architecture  # noqa: F401
from interp_transformer.compat.cache import ActivationCache
from interp_transformer.compat.config import HookedTransformerConfig
from interp_transformer.compat.errors import CompatValueError, assertion_compatible_methods
from interp_transformer.compat.factored_matrix import FactoredMatrix
from interp_transformer.compat.generation import GenerationMethods
from interp_transformer.compat.kv_cache import MAKE_CACHE, HookedTransformerKeyValueCache
from interp_transformer.compat.losses import get_attention_mask, lm_cross_entropy_loss
from interp_transformer.compat.parts import ShortformerLayout
from interp_transformer.compat.pretrained import PretrainedMethods
from interp_transformer.compat.text import (
    TransformerLensTextMethods,
    load_tokenizer,
    prepare_tokenizer,
    warn_ignored_padding_side,
)
from interp_transformer.compat.toggles import ToggleMethods
from interp_transformer.core.kv_cache import KeyValueCache, require_kv_cache
from interp_transformer.core.token_checks import as_id_tensor, check_attention_mask, is_text
from interp_transformer.hooks import HookPoint
from interp_transformer.hooks.slices import Slice
from interp_transformer.models.decoder import DemoTransformer
from interp_transformer.parts import TokenLayout

RETURN_TYPES = ("logits", "loss", "both", None)
# hooks whose position axis is third from last ([batch, pos, head_index, ...]); every other hook's is second from last
PER_HEAD_SUFFIXES = (
    "hook_q",
    "hook_k",
    "hook_v",
    "hook_z",
    "hook_result",
    "hook_rot_q",
    "hook_rot_k",
    "hook_q_input",
    "hook_k_input",
    "hook_v_input",
    "hook_attn_in",
)


class Output(NamedTuple):
    """``return_type="both"``: the logits and the loss."""

    logits: Float[Tensor, "batch pos d_vocab"]
    loss: Tensor


# TransformerLens' own signatures of from_pretrained, generate and forward differ from the core model's on purpose
class HookedTransformer(  # type: ignore[misc]
    TransformerLensTextMethods, ToggleMethods, PretrainedMethods, GenerationMethods, DemoTransformer
):
    """TransformerLens' ``HookedTransformer`` on our model (see the module docstring)."""

    cache_class = ActivationCache  # TransformerLens' remainder at layer 0, and its error classes

    def __init__(
        self,
        cfg: HookedTransformerConfig | dict,
        tokenizer=None,
        move_to_device: bool = True,
        default_padding_side: str | None = None,
    ):
        if isinstance(cfg, str):
            raise CompatValueError(
                "Please pass in a config dictionary or HookedTransformerConfig object. If you want to load a "
                "pretrained model, use HookedTransformer.from_pretrained() instead."
            )
        cfg = HookedTransformerConfig.unwrap(cfg)
        if tokenizer is None and cfg.tokenizer_name is not None:
            tokenizer = load_tokenizer(cfg.tokenizer_name)
        if tokenizer is not None:
            tokenizer = prepare_tokenizer(tokenizer, default_padding_side)
            if cfg.d_vocab == -1:
                cfg.d_vocab = max(tokenizer.get_vocab().values()) + 1
            if cfg.d_vocab_out == -1:
                cfg.d_vocab_out = cfg.d_vocab
            cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0
        else:
            warn_ignored_padding_side(default_padding_side)
        super().__init__(
            cfg, tokenizer=tokenizer, dtype=cfg.dtype, device=cfg.device if move_to_device else None, seed=cfg.seed
        )
        if cfg.use_hook_tokens:  # first in forward order: it fires before the embedding
            self.__dict__["_modules"] = {"hook_tokens": HookPoint(), **self._modules}
            self.setup()
        self.set_fast_paths(False)
        self.dataset = None

    def set_fast_paths(self, enabled: bool) -> None:
        """Whether attention and LayerNorm may use their fused kernels while nothing observes them (default False).

        Off, as in TransformerLens (which has only the explicit formulas), every run computes
        the same bits whether or not a hook or cache observes the pattern or the scale. On,
        the fused paths run where nothing observes them (``docs/performance.md``): faster,
        equal to float rounding.
        """
        self.fast_paths = bool(enabled)
        for module in self.modules():
            for switch in ("use_fused_attention", "use_fused_layer_norm", "use_fused_rms_norm"):
                if hasattr(module, switch):
                    setattr(module, switch, self.fast_paths)

    # --- the forward pass ---------------------------------------------------------------------------
    def forward(  # type: ignore[override]  # TransformerLens' forward: its own arguments and return types
        self,
        input,
        return_type: str | None = "logits",
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        start_at_layer: int | None = None,
        tokens: Int[Tensor, "batch pos"] | None = None,
        shortformer_pos_embed: Float[Tensor, "batch pos d_model"] | None = None,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        stop_at_layer: int | None = None,
        past_kv_cache: HookedTransformerKeyValueCache | None = None,
        *,
        kv_cache: KeyValueCache | None = None,
    ):
        """Logits ``[batch, pos, d_vocab_out]`` (or the loss, both, None, or the residual with ``stop_at_layer``).

        ``input`` is text, token ids ``[batch, pos]``/``[pos]`` (tensor, list or numpy), or with
        ``start_at_layer`` the residual stream entering that block (then pass ``tokens`` for a
        loss, and ``attention_mask``/``shortformer_pos_embed`` as ``input_to_embed`` returned
        them). Blocks ``start_at_layer .. stop_at_layer - 1`` run (Python slicing, negatives
        count from the end). The loss is the next-token cross-entropy, masked where the
        attention mask is 0 (``loss_per_token``: ``[batch, pos - 1]``).
        """
        if return_type not in RETURN_TYPES:
            raise CompatValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
        if past_kv_cache is not None and kv_cache is not None:
            raise CompatValueError("pass one key/value cache: past_kv_cache (TransformerLens') or kv_cache (ours)")
        if past_kv_cache is not None:
            require_kv_cache(past_kv_cache, HookedTransformerKeyValueCache, MAKE_CACHE, "past_kv_cache")
        if kv_cache is not None:
            require_kv_cache(kv_cache, KeyValueCache, f"KeyValueCache({self.cfg.n_layers})")
        cache = past_kv_cache if past_kv_cache is not None else kv_cache
        if cache is not None:
            cache.check_fits(self.cfg.n_layers, key_shapes=self.kv_cache_key_shapes())
        if start_at_layer is None:
            residual, tokens, layout, loss_mask = self._embed(input, prepend_bos, padding_side, attention_mask, cache)
        else:
            residual, layout, loss_mask = self._resume(input, attention_mask, cache, shortformer_pos_embed)
        cache_of = (lambda layer: (cache[layer],)) if cache is not None else (lambda layer: (None,))
        residual = self.run_blocks(residual, layout, self._block_slice(start_at_layer, stop_at_layer), cache_of)
        if stop_at_layer is not None:
            return residual
        residual = self.ln_final(residual)
        if return_type is None:
            return None
        logits = self.unembed(residual)
        if return_type == "logits":
            return logits
        if tokens is None:
            raise CompatValueError(
                "tokens must be passed in if return_type is 'loss' or 'both' (with start_at_layer, pass tokens=)"
            )
        loss = self.loss_fn(logits, tokens, loss_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else Output(logits, loss)

    def _block_slice(self, start_at_layer: int | None, stop_at_layer: int | None) -> slice:
        n_layers = self.cfg.n_layers
        for name, value in (("start_at_layer", start_at_layer), ("stop_at_layer", stop_at_layer)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not -n_layers <= value <= n_layers
            ):
                raise CompatValueError(f"{name} must be an int in [{-n_layers}, {n_layers}] or None, got {value!r}")
        return slice(start_at_layer, stop_at_layer)

    def _embed(self, input, prepend_bos, padding_side, attention_mask, cache):
        """``(residual, tokens, layout, new-token mask)`` of ``input``, continuing after what ``cache`` holds."""
        if is_text(input):
            if self.tokenizer is None:
                raise CompatValueError("Must provide a tokenizer if passing a string to the model")
            input = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)
        tokens = as_id_tensor(input)
        if isinstance(tokens, Tensor) and tokens.ndim == 1:
            tokens = tokens[None]
        offset = cache.n_positions if cache is not None else 0
        tokens = self.prepare_tokens(tokens, offset=offset)
        padded_left = self.tokenizer is not None and (padding_side or self.tokenizer.padding_side) == "left"
        if (
            attention_mask is None
            and (padded_left or isinstance(cache, HookedTransformerKeyValueCache))
            and not tokens.is_meta
        ):
            bos = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
            attention_mask = get_attention_mask(self.tokenizer, tokens, bos, padding_side)
        if attention_mask is not None:
            attention_mask = check_attention_mask(attention_mask, tokens, allow_empty_rows=offset > 0).to(tokens.device)
        layout = self._layout(tokens.shape, attention_mask, cache, tokens.device, store=True)
        if hasattr(self, "hook_tokens"):
            tokens = self.hook_tokens(tokens)
        residual = self.hook_embed(self.embed(tokens))
        if self.pos_embed is not None:
            pos_embed = self.hook_pos_embed(self.pos_embed(tokens, layout.offset, layout.positions))
            if self.cfg.positional_embedding_type == "shortformer":
                layout = ShortformerLayout(layout.positions, layout.offset, layout.key_is_real, pos_embed=pos_embed)
            else:
                residual = residual + pos_embed
        return residual, tokens, layout, attention_mask

    def _layout(self, shape, new_mask: Tensor | None, cache, device, store: bool) -> TokenLayout:
        """The layout of ``shape = [batch, pos]`` new tokens after ``cache``'s; with ``store``, the cache keeps the
        mask."""
        batch, pos = shape
        offset = cache.n_positions if cache is not None else 0
        if isinstance(cache, HookedTransformerKeyValueCache):
            if cache.batch_size != batch:
                raise CompatValueError(
                    f"the key/value cache holds batch {cache.batch_size}, got tokens with batch {batch}"
                )
            past = cache.past_key_is_real()
            if store:
                cache.append_attention_mask(
                    new_mask if new_mask is not None else torch.ones(shape, dtype=torch.int, device=device)
                )
        else:
            past = cache.key_is_real if cache is not None else None
        if new_mask is None and past is None:
            layout = TokenLayout.contiguous(batch, pos, offset, device)
        else:
            mask = new_mask if new_mask is not None else torch.ones(shape, dtype=torch.long, device=device)
            if past is None and offset:  # every cached position is real
                past = torch.ones(batch, offset, dtype=torch.bool, device=device)
            layout = TokenLayout.from_attention_mask(mask, past)
        if isinstance(cache, KeyValueCache) and store:
            cache.key_is_real = layout.key_is_real
        return layout

    def _resume(self, residual, attention_mask, cache, shortformer_pos_embed):
        """``(residual, layout, new-token mask)`` for a forward pass that starts inside the model."""
        if not isinstance(residual, Tensor) or not residual.is_floating_point() or residual.ndim != 3:
            raise TypeError(
                f"with start_at_layer, input is the residual stream [batch, pos, d_model], got "
                f"{getattr(residual, 'shape', type(residual).__name__)}"
            )
        batch, pos, _ = residual.shape
        offset = cache.n_positions if cache is not None else 0
        new_mask = attention_mask
        if attention_mask is not None and attention_mask.shape[-1] == offset + pos and offset:
            new_mask = attention_mask[:, offset:]  # input_to_embed returns the mask of the cached positions too
        layout = self._layout((batch, pos), new_mask, cache, residual.device, store=False)
        if shortformer_pos_embed is not None:
            layout = ShortformerLayout(
                layout.positions, layout.offset, layout.key_is_real, pos_embed=shortformer_pos_embed
            )
        return residual, layout, new_mask

    def input_to_embed(
        self,
        input,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        attention_mask: Tensor | None = None,
        past_kv_cache: HookedTransformerKeyValueCache | None = None,
    ):
        """TransformerLens' ``(residual, tokens, shortformer_pos_embed, attention_mask)`` of ``input``.

        ``attention_mask`` is None when nothing is padded and no cache is given; with a
        cache it covers the cached positions too (what ``forward(start_at_layer=...)`` takes).
        """
        residual, tokens, layout, mask = self._embed(input, prepend_bos, padding_side, attention_mask, past_kv_cache)
        shortformer = getattr(layout, "pos_embed", None)
        if past_kv_cache is not None:
            mask = (
                past_kv_cache.previous_attention_mask
                if not past_kv_cache.frozen
                else torch.cat(
                    [
                        past_kv_cache.previous_attention_mask,
                        (mask if mask is not None else torch.ones_like(tokens)).int(),
                    ],
                    dim=-1,
                )
            )
        return residual, tokens, shortformer, mask

    def loss_fn(
        self, logits: Tensor, tokens: Tensor, attention_mask: Tensor | None = None, per_token: bool = False
    ) -> Tensor:
        """``utils.lm_cross_entropy_loss``: next-token cross-entropy, masked where ``attention_mask`` is 0."""
        return lm_cross_entropy_loss(logits, tokens.to(logits.device), attention_mask, per_token)

    def get_pos_offset(self, past_kv_cache, batch_size: int) -> int:
        return 0 if past_kv_cache is None else past_kv_cache.n_positions

    # --- caching -------------------------------------------------------------------------------------
    def run_with_cache(
        self,
        *model_args,
        return_cache_object: bool = True,
        pos_slice=None,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **kwargs,
    ):
        """Our ``run_with_cache`` plus TransformerLens' ``pos_slice`` (positions kept in the cache) and
        ``return_cache_object=False`` (a plain dict)."""
        if not reset_hooks_end or clear_contexts:
            with self.hooks(reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts):
                return self.run_with_cache(
                    *model_args, return_cache_object=return_cache_object, pos_slice=pos_slice, **kwargs
                )
        output, cache = super().run_with_cache(*model_args, **kwargs)
        if pos_slice is not None:
            positions = Slice.unwrap(pos_slice)
            for name, tensor in list(cache.items()):
                dim = -3 if name.removesuffix("_grad").endswith(PER_HEAD_SUFFIXES) else -2
                if tensor.ndim >= -dim:
                    cache.cache_dict[name] = positions.apply(tensor, dim=dim)
        return (output, cache) if return_cache_object else (output, cache.cache_dict)

    # --- weights and circuits -------------------------------------------------------------------------
    @property
    def n_params_total(self) -> int:
        """Every parameter, embeddings, biases and norms included (``cfg.n_params`` counts the weight matrices only)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_and_n_ctx d_model"]:
        """``W_E`` and ``W_pos`` stacked: a basis of the input space for full QK and OV circuits."""
        return torch.cat([self.W_E, self.W_pos], dim=0)

    @property
    def QK(self) -> FactoredMatrix:
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[Tensor, "d_model"]:
        """``sum b_O`` (and ``b_out``) of the blocks before ``layer``, plus block ``layer``'s ``b_O`` with
        ``mlp_input``."""
        if mlp_input and layer >= self.cfg.n_layers:
            raise CompatValueError("Cannot include attn_bias from beyond the final layer")
        bias = torch.zeros(self.cfg.d_model, device=self.W_E.device, dtype=self.W_E.dtype)
        blocks: Any = self.blocks  # read through their parts' biases
        for l in range(layer):
            bias = bias + blocks[l].attn.b_O
            if include_mlp_biases and hasattr(blocks[l], "mlp"):
                bias = bias + blocks[l].mlp.b_out
        if mlp_input:
            bias = bias + blocks[layer].attn.b_O
        return bias

    def all_composition_scores(self, mode: str) -> Float[Tensor, "layer head_index layer head_index"]:
        """Composition scores of every pair of heads (``mode`` ``"Q"``, ``"K"`` or ``"V"``), zero unless the right
        head's
        layer is after the left head's."""
        from interp_transformer.compat.utils_tensors import composition_scores

        right = {"Q": lambda: self.QK, "K": lambda: self.QK.T, "V": lambda: self.OV}.get(mode)
        if right is None:
            raise CompatValueError(f"mode must be one of ['Q', 'K', 'V'] not {mode!r}")
        scores = composition_scores(self.OV, right(), broadcast_dims=True)
        layers = torch.arange(self.cfg.n_layers, device=scores.device)
        later = layers[:, None, None, None] < layers[None, None, :, None]
        return torch.where(later, scores, torch.zeros_like(scores))

    def all_head_labels(self) -> list[str]:
        return [f"L{l}H{h}" for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    def to(self, *args, print_details: bool = False, **kwargs):
        """``nn.Module.to``; ``cfg.device`` and ``cfg.dtype`` follow the weights."""
        super().to(*args, **kwargs)
        if not self.W_E.is_meta:  # (while being built on the meta device, the config keeps the device it will load to)
            self.cfg.device = str(self.W_E.device)
        self.cfg.dtype = self.W_E.dtype
        return self

    def init_weights(self, seed: int | None = None) -> None:
        """TransformerLens' init: ``cfg.init_mode`` (``"gpt2"``: N(0, initializer_range^2); ``"xavier_*"``,
        ``"kaiming_*"``)."""
        from interp_transformer.compat.utils_init import init_model_weights

        if self.cfg.init_mode == "gpt2":
            return super().init_weights(seed)
        init_model_weights(self, self.cfg.init_mode, self.cfg.initializer_range)


# TransformerLens' entry points: where the core raises ValueError/KeyError (an unknown hook name, a token that does not
# occur, ...), these raise CompatValueError/CompatKeyError, which are also the AssertionError TransformerLens raises
TRANSFORMERLENS_METHODS = (
    "__init__",
    "forward",
    "input_to_embed",
    "loss_fn",
    "run_with_cache",
    "run_with_hooks",
    "resolve_hook_names",  # every hook name given to hooks(), add_hook, run_with_cache(names_filter=) passes here
    "add_hook",
    "add_perma_hook",
    "reset_hooks",
    "remove_all_hook_fns",
    "list_hooks",
    "to_tokens",
    "to_string",
    "to_str_tokens",
    "to_single_token",
    "to_single_str_token",
    "get_token_position",
    "tokens_to_residual_directions",
    "set_tokenizer",
    "generate",
    "from_pretrained",
    "from_pretrained_no_processing",
    "process_weights_",
    "refactor_factored_attn_matrices",
    "accumulated_bias",
    "all_composition_scores",
    "init_weights",
)
assertion_compatible_methods(HookedTransformer, TRANSFORMERLENS_METHODS)

__all__ = ["HookedTransformer", "Output", "TRANSFORMERLENS_METHODS"]

"""DemoTransformer: a GPT-2-style decoder whose every weight and activation you can read."""

from typing import Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from .init import check_stop_at_layer, check_token_ids, init_explicit_weights, unembedding_directions
from .components import AttnOnlyBlock, Embed, LayerNorm, PosEmbed, TransformerBlock, Unembed
from .config import TransformerConfig
from .hooks import CachingMixin, HookedRootModule, HookPoint
from .kv_cache import KeyValueCache
from .shape_checks import shape_checked

TokensLike = Union[Int[Tensor, "batch pos"], Int[Tensor, "pos"], str, list]


class DemoTransformer(CachingMixin, HookedRootModule):
    """GPT-2 architecture with explicit per-head weights and a hook point on every activation.

    ``forward(tokens)`` returns logits ``[batch, pos, d_vocab]``. ``tokens`` is an
    integer tensor ``[batch, pos]``; a 1-D tensor ``[pos]`` is read as a batch of one,
    and a string or list of strings is tokenized first when the model has a tokenizer.
    ``stop_at_layer=L`` returns the residual stream entering block ``L`` instead.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        tokenizer=None,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device, None] = None,
        seed: Optional[int] = None,
    ):
        super().__init__()
        if not isinstance(cfg, TransformerConfig):
            raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.processing: list[str] = []  # weight-processing steps applied, in order
        block_class = AttnOnlyBlock if cfg.attn_only else TransformerBlock
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList([block_class(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.unembed = Unembed(cfg)
        self.init_weights(seed)
        self.to(device=device, dtype=dtype)
        self.setup()

    def init_weights(self, seed: Optional[int] = None) -> None:
        """GPT-2's init: weight matrices ~ N(0, init_range^2), biases 0, LayerNorm w = 1."""
        init_explicit_weights(self, self.cfg.init_range, seed)

    def forward(
        self,
        tokens: TokensLike,
        *,
        stop_at_layer: Optional[int] = None,
        kv_cache: Optional[KeyValueCache] = None,
    ) -> Float[Tensor, "batch pos d_out"]:
        offset = kv_cache.n_positions if kv_cache is not None else 0
        tokens = self.prepare_tokens(tokens, offset=offset)
        n_blocks = self._check_stop_at_layer(stop_at_layer)
        return self._forward(tokens, n_blocks, kv_cache, offset)

    @shape_checked
    def _forward(
        self, tokens: Int[Tensor, "batch pos"], n_blocks: int, kv_cache: Optional[KeyValueCache], offset: int
    ) -> Float[Tensor, "batch pos d_out"]:
        embed = self.hook_embed(self.embed(tokens))
        pos_embed = self.hook_pos_embed(self.pos_embed(tokens, offset))
        residual = embed + pos_embed
        for layer, block in enumerate(self.blocks[:n_blocks]):
            residual = block(residual, kv_cache[layer] if kv_cache is not None else None)
        if n_blocks < self.cfg.n_layers:
            return residual
        return self.unembed(self.ln_final(residual))

    def _check_stop_at_layer(self, stop_at_layer: Optional[int]) -> int:
        return check_stop_at_layer(stop_at_layer, self.cfg.n_layers)

    def prepare_tokens(self, tokens: TokensLike, offset: int = 0) -> Int[Tensor, "batch pos"]:
        """Check ``tokens`` and return them as ``[batch, pos]`` int64 on the model's device.

        Raises ``TypeError`` for non-integer tokens and ``ValueError`` for ids outside
        ``[0, d_vocab)``, a sequence longer than ``n_ctx``, an empty sequence or a
        tensor that is not 1-D or 2-D.
        """
        if isinstance(tokens, (str, list)):
            tokens = self.to_tokens(tokens)
        tokens = check_token_ids(tokens, self.cfg.d_vocab, self.cfg.n_ctx, offset)
        return tokens.to(device=self.W_E.device)

    # --- loading, generation and circuits live in their own modules -----------------------
    @classmethod
    def from_pretrained(cls, source, **kwargs) -> "DemoTransformer":
        """Load a model: hub name, local Hugging Face directory or in-memory HF model.

        See ``interp_transformer.loading.from_pretrained`` for the arguments.
        """
        from .loading import from_pretrained

        return from_pretrained(source, **kwargs)

    def generate(self, tokens_or_text, *args, **kwargs):
        """Sample a continuation; see ``interp_transformer.generate.generate``."""
        from .generate import generate

        return generate(self, tokens_or_text, *args, **kwargs)

    def test_prompt(self, prompt: str, answer: str, **kwargs):
        """Rank and probability of ``answer`` after ``prompt``; see ``interp_transformer.prompts.test_prompt``."""
        from .prompts import test_prompt

        return test_prompt(self, prompt, answer, **kwargs)

    @property
    def QK(self):
        """``W_Q W_K^T`` per layer and head, as a ``FactoredMatrix [layer, head_index, d_model, d_model]``."""
        from .factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self):
        """``W_V W_O`` per layer and head, as a ``FactoredMatrix [layer, head_index, d_model, d_model]``."""
        from .factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    # --- tokenizer conveniences (see interp_transformer.tokens) -------------------------
    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(
                "this model has no tokenizer: pass token ids, or attach one with "
                "model.tokenizer = interp_transformer.tokens.offline_gpt2_tokenizer()"
            )
        return self.tokenizer

    def to_tokens(self, text, prepend_bos: bool = True, padding_side: str = "right") -> Int[Tensor, "batch pos"]:
        """Text (or a list of texts, right-padded) to ``[batch, pos]`` ids; BOS prepended by default."""
        from . import tokens as tok

        ids = tok.to_tokens(self._require_tokenizer(), text, prepend_bos=prepend_bos, padding_side=padding_side)
        return ids.to(self.W_E.device)

    def to_str_tokens(self, tokens_or_text, prepend_bos: bool = True):
        from . import tokens as tok

        return tok.to_str_tokens(self._require_tokenizer(), tokens_or_text, prepend_bos=prepend_bos)

    def to_string(self, tokens):
        from . import tokens as tok

        return tok.to_string(self._require_tokenizer(), tokens)

    def get_token_position(self, single_token, tokens_or_text, mode: str = "first", prepend_bos: bool = True) -> int:
        from . import tokens as tok

        return tok.get_token_position(self._require_tokenizer(), single_token, tokens_or_text, mode=mode, prepend_bos=prepend_bos)

    def tokens_to_residual_directions(self, tokens) -> Float[Tensor, "... d_model"]:
        """Unembedding directions ``W_U[:, token]``, shape ``tokens.shape + (d_model,)``."""
        return unembedding_directions(self.W_U, tokens)

    # --- weights stacked over layers -----------------------------------------------------
    def _stack(self, getter) -> Tensor:
        return torch.stack([getter(block) for block in self.blocks])

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.unembed.W_U

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:
        return self.unembed.b_U

    @property
    def W_Q(self) -> Float[Tensor, "layer head_index d_model d_head"]:
        return self._stack(lambda b: b.attn.W_Q)

    @property
    def W_K(self) -> Float[Tensor, "layer head_index d_model d_head"]:
        return self._stack(lambda b: b.attn.W_K)

    @property
    def W_V(self) -> Float[Tensor, "layer head_index d_model d_head"]:
        return self._stack(lambda b: b.attn.W_V)

    @property
    def W_O(self) -> Float[Tensor, "layer head_index d_head d_model"]:
        return self._stack(lambda b: b.attn.W_O)

    @property
    def b_Q(self) -> Float[Tensor, "layer head_index d_head"]:
        return self._stack(lambda b: b.attn.b_Q)

    @property
    def b_K(self) -> Float[Tensor, "layer head_index d_head"]:
        return self._stack(lambda b: b.attn.b_K)

    @property
    def b_V(self) -> Float[Tensor, "layer head_index d_head"]:
        return self._stack(lambda b: b.attn.b_V)

    @property
    def b_O(self) -> Float[Tensor, "layer d_model"]:
        return self._stack(lambda b: b.attn.b_O)

    def __getattr__(self, name: str):
        # nn.Module.__getattr__ would replace _mlp_stack's message with "no attribute 'W_in'"
        if name in ("W_in", "b_in", "W_out", "b_out") and self.__dict__.get("cfg") is not None and self.cfg.attn_only:
            raise AttributeError(f"{name}: this model is attention-only (d_mlp=None) and has no MLP weights")
        return super().__getattr__(name)

    def _mlp_stack(self, name: str) -> Tensor:
        if self.cfg.attn_only:
            raise AttributeError(f"{name}: this model is attention-only (d_mlp=None) and has no MLP weights")
        return self._stack(lambda b: getattr(b.mlp, name))

    @property
    def W_in(self) -> Float[Tensor, "layer d_model d_mlp"]:
        return self._mlp_stack("W_in")

    @property
    def b_in(self) -> Float[Tensor, "layer d_mlp"]:
        return self._mlp_stack("b_in")

    @property
    def W_out(self) -> Float[Tensor, "layer d_mlp d_model"]:
        return self._mlp_stack("W_out")

    @property
    def b_out(self) -> Float[Tensor, "layer d_model"]:
        return self._mlp_stack("b_out")

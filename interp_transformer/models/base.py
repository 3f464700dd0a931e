"""What every hooked model shares: its architecture's facts, stacked weights, circuits, init and checks.

``HookedTransformerBase`` is the one base of ``DemoTransformer`` (decoders of every
architecture), ``EncoderTransformer`` and ``EncoderDecoderTransformer``. ``__init__`` builds the
parts from ``self.architecture.build(cfg)``, refused unless they are the subclass's ``parts_class``,
hands them to the subclass's ``hold_parts`` and initializes; a subclass writes those two and its
forward; everything below comes with it:

- ``architecture``, ``capabilities``, ``hook_names``, ``act_name(...)``, ``final_norm``,
  ``read_out``: the facts tools ask (``interp_transformer.core.capabilities``);
- stacked weights over layers (``W_Q [layer, head_index, d_model, d_head]``, ...,
  ``W_in``, ...) and the model-level ones (``W_E``, ``W_pos``, ``W_U``, ``b_U``), each read
  where its part keeps it (``WeightView``); ``QK`` and ``OV`` as factored matrices;
- GPT-2's weight init, ``run_with_cache`` (``CachingMixin``), the ``stop_at_layer`` check,
  the default backward metric and ``from_pretrained`` restricted to the class;
- ``saes(...)``, ``run_with_saes``, ``run_with_cache_with_saes``: SAEs spliced in
  (``interp_transformer.sae.splice``; nothing stays attached after the call or block).
"""

import difflib
import operator

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.cache.caching import CachingMixin
from interp_transformer.core.capabilities import Capabilities
from interp_transformer.core.losses import lm_loss
from interp_transformer.core.services import service
from interp_transformer.core.token_checks import check_stop_at_layer
from interp_transformer.families import Architecture, architecture_of
from interp_transformer.families.encoder_decoder import EncoderDecoderHookNames
from interp_transformer.hooks import HookedRootModule
from interp_transformer.hooks.names import HookNames
from interp_transformer.parts.writers import Part
from interp_transformer.text.methods import TextMethods

# why a model may lack the part a weight lives in
MISSING_PART = {
    "mlp": "this model is attention-only (d_mlp=None): its blocks have no MLP weights",
    "pos_embed": "this model has no learned positional embedding (its positions act inside attention, or it has none)",
    "unembed": "this model has no unembedding",
    "mlm_head.unembed": "this encoder has no MLM head (cfg.has_mlm_head=False)",
}


class WeightView:
    """A weight read where its part keeps it: ``model.<part>.<weight>``, or stacked over blocks.

    ``WeightView("attn", "W_Q", "layer head_index d_model d_head", stacked=True)`` is
    ``torch.stack([block.attn.W_Q for block in model.blocks])``. A model whose parts lack
    the weight raises ``AttributeError`` saying why (``MISSING_PART``).
    """

    def __init__(self, part: str, weight: str, shape: str, stacked: bool = False):
        self.part, self.weight, self.shape, self.stacked = part, weight, shape, stacked
        where = f"blocks[L].{part}.{weight} stacked over blocks" if stacked else f"{part}.{weight}"
        self.__doc__ = f"``{where}``: ``[{shape}]``."

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, model, owner=None):
        if model is None:
            return self
        read = operator.attrgetter(f"{self.part}.{self.weight}")
        try:
            if self.stacked:
                return torch.stack([read(block) for block in model.blocks])
            return read(model)
        except AttributeError:
            raise AttributeError(self.missing(model)) from None

    def missing(self, model) -> str:
        for holder in model.blocks if self.stacked else [model]:  # a part that knows why it lacks the weight says so
            explain = getattr(getattr(holder, self.part, None), "why_no_weight", None)
            if callable(explain) and not hasattr(getattr(holder, self.part), self.weight):
                return f"{self.name}: {explain(self.weight)}"
        reason = MISSING_PART.get(self.part, f"its parts have no {self.part}.{self.weight}")
        return f"{self.name}: {reason}"


# The weights a model (and a stack) gives stacked over blocks, per part, in this order, with their shapes
ATTENTION_WEIGHTS = {
    "W_Q": "layer head_index d_model d_head",
    "W_K": "layer head_index d_model d_head",
    "W_V": "layer head_index d_model d_head",
    "W_O": "layer head_index d_head d_model",
    "b_Q": "layer head_index d_head",
    "b_K": "layer head_index d_head",
    "b_V": "layer head_index d_head",
    "b_O": "layer d_model",
}
MLP_WEIGHTS = {
    "W_in": "layer d_model d_mlp",
    "b_in": "layer d_mlp",
    "W_out": "layer d_mlp d_model",
    "b_out": "layer d_model",
}


def stacked_views(part: str, weights: dict[str, str]) -> tuple[WeightView, ...]:
    """One ``WeightView`` per weight of ``weights`` (name -> shape), read from ``blocks[L].<part>``, in that order."""
    return tuple(WeightView(part, weight, shape, stacked=True) for weight, shape in weights.items())


class HookedTransformerBase(TextMethods, CachingMixin, HookedRootModule):
    """The shared base of hooked models (see the module docstring)."""

    kind = "model"  # "decoder" or "encoder": what from_pretrained of a subclass accepts

    parts_class: type  # what the architecture builds for this model class: DecoderParts, EncoderParts, ...

    def __init__(
        self,
        cfg,
        tokenizer=None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        seed: int | None = None,
    ):
        super().__init__()
        self.architecture: Architecture = architecture_of(cfg)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.processing: list[str] = []  # weight-processing steps applied, in order
        self.hold_parts(self.build_parts(self.parts_class))
        self.finish_init(seed, dtype, device)

    def hold_parts(self, parts) -> None:
        """Keep the built ``parts`` as this model's modules, in forward order, with the model-level hook points."""
        raise NotImplementedError(f"{type(self).__name__} must say how it holds its parts (hold_parts)")

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer text goes through (None: the model takes token ids only)."""
        return self.__dict__.get("_tokenizer")

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)
        self.__dict__["_tokenizer"] = tokenizer

    def check_tokenizer(self, tokenizer) -> None:
        """``TypeError`` unless this model's text methods can use ``tokenizer``: a Hugging Face tokenizer here."""
        from transformers import PreTrainedTokenizerBase

        if not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise TypeError(
                f"tokenizer must be a Hugging Face tokenizer (PreTrainedTokenizerBase) or None, received "
                f"{type(tokenizer).__name__}: {tokenizer!r:.60}"
            )

    def finish_init(self, seed: int | None, dtype: torch.dtype, device: str | torch.device | None) -> None:
        """Initialize the weights, place them, and name every hook point: the end of each ``__init__``."""
        self.init_weights(seed)
        self.to(device=device, dtype=dtype)
        self.setup()

    def build_parts(self, composes: type):
        """The parts the architecture builds from ``cfg``, refused unless they are what this model class composes."""
        parts = self.architecture.build(self.cfg)
        if not isinstance(parts, composes):
            raise TypeError(
                f"a {type(self).__name__} composes {composes.__name__}, but architecture {self.architecture.name!r} "
                f"builds {type(parts).__name__}; build its own model class"
            )
        return parts

    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2's init: weight matrices (``W_*``) ~ N(0, init_range^2), biases 0, norm weights ``w`` = 1."""
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name, param in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1].lstrip("_")  # grouped key/value weights are stored as _W_K, _W_V
                if leaf.startswith("W_"):
                    param.copy_(torch.randn(param.shape, generator=generator) * self.cfg.init_range)
                elif leaf == "w":
                    param.fill_(1.0)
                else:
                    param.zero_()

    # --- the facts tools ask -------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self.architecture.capabilities(self.cfg)

    @property
    def hook_names(self) -> HookNames | EncoderDecoderHookNames:
        names = self.architecture.hook_names
        return names(self.cfg) if callable(names) else names  # a table, or one per config (as capabilities)

    def act_name(self, name: str, layer: int | None = None, sub: str | None = None) -> str:
        """The full hook name of a short one in this model: ``act_name("pattern", 0) ==
        "blocks.0.attn.hook_pattern"``."""
        return self.hook_names.full_name(name, layer, sub, n_layers=self.cfg.n_layers)

    @property
    def final_norm(self) -> nn.Module | None:
        """The norm that reads the final residual stream before the read-out, or None."""
        path = self.capabilities.final_norm
        return operator.attrgetter(path)(self) if path is not None else None

    @property
    def read_out(self) -> Part | None:
        """The linear map from the final norm's output to the logits, or None."""
        path = self.capabilities.read_out
        return operator.attrgetter(path)(self) if path is not None else None

    @property
    def logit_softcap(self) -> float | None:
        """The read-out's soft-cap: logits are ``cap * tanh(read_out(x) / cap)`` (Gemma 2), or None."""
        read_out = self.read_out
        return None if read_out is None else read_out.softcap

    def writer_blocks(self) -> list[Part]:
        """The blocks of the stack the logits come from (an encoder-decoder's decoder), whose writers tools read."""
        return list(self.blocks)

    WRITER_QUESTIONS = ("reads_source", "routes_tokens")

    def writers_that(self, question: str) -> list:
        """The writers of ``writer_blocks`` that answer yes to ``question``, in order: ``"reads_source"`` (it
        attends to another stack's output: cross-attention) or ``"routes_tokens"`` (a mixture of experts).

        Tools ask the writers this rather than the model's family (an empty list: no such writer).
        """
        if question not in self.WRITER_QUESTIONS:
            close = difflib.get_close_matches(str(question), self.WRITER_QUESTIONS, n=1)
            raise KeyError(f"question must be one of {self.WRITER_QUESTIONS}, got {question!r}; closest: {close}")
        return [writer for block in self.writer_blocks() for writer in block.writers() if getattr(writer, question)]

    @property
    def has_experts(self) -> bool:
        """Some block's MLP is a mixture of experts (a writer that routes tokens)."""
        return bool(self.writers_that("routes_tokens"))

    @property
    def has_cross_attention(self) -> bool:
        """Some block attends to another stack's output (an encoder-decoder's decoder)."""
        return bool(self.writers_that("reads_source"))

    def check_stop_at_layer(self, stop_at_layer: int | None) -> int:
        """How many blocks to run: ``n_layers`` for None, else ``stop_at_layer`` (negative counts from the end)."""
        return check_stop_at_layer(stop_at_layer, self.cfg.n_layers)

    def default_backward_metric(self, output: Tensor, model_args: tuple) -> Tensor:
        """What ``run_with_cache(incl_bwd=True)`` differentiates when no metric is given: the mean next-token loss."""
        if not self.capabilities.next_token_logits:
            raise ValueError(
                "run_with_cache(incl_bwd=True) on this model needs backward_metric=fn(output) -> scalar: "
                "its output is not next-token logits, so there is no next-token loss to default to"
            )
        return lm_loss(output, self.prepare_tokens(model_args[0]))

    @classmethod
    def from_pretrained(cls, source, **kwargs):
        """Load a checkpoint of this class's kind; see ``interp_transformer.loading.from_pretrained`` for the arguments.

        A checkpoint of another kind raises ``ValueError`` naming the class that loads it;
        ``interp_transformer.from_pretrained`` returns whatever the checkpoint holds.
        """
        model = service("from_pretrained")(source, **kwargs)
        if not isinstance(model, cls):
            a = lambda word: ("an " if word[0].lower() in "aeiou" else "a ") + word  # noqa: E731
            raise ValueError(
                f"{source!r:.80} holds {a(type(model).__name__)}, not {a(cls.kind)}; load it with "
                f"{type(model).__name__}.from_pretrained or interp_transformer.from_pretrained"
            )
        return model

    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(
                f"this model has no tokenizer: pass token ids, or set model.tokenizer ({self.TOKENIZER_HINT})"
            )
        return self.tokenizer

    TOKENIZER_HINT = "a Hugging Face tokenizer"

    # --- weights, read where their parts keep them -----------------------------------------
    W_E = WeightView("embed", "W_E", "d_vocab d_model")
    W_pos = WeightView("pos_embed", "W_pos", "n_ctx d_model")
    W_U = WeightView("unembed", "W_U", "d_model d_vocab")
    b_U = WeightView("unembed", "b_U", "d_vocab")
    W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O = stacked_views("attn", ATTENTION_WEIGHTS)
    W_in, b_in, W_out, b_out = stacked_views("mlp", MLP_WEIGHTS)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            view = getattr(type(self), name, None)
            if isinstance(view, WeightView):  # Python retries here when a view's part is missing: keep its reason
                raise AttributeError(view.missing(self)) from None
            raise

    @property
    def QK(self):
        """``W_Q W_K^T`` per layer and head, as a ``FactoredMatrix [layer, head_index, d_model, d_model]``."""
        from interp_transformer.circuits.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self):
        """``W_V W_O`` per layer and head, as a ``FactoredMatrix [layer, head_index, d_model, d_model]``."""
        from interp_transformer.circuits.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    # --- sparse autoencoders (interp_transformer.sae): the splice verbs as methods ---------------
    def saes(self, saes, **kwargs):
        """``with model.saes([sae], use_error_term=...):``, the SAEs spliced in for the body (``sae.splice_saes``)."""
        return service("splice_saes")(self, saes, **kwargs)

    def run_with_saes(self, *model_args, saes, **kwargs):
        """``model(*model_args)`` with ``saes`` spliced in for this one call (``sae.run_with_saes``)."""
        return service("run_with_saes")(self, *model_args, saes=saes, **kwargs)

    def run_with_cache_with_saes(self, *model_args, saes, **kwargs):
        """``run_with_cache`` with ``saes`` spliced in: ``(output, cache)``, their activations cached
        (``sae.run_with_cache_with_saes``)."""
        return service("run_with_cache_with_saes")(self, *model_args, saes=saes, **kwargs)

    def tokens_to_residual_directions(self, tokens) -> Float[Tensor, "... d_model"]:
        """Unembedding directions ``W_U[:, token]``, shape ``tokens.shape + (d_model,)``."""
        return unembedding_directions(self.W_U, tokens)


def unembedding_directions(W_U: Tensor, tokens) -> Tensor:
    """Columns ``W_U[:, token]`` of ``W_U [d_model, d_vocab]``: shape ``tokens.shape + (d_model,)``.

    ``tokens`` is an int or an integer tensor of ids in ``[0, d_vocab)``; anything else
    raises ``TypeError`` / ``ValueError`` naming what was received.
    """
    d_vocab = W_U.shape[1]
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an int or an integer tensor, got {tokens!r:.80}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab):
        raise ValueError(f"token ids must lie in [0, d_vocab={d_vocab}), got {tokens.tolist()}")
    return W_U[:, tokens.to(W_U.device)].movedim(0, -1)


__all__ = [
    "ATTENTION_WEIGHTS",
    "MLP_WEIGHTS",
    "HookedTransformerBase",
    "WeightView",
    "stacked_views",
    "unembedding_directions",
]

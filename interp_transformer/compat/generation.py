"""TransformerLens' ``generate``: its arguments, defaults and return types, over our key/value cache.

``generate(input, max_new_tokens=10, stop_at_eos=True, eos_token_id=None, do_sample=True,
top_k=None, top_p=None, temperature=1.0, freq_penalty=0.0, use_past_kv_cache=True,
prepend_bos=None, padding_side=None, return_type="input", verbose=True)``:

- ``input``: a text, a list of texts (padded on the left, with their mask), token ids
  ``[batch, pos]``, or embeddings ``[batch, pos, d_model]``;
- ``return_type``: ``"input"`` (the input's kind), ``"str"`` (decoded, special tokens
  skipped, one str for one sequence), ``"tokens"`` (``[batch, pos + new]``), ``"embeds"``
  (the token embeddings of every position);
- a finished sequence (it emitted an EOS id) is padded with EOS; generation stops when
  every sequence is finished;
- ``output_logits=True`` returns Hugging Face's ``GenerateDecoderOnlyOutput(sequences,
  logits)`` (one ``[batch, d_vocab]`` per step); ``return_dict_in_generate`` is ignored and
  any other Hugging Face keyword is ignored with a ``UserWarning``.

With the cache, the prompt runs once and every later step feeds one token; the padding the
prompt had stays masked (``interp_transformer.core.kv_cache``).
"""

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.compat.errors import CompatValueError
from interp_transformer.compat.losses import get_attention_mask, sample_logits
from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.core.token_checks import is_text

RETURN_TYPES = ("input", "str", "tokens", "embeds")


class GenerationMethods:
    """``HookedTransformer.generate`` (see the module docstring)."""

    if TYPE_CHECKING:  # a mixin of the model class: it reads that class's attributes and calls its forward

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    @torch.no_grad()
    def generate(
        self,
        input: str | list | Tensor = "",
        max_new_tokens: int = 10,
        stop_at_eos: bool = True,
        eos_token_id: int | Sequence[int] | None = None,
        do_sample: bool = True,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float = 1.0,
        freq_penalty: float = 0.0,
        use_past_kv_cache: bool = True,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        return_type: str | None = "input",
        verbose: bool = True,
        **generation_kwargs,
    ):
        """Extend ``input`` by up to ``max_new_tokens`` tokens (see the module docstring)."""
        if return_type not in RETURN_TYPES:
            raise CompatValueError(f"return_type must be one of {list(RETURN_TYPES)}, got {return_type!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise CompatValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        output_logits = _read_generation_kwargs(generation_kwargs)
        tokens, embeds, mask, kind = self._generation_inputs(input, prepend_bos, padding_side)
        if return_type == "input":
            return_type = {"text": "str", "tokens": "tokens", "embeds": "embeds"}[kind]
        batch, prompt_len = (tokens if tokens is not None else embeds).shape[:2]
        if prompt_len + max_new_tokens > self.cfg.n_ctx:
            raise CompatValueError(
                f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} exceeds n_ctx={self.cfg.n_ctx}"
            )
        stop_ids, eos_for_padding = self._stop_tokens(stop_at_eos, eos_token_id)
        device = self.W_E.device
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        cache = KeyValueCache(self.cfg.n_layers) if use_past_kv_cache and tokens is not None else None
        sampled: list[Tensor] = []
        step_logits: list[Tensor] = []
        self.eval()
        for step in tqdm(range(max_new_tokens), disable=not verbose):
            so_far = torch.cat([mask, torch.ones(batch, step, dtype=mask.dtype, device=device)], dim=1)
            if tokens is None:  # embeddings in: the whole sequence again, from the first block
                logits = self._logits_from_embeds(torch.cat([embeds, *[self.embed(t) for t in sampled]], dim=1), so_far)
            elif cache is not None:
                step_input, step_mask = (tokens, mask) if step == 0 else (sampled[-1], so_far[:, -1:])
                logits = self(step_input, attention_mask=step_mask, kv_cache=cache)
            else:
                logits = self(torch.cat([tokens, *sampled], dim=1), attention_mask=so_far)
            final_logits = logits[:, -1, :]
            if output_logits:
                step_logits.append(final_logits.clone())
            if do_sample:
                history = torch.cat([tokens, *sampled], dim=1) if tokens is not None else None
                new = sample_logits(
                    final_logits, top_k, top_p, temperature, freq_penalty if history is not None else 0.0, history
                )
            else:
                new = final_logits.argmax(dim=-1)
            new = new.to(device)
            if stop_ids:
                new = torch.where(finished, torch.full_like(new, eos_for_padding), new)
                finished |= torch.isin(new, torch.tensor(stop_ids, device=device))
            sampled.append(new[:, None])
            if stop_ids and bool(finished.all()):
                break
        new_tokens = torch.cat(sampled, dim=1) if sampled else torch.zeros(batch, 0, dtype=torch.long, device=device)
        output_tokens = torch.cat([tokens, new_tokens], dim=1) if tokens is not None else new_tokens
        if return_type == "str":
            tokenizer = self._require_tokenizer()
            texts = [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in output_tokens]
            result = texts[0] if len(texts) == 1 else texts
        elif return_type == "tokens":
            result = output_tokens
        else:
            start = embeds if embeds is not None else self.embed(tokens)
            result = torch.cat([start, self.embed(new_tokens)], dim=1) if new_tokens.shape[1] else start
        if output_logits:
            from transformers.generation.utils import GenerateDecoderOnlyOutput

            # transformers annotates these as LongTensor and a tuple of one Tensor; a long tensor and one per step
            per_step = tuple(step_logits)
            return GenerateDecoderOnlyOutput(sequences=output_tokens, logits=per_step)  # type: ignore[arg-type]
        return result

    def _generation_inputs(self, input, prepend_bos, padding_side):
        """``(tokens, embeds, mask, kind)``: ids (None for embeddings), embeddings (None for ids), the prompt's mask."""
        device = self.W_E.device
        bos = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        if is_text(input) or input == "":
            if self.tokenizer is None:
                raise CompatValueError("Must provide a tokenizer if passing a string to the model")
            batched = isinstance(input, list) and len(input) > 1
            side = "left" if batched else padding_side  # left padding: every row's continuation follows its own text
            tokens = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=side)
            mask = get_attention_mask(self.tokenizer, tokens, bos, side)
            return tokens, None, mask, "text"
        if not isinstance(input, Tensor):
            raise TypeError(
                "input must be a str, a list of str, token ids [batch, pos] or embeddings [batch, pos, d_model], "
                f"got {type(input).__name__}"
            )
        if input.is_floating_point():
            if input.ndim != 3 or input.shape[-1] != self.cfg.d_model:
                raise CompatValueError(
                    f"embeddings must be [batch, pos, d_model={self.cfg.d_model}], got {tuple(input.shape)}"
                )
            return None, input.to(device), torch.ones(input.shape[:2], dtype=torch.long, device=device), "embeds"
        tokens = self.prepare_tokens(input)
        mask = (
            get_attention_mask(self.tokenizer, tokens, bos) if self.tokenizer is not None else torch.ones_like(tokens)
        )
        return tokens, None, mask, "tokens"

    def _stop_tokens(self, stop_at_eos: bool, eos_token_id) -> tuple[list, int]:
        """The ids that end a sequence, and the id that pads a finished one (none without ``stop_at_eos``)."""
        if not stop_at_eos:
            return [], 0
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        if eos_token_id is None:
            if tokenizer_eos is None:
                raise CompatValueError(
                    "Must pass a eos_token_id if stop_at_eos is True and tokenizer is None or has no eos_token_id"
                )
            eos_token_id = tokenizer_eos
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if not ids or not all(isinstance(i, int) and 0 <= i < self.cfg.d_vocab_out for i in ids):
            raise CompatValueError(
                f"eos_token_id must be token id(s) in [0, d_vocab_out={self.cfg.d_vocab_out}), got {eos_token_id!r}"
            )
        return ids, (tokenizer_eos if tokenizer_eos is not None and not isinstance(eos_token_id, int) else ids[0])

    def _logits_from_embeds(self, embeds: Tensor, mask: Tensor) -> Tensor:
        """Logits of a sequence given as token embeddings: positions added as the model adds them, then every block."""
        from interp_transformer.parts import TokenLayout

        layout = TokenLayout.from_attention_mask(mask)
        shortformer = None
        residual = embeds
        if self.pos_embed is not None:
            dummy = torch.zeros(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            positions = self.hook_pos_embed(self.pos_embed(dummy, 0, layout.positions))
            if self.cfg.positional_embedding_type == "shortformer":
                shortformer = positions
            else:
                residual = residual + positions
        return self(residual, start_at_layer=0, attention_mask=mask, shortformer_pos_embed=shortformer)


def _read_generation_kwargs(kwargs: dict) -> bool:
    """Whether ``output_logits`` was asked for; ``return_dict_in_generate`` is ignored, anything else warned about."""
    output_logits = bool(kwargs.pop("output_logits", False))
    kwargs.pop("return_dict_in_generate", None)
    if kwargs:
        warnings.warn(
            f"HookedTransformer.generate received unsupported generation kwargs; ignoring: {sorted(kwargs)}",
            UserWarning,
            stacklevel=3,
        )
    return output_logits


__all__ = ["GenerationMethods"]

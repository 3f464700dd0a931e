"""TransformerLens' split inputs and per-head results: what ``Attention`` does when built with those options.

``Attention(split_inputs=True)`` (every TransformerLens-compatible model's attention) lets its queries,
keys and values read different inputs, each ``[batch, pos, d_model]`` or one per head ``[batch, pos,
head_index, d_model]``, and takes TransformerLens' call ``attn(query_input=x, key_input=x,
value_input=x, past_kv_cache_entry=None, attention_mask=None)`` (``transformer_lens_call``, then
``attend_inputs``). Given one shared input it computes exactly what the plain call does.

``Attention(result_hook=True)`` (``use_attn_result``) adds ``hook_result`` ``[batch, pos, head_index,
d_model]`` = ``z_h W_O[h]``, and ``attn_out = sum_h result_h + b_O`` (``hooked_results_sum``).
While nothing hooks it the result is not even formed; while hooks only read it (the hooked tensor is
the one handed in, not written in place, no gradient observer), ``attn_out`` is the core's own
product, so every other activation is the core's, bit for bit.
"""

import einops
from torch import Tensor

from interp_transformer.core.errors import CompatValueError
from interp_transformer.parts.layout import TokenLayout


def untouched(hooked: Tensor, handed_in: Tensor, version: int, hook) -> bool:
    """Whether a hook point left its value as it was: the same tensor, not written in place, no gradient observer."""
    return hooked is handed_in and hooked._version == version and not hook.has_hooks("bwd")


def transformer_lens_call(
    attn,
    normalized: Tensor | None,
    kv_input: Tensor | None,
    layout: TokenLayout | None,
    kv_cache,
    inputs: tuple[Tensor | None, Tensor | None, Tensor | None],
    attention_mask: Tensor | None,
) -> Tensor:
    """``attn(query_input=..., key_input=..., value_input=...)``: ``inputs`` are the three; a missing key input is
    the query input, a missing value input the key input."""
    query_input, key_input, value_input = inputs
    if query_input is None:
        if attn.split_inputs:
            raise TypeError(
                "attention needs its input: attn(normalized) or attn(query_input=..., key_input=..., value_input=...)"
            )
        raise TypeError("attention needs its input: attn(normalized)")
    if not attn.split_inputs:
        raise TypeError(
            "query_input=, key_input=, value_input= are TransformerLens' call of an attention with split inputs: "
            "build it with Attention(..., split_inputs=True), or call attn(normalized)"
        )
    if normalized is not None or kv_input is not None:
        raise TypeError("pass the input once: positionally (normalized) or as query_input/key_input/value_input")
    if attention_mask is not None and layout is None:
        layout = TokenLayout.from_attention_mask(attention_mask.to(query_input.device))
    key_input = query_input if key_input is None else key_input
    value_input = key_input if value_input is None else value_input
    return attend_inputs(attn, query_input, key_input, value_input, layout, kv_cache)


def attend_inputs(
    attn,
    query_input: Tensor,
    key_input: Tensor,
    value_input: Tensor,
    layout: TokenLayout | None = None,
    kv_cache=None,
) -> Tensor:
    """``q = query_input W_Q + b_Q``, ``k`` and ``v`` likewise from their own inputs: ``Attention.attend``.

    Each input is ``[batch, pos, d_model]`` (read by every head) or ``[batch, pos, head_index, d_model]``
    (one per head). One shared ``[batch, pos, d_model]`` input is the plain call ``attn(normalized)``.
    """
    if query_input is key_input is value_input and query_input.ndim == 3:
        return attn.forward(query_input, layout, kv_cache)
    for name, x, heads in (
        ("query_input", query_input, attn.n_heads),
        ("key_input", key_input, attn.n_key_value_heads),
        ("value_input", value_input, attn.n_key_value_heads),
    ):
        if x.ndim not in (3, 4) or (x.ndim == 4 and x.shape[2] != heads):
            raise CompatValueError(
                f"{name} must be [batch, pos, d_model] or one per head [batch, pos, {heads}, d_model], "
                f"got shape {tuple(x.shape)}"
            )
    if layout is None:  # a standalone call: one fresh, unpadded sequence per row
        offset = kv_cache.n_positions if kv_cache is not None and hasattr(kv_cache, "n_positions") else 0
        if kv_cache is not None and hasattr(kv_cache, "past_keys"):
            offset = kv_cache.past_keys.shape[1]
        layout = TokenLayout.contiguous(query_input.shape[0], query_input.shape[1], offset, query_input.device)
    return attn.attend(query_input, key_input, value_input, layout, kv_cache)


def hooked_results_sum(attn, z: Tensor) -> Tensor | None:
    """``attn_out = sum_h result_h + b_O`` of the results ``attn.hook_result`` hands on, or None where its hooks left
    them as they were (then ``attn_out`` is the core's own product)."""
    result = einops.einsum(
        z, attn.W_O, "batch pos head_index d_head, head_index d_head d_model -> batch pos head_index d_model"
    )
    version = result._version
    hooked = attn.hook_result(result)
    if untouched(hooked, result, version, attn.hook_result):
        return None
    return einops.reduce(hooked, "batch pos head_index d_model -> batch pos d_model", "sum") + attn.b_O


__all__ = ["attend_inputs", "hooked_results_sum", "transformer_lens_call", "untouched"]

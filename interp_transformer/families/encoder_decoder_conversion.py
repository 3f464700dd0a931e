"""What the encoder-decoder converters share: per-head weight layouts and key names.

``nn.Linear`` weights are stored ``[out, in]``; ours are ``[in, out]``, split per head::

    q/k/v projection [(head_index d_head), d_model]  -> W_Q/W_K/W_V [head_index, d_model, d_head]
    q/k/v bias       [(head_index d_head)]           -> b_Q/b_K/b_V [head_index, d_head]
    output proj.     [d_model, (head_index d_head)]  -> W_O [head_index, d_head, d_model]
    MLP in / out     [d_mlp, d_model] / [d_model, d_mlp] -> W_in [d_model, d_mlp] / W_out [d_mlp, d_model]

Their references read Hugging Face's activations with ``reference.Recorder``, as every family's.
"""

from collections.abc import Callable, Mapping
from typing import Any

import einops
import torch
from torch import Tensor


def fresh(tensor: Tensor) -> Tensor:
    """A contiguous copy: our weights never alias the source's (weight processing edits them in place)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def strip_prefix(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def special_token_ids(hf_config) -> dict[str, int]:
    """``pad_token_id``, ``eos_token_id`` and ``decoder_start_token_id`` of a Hugging Face config, one id each."""
    special: dict[str, Any] = {
        name: getattr(hf_config, name, None) for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id")
    }
    if isinstance(special["eos_token_id"], (list, tuple)) and len(special["eos_token_id"]) == 1:
        special["eos_token_id"] = special["eos_token_id"][0]
    missing = [name for name, value in special.items() if isinstance(value, bool) or not isinstance(value, int)]
    if missing:
        raise ValueError(
            f"the config must give {missing} as one token id each, got {[special[name] for name in missing]}"
        )
    return special


def attention_weights(
    read: Callable[[str], Tensor], hf: str, ours: str, n_heads: int, names: Mapping[str, str], bias: bool
) -> dict[str, Tensor]:
    """Our ``W_Q ... b_O`` from the projections ``hf + names[letter]`` (``names``: ``{"Q": "q_proj", ..., "O":
    "out_proj"}``)."""
    per_head = {"head_index": n_heads}
    converted = {}
    for letter in "QKV":
        converted[ours + f"W_{letter}"] = fresh(
            einops.rearrange(
                read(hf + names[letter] + ".weight"),
                "(head_index d_head) d_model -> head_index d_model d_head",
                **per_head,
            )
        )
        if bias:
            converted[ours + f"b_{letter}"] = fresh(
                einops.rearrange(
                    read(hf + names[letter] + ".bias"), "(head_index d_head) -> head_index d_head", **per_head
                )
            )
    converted[ours + "W_O"] = fresh(
        einops.rearrange(
            read(hf + names["O"] + ".weight"), "d_model (head_index d_head) -> head_index d_head d_model", **per_head
        )
    )
    if bias:
        converted[ours + "b_O"] = fresh(read(hf + names["O"] + ".bias"))
    return converted


def zero_attention_biases(ours: str, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``b_Q, b_K, b_V [head_index, d_head]`` and ``b_O [d_model]`` as zeros, for attention without biases (T5)."""
    W_Q, W_O = weights[ours + "W_Q"], weights[ours + "W_O"]
    zeros = lambda *shape: torch.zeros(shape, dtype=W_Q.dtype, device=W_Q.device)  # noqa: E731
    n_heads, _, d_head = W_Q.shape
    return {**{ours + f"b_{letter}": zeros(n_heads, d_head) for letter in "QKV"}, ours + "b_O": zeros(W_O.shape[-1])}


def mlp_in(weight: Tensor) -> Tensor:
    return fresh(einops.rearrange(weight, "d_mlp d_model -> d_model d_mlp"))


def mlp_out(weight: Tensor) -> Tensor:
    return fresh(einops.rearrange(weight, "d_model d_mlp -> d_mlp d_model"))


def attention_shapes(prefix: str, names: Mapping[str, str], d_model: int, bias: bool) -> dict[str, tuple[int, ...]]:
    """Shapes of one attention's four projections ``prefix + names[letter]`` (d_model in and out)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for letter in "QKVO":
        shapes[prefix + names[letter] + ".weight"] = (d_model, d_model)
        if bias:
            shapes[prefix + names[letter] + ".bias"] = (d_model,)
    return shapes


__all__ = [
    "attention_shapes",
    "attention_weights",
    "fresh",
    "mlp_in",
    "mlp_out",
    "special_token_ids",
    "strip_prefix",
    "zero_attention_biases",
]

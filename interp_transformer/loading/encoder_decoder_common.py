"""What the encoder-decoder converters share: per-head weight layouts, key names, and reading Hugging Face's
activations.

``nn.Linear`` weights are stored ``[out, in]``; ours are ``[in, out]``, split per head::

    q/k/v projection [(head_index d_head), d_model]  -> W_Q/W_K/W_V [head_index, d_model, d_head]
    q/k/v bias       [(head_index d_head)]           -> b_Q/b_K/b_V [head_index, d_head]
    output proj.     [d_model, (head_index d_head)]  -> W_O [head_index, d_head, d_model]
    MLP in / out     [d_mlp, d_model] / [d_model, d_mlp] -> W_in [d_model, d_mlp] / W_out [d_mlp, d_model]

``ActivationRecorder`` reads a Hugging Face model's activations with torch hooks on its
modules (its own tensors, not recomputed), under our hook names, and removes every hook
afterwards, also when the run raises.
"""

from typing import Callable, Mapping, Optional

import einops
import torch
from torch import Tensor, nn

from .hf_hooks import current_attention

SPLIT_HEADS = "batch pos (head_index d_head) -> batch pos head_index d_head"


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
    special = {
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
    shapes = {}
    for letter in "QKVO":
        shapes[prefix + names[letter] + ".weight"] = (d_model, d_model)
        if bias:
            shapes[prefix + names[letter] + ".bias"] = (d_model,)
    return shapes


class ActivationRecorder:
    """Torch hooks on a Hugging Face model's modules that record activations under our names (see the module docstring).

    ``stack`` tells which stack is running (set by pre-hooks on the two stacks), for modules
    both stacks share.
    """

    def __init__(self) -> None:
        self.acts: dict[str, Tensor] = {}
        self.handles: list = []
        self.stack: Optional[str] = None

    def output(
        self,
        module: nn.Module,
        name: str,
        transform: Callable[[Tensor], Tensor] = lambda t: t,
        pick: Callable = lambda out: out[0] if isinstance(out, tuple) else out,
    ) -> None:
        """Record ``transform(pick(output))`` of ``module`` as ``name`` (``{stack}`` in it is filled in)."""

        def hook(mod, args, out):
            self.acts[name.format(stack=self.stack)] = transform(pick(out)).detach().clone()

        self.handles.append(module.register_forward_hook(hook))

    def input(self, module: nn.Module, name: str, transform: Callable[[Tensor], Tensor] = lambda t: t) -> None:
        """Record ``transform(first input)`` of ``module`` as ``name``."""

        def hook(mod, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self.acts[name.format(stack=self.stack)] = transform(x).detach().clone()

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def mark_stack(self, module: nn.Module, stack: str) -> None:
        """While ``module`` runs, ``{stack}`` in names means ``stack``."""
        self.handles.append(module.register_forward_pre_hook(lambda mod, args: setattr(self, "stack", stack)))

    def run(self, hf_model: nn.Module, call: Callable[[], object]) -> tuple[dict[str, Tensor], object]:
        """Call ``call()`` in eval mode with eager attention (patterns visible); every hook is removed afterwards."""
        previous_attention, was_training = current_attention(hf_model), hf_model.training
        try:
            hf_model.set_attn_implementation("eager")
            hf_model.eval()
            with torch.no_grad():
                result = call()
        finally:
            for handle in self.handles:
                handle.remove()
            hf_model.set_attn_implementation(previous_attention)
            hf_model.train(was_training)
        return self.acts, result


__all__ = [
    "ActivationRecorder",
    "SPLIT_HEADS",
    "attention_shapes",
    "attention_weights",
    "fresh",
    "mlp_in",
    "mlp_out",
    "special_token_ids",
    "strip_prefix",
    "zero_attention_biases",
]

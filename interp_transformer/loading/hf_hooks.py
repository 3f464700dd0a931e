"""Reading a Hugging Face model's activations under our hook names, shared by the converters' references.

``Recorder`` puts torch hooks on Hugging Face's modules and keeps what they see, so a
reference value is Hugging Face's own tensor, not a recomputation: a module's output
(the first element of a tuple output) or its first input, optionally reshaped. A
LayerNorm's ``hook_scale``, which Hugging Face never forms, is derived from the input its
norm received, ``sqrt(mean((x - mean(x))^2) + eps)``.

``reference_run`` runs a model the way a reference must run: eval mode, eager attention
(so that patterns are visible), and, for a float64 model, float64 arithmetic throughout.
Hugging Face computes the eager softmax (and some models their attention scores) in
float32 whatever the model's dtype, a choice made for half precision; its float64 run is
then only float32-accurate there, and a float64 re-check could not tell rounding from a
bug. For models that choose their attention through ``transformers``' ``AttentionInterface``
(GPT-NeoX, OPT), a float64 run uses ``eager_attention_in_input_dtype``, the same formula
with the softmax in the input's dtype; models that compute attention in their own forward
(GPT-J, BLOOM) are patched by their converters for the call. Every other dtype runs
Hugging Face's code unchanged.
"""

import contextlib
from typing import Callable, Optional

import einops
import torch
from torch import Tensor, nn

from .versions import SUPPORTED_TRANSFORMERS, installed_transformers

FLOAT64_MHA_ATTENTION = "interp_transformer_eager_mha_in_input_dtype"
SPLIT_HEADS = "batch pos (head_index d_head) -> batch pos head_index d_head"


class Recorder:
    """Torch hooks on Hugging Face modules that keep each value under one of our hook names; ``remove()`` them after."""

    def __init__(self) -> None:
        self.acts: dict[str, Tensor] = {}
        self.handles: list = []

    def output(self, module: nn.Module, name: str, transform: Callable[[Tensor], Tensor] = lambda out: out) -> None:
        """Keep ``transform(output)`` of ``module`` (the first element when it returns a tuple) as ``name``."""

        def hook(m, args, out):
            self.acts[name] = transform(out[0] if isinstance(out, tuple) else out).detach()

        self.handles.append(module.register_forward_hook(hook))

    def input(self, module: nn.Module, name: str, transform: Callable[[Tensor], Tensor] = lambda x: x) -> None:
        """Keep ``transform(first input)`` of ``module`` (positional, or the ``hidden_states`` keyword) as ``name``."""

        def hook(m, args, kwargs):
            self.acts[name] = transform(args[0] if args else kwargs["hidden_states"]).detach()

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def outputs(self, module: nn.Module, names: tuple[str, ...]) -> None:
        """Keep each element of ``module``'s tuple output under its name (e.g. a rotary module's ``(sin, cos)``)."""

        def hook(m, args, out):
            if not isinstance(out, tuple) or len(out) != len(names):
                raise ValueError(
                    unsupported_transformers(
                        f"{type(m).__name__} returning {type(out).__name__}, not the "
                        f"{len(names)} tensors {names} the reference reads"
                    )
                )
            self.acts.update({name: value.detach() for name, value in zip(names, out)})

        self.handles.append(module.register_forward_hook(hook))

    def pattern(self, attention: nn.Module, name: str) -> None:
        """Keep the attention weights, the second element of ``attention``'s output, as ``name``."""
        self.handles.append(
            attention.register_forward_hook(lambda m, args, out: self.acts.__setitem__(name, out[1].detach()))
        )

    def kwargs(self, module: nn.Module, store: Callable[[dict], None]) -> None:
        """Hand ``module``'s keyword arguments to ``store`` on every call (e.g. the rotary cos/sin it was given)."""
        self.handles.append(module.register_forward_pre_hook(lambda m, args, kwargs: store(kwargs), with_kwargs=True))

    def layer_norm(self, norm: nn.Module, prefix: str, transform: Callable[[Tensor], Tensor] = lambda x: x) -> None:
        """``prefix + "hook_scale"`` from a LayerNorm's input and ``prefix + "hook_normalized"``, its output."""
        eps = norm.eps
        self.input(norm, prefix + "hook_scale", lambda x: transform(layer_norm_scale(x, eps)))
        self.output(norm, prefix + "hook_normalized", transform)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def unsupported_transformers(what: str) -> str:
    """A message for a Hugging Face model whose structure the references cannot read, naming the supported versions."""
    return (
        f"the Hugging Face reference cannot read {what} (transformers {installed_transformers()}); the "
        f"references are tested with transformers {SUPPORTED_TRANSFORMERS}: install a version in that range"
    )


def current_attention(hf_model) -> str:
    """The attention implementation a Hugging Face model runs now, to restore after a reference run.

    ``config._attn_implementation`` is how Hugging Face's documentation says to read it; it is
    read here and nowhere else, and a model without it gets a ``ValueError`` naming the
    supported versions, not an ``AttributeError``.
    """
    value = getattr(hf_model.config, "_attn_implementation", None)
    if value is not None and not isinstance(value, str):
        raise ValueError(unsupported_transformers(f"the attention implementation ({type(value).__name__})"))
    return value or "eager"


def layer_norm_scale(x: Tensor, eps: float) -> Tensor:
    """``sqrt(mean((x - mean(x))^2) + eps)`` over the last axis: our LayerNorm's ``hook_scale`` of its input ``x``."""
    centred = x - x.mean(dim=-1, keepdim=True)
    return (centred.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()


def split_heads(d_head: int) -> Callable[[Tensor], Tensor]:
    """``[batch, pos, (head_index d_head)] -> [batch, pos, head_index, d_head]``."""
    return lambda x: einops.rearrange(x, SPLIT_HEADS, d_head=d_head)


def eager_attention_in_input_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Hugging Face's eager attention for heads without grouping, softmax in the input's dtype.

    ``[batch, head_index, pos, d_head]`` in, ``(z [batch, pos, head_index, d_head], pattern)`` out.
    """
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = weights.softmax(dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def reference_run(
    hf_model, float64: bool, interface: bool = True, patches: Optional[contextlib.AbstractContextManager] = None
):
    """Eval mode and eager attention for the call (see the module docstring); restored afterwards.

    ``interface``: the model picks its attention through ``AttentionInterface`` (switched to
    eager, or in float64 to ``eager_attention_in_input_dtype``); otherwise it is left as it is.
    ``patches``: a context manager the converter enters around the call (its float64 patches).
    """
    previous_attention, was_training = current_attention(hf_model), hf_model.training
    try:
        if interface:
            if float64:
                from transformers import AttentionInterface
                from transformers.masking_utils import AttentionMaskInterface, eager_mask

                AttentionInterface.register(FLOAT64_MHA_ATTENTION, eager_attention_in_input_dtype)
                AttentionMaskInterface.register(FLOAT64_MHA_ATTENTION, eager_mask)
            hf_model.set_attn_implementation(FLOAT64_MHA_ATTENTION if float64 else "eager")
        hf_model.eval()
        with patches if patches is not None else contextlib.nullcontext(), torch.no_grad():
            yield
    finally:
        if interface:
            hf_model.set_attn_implementation(previous_attention)
        hf_model.train(was_training)


def collect(
    hf_model,
    recorder: Recorder,
    tokens: Tensor,
    forward_kwargs: dict,
    *,
    interface: bool = True,
    patches: Optional[Callable[[], contextlib.AbstractContextManager]] = None,
) -> dict[str, Tensor]:
    """Run ``hf_model`` on ``tokens`` as a reference (``reference_run``) and return what ``recorder`` kept, plus
    ``"logits"``.

    The recorder's hooks are removed afterwards, also on error. ``patches`` makes the
    context manager a float64 run enters (a model whose float64 run needs patching).
    """
    weight = hf_model.get_input_embeddings().weight
    float64 = weight.dtype == torch.float64
    try:
        with reference_run(hf_model, float64, interface, patches() if float64 and patches is not None else None):
            output = hf_model(tokens.to(weight.device), use_cache=False, **forward_kwargs)
    finally:
        recorder.remove()
    acts = recorder.acts
    if getattr(output, "logits", None) is not None:
        acts["logits"] = output.logits.detach()
    return acts


def with_positions(forward_kwargs: dict) -> dict:
    """``forward_kwargs`` with ``position_ids`` counted from each row's first real token when a mask is given.

    Hugging Face's forward would number positions through the padding; ours (and its
    ``generate``) count from each row's first real token.
    """
    mask = forward_kwargs.get("attention_mask")
    if mask is None or "position_ids" in forward_kwargs:
        return forward_kwargs
    return {**forward_kwargs, "position_ids": (mask.long().cumsum(dim=-1) - 1).clamp(min=0)}


__all__ = [
    "FLOAT64_MHA_ATTENTION",
    "Recorder",
    "collect",
    "current_attention",
    "eager_attention_in_input_dtype",
    "layer_norm_scale",
    "reference_run",
    "split_heads",
    "unsupported_transformers",
    "with_positions",
]

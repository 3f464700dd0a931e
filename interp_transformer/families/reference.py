"""Hugging Face's own tensors under our hook names, for every family's reference: one recorder, one way to run.

``Recorder`` puts torch hooks on Hugging Face's modules and keeps what they see, so a
reference value is Hugging Face's own tensor, not a recomputation: a module's output (an
element of a tuple output) or its first input, optionally reshaped. The few values Hugging
Face never forms are derived from its own tensors, each said where it is: a norm's
``hook_scale`` from the input the norm received (``norm_scale``: LayerNorm
``sqrt(mean((x - mean(x))^2) + eps)`` or RMSNorm ``sqrt(mean(x^2) + eps)``, chosen by
``centred``), the rotated q/k from the cos/sin its model handed to the attention.

``reference_run`` runs a model the way a reference must run: eval mode, no gradients, eager
attention (so that patterns are visible) and, for a float64 model, float64 arithmetic
throughout. Hugging Face computes some steps in float32 whatever the model's dtype (the
eager softmax, RMSNorms, Gemma's norms, a router's softmax, BLOOM's ALiBi: choices made for
half precision), so its float64 run would be float32-accurate there and a float64 re-check
could not tell rounding from a bug. A float64 run therefore applies the float64 *patches*
the family names (the same formulas, computed in the input's dtype) for the call only, and
its attention runs ``FLOAT64_ATTENTION``: ``eager_attention_in_input_dtype``, Hugging Face's
eager attention (key/value groups, soft-capping and gpt-oss's sinks included) with its softmax
in the input's dtype, registered once through ``transformers``' public ``AttentionInterface``. Families
whose own eager attention already computes in the input's dtype, or is not the interface's
formula (GPT-2, BERT, the encoder-decoders), keep ``"eager"``; BLOOM, which does not choose
its attention through the interface, is left as it is. Every other dtype runs Hugging Face's
code unchanged. The rotary cos/sin stay float32 in both models: that is the models' math.

Padding: with an ``attention_mask``, Hugging Face's forward would number positions
``0 .. pos-1`` through the padding, while ours (and Hugging Face's ``generate``) count from
each row's first real token; ``with_positions`` gives the reference those ``position_ids``.

Hugging Face's private state is read in one place: ``current_attention`` and
``current_experts`` (the implementations to restore after a run).
"""

import contextlib
import functools
import sys
import types
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import einops
import torch
from jaxtyping import Int
from torch import Tensor, nn

from interp_transformer.families.versions import SUPPORTED_TRANSFORMERS, installed_transformers

FLOAT64_ATTENTION = "interp_transformer_eager_in_input_dtype"
SPLIT_HEADS = "batch pos (head_index d_head) -> batch pos head_index d_head"
TO_HEADS_FIRST = "batch pos head_index d_head -> batch head_index pos d_head"
FROM_HEADS_FIRST = "batch head_index pos d_head -> batch pos head_index d_head"

Patches = Callable[[nn.Module], list[AbstractContextManager]]
# A Hugging Face module the recorders read: its parts are attributes (block.self_attn, attn.q_proj) that torch's
# types give as `Tensor | Module` (nn.Module.__getattr__), so the recorders take them untyped
HFModule = Any


def same(x):
    return x


def no_patches(hf_model: nn.Module) -> list[AbstractContextManager]:
    return []


def norm_eps(norm: HFModule) -> float:
    """The epsilon of a Hugging Face norm (``variance_epsilon`` in Llama's and T5's RMSNorm, ``eps`` elsewhere)."""
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


def norm_scale(x: Tensor, eps: float, *, centred: bool, mean_square_dtype: torch.dtype | None = None) -> Tensor:
    """Our ``hook_scale`` of a norm's input ``x``, over the last axis, ``[..., 1]``.

    ``centred``: a LayerNorm's ``sqrt(mean((x - mean(x))^2) + eps)``; otherwise an RMSNorm's
    ``sqrt(mean(x^2) + eps)``. ``mean_square_dtype``: the dtype the mean square and its
    reciprocal root are taken in (T5's float32), the scale returned in ``x``'s dtype.
    """
    if centred:
        x = x - x.mean(dim=-1, keepdim=True)
    if mean_square_dtype is None:
        return (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()
    return 1.0 / torch.rsqrt(x.to(mean_square_dtype).pow(2).mean(dim=-1, keepdim=True) + eps).to(x.dtype)


class Recorder:
    """Torch hooks on Hugging Face modules that keep each value under one of our hook names in ``acts``.

    Every value is detached and copied when it is seen; ``remove()`` the hooks after the run.
    """

    def __init__(self) -> None:
        self.acts: dict[str, Tensor] = {}
        self.handles: list = []

    def keep(self, name: str, value: Tensor) -> None:
        self.acts[name] = value.detach().clone()

    def output(self, module: HFModule, name: str, transform: Callable = same, index: int = 0) -> None:
        """Keep ``transform(output)`` of ``module`` (element ``index`` when it returns a tuple) as ``name``."""
        self.handles.append(
            module.register_forward_hook(
                lambda m, args, out: self.keep(name, transform(out[index] if isinstance(out, tuple) else out))
            )
        )

    def input(self, module: HFModule, name: str, transform: Callable = same) -> None:
        """Keep ``transform(first input)`` of ``module`` (positional, or the ``hidden_states`` keyword) as ``name``."""
        self.handles.append(
            module.register_forward_pre_hook(
                lambda m, args, kwargs: self.keep(name, transform(args[0] if args else kwargs["hidden_states"])),
                with_kwargs=True,
            )
        )

    def outputs(self, module: HFModule, names: tuple[str, ...]) -> None:
        """Keep each element of ``module``'s tuple output under its name (e.g. a rotary module's ``(sin, cos)``)."""

        def hook(m, args, out):
            if not isinstance(out, tuple) or len(out) != len(names):
                raise ValueError(
                    unsupported_transformers(
                        f"{type(m).__name__} returning {type(out).__name__}, not the "
                        f"{len(names)} tensors {names} the reference reads"
                    )
                )
            for name, value in zip(names, out, strict=True):
                self.keep(name, value)

        self.handles.append(module.register_forward_hook(hook))

    def kwargs(self, module: HFModule, store: Callable[[dict], None]) -> None:
        """Hand ``module``'s keyword arguments to ``store`` on every call (e.g. the rotary cos/sin it was given)."""
        self.handles.append(module.register_forward_pre_hook(lambda m, args, kwargs: store(kwargs), with_kwargs=True))

    def norm(
        self,
        norm: HFModule,
        prefix: str,
        *,
        centred: bool,
        transform: Callable = same,
        mean_square_dtype: torch.dtype | None = None,
    ) -> None:
        """``prefix + "hook_scale"`` from a norm's input (``norm_scale``) and ``prefix + "hook_normalized"``, its
        output.

        ``centred``: a LayerNorm (else an RMSNorm). ``transform`` is applied to both (e.g. to
        move a head axis where ours is).
        """
        eps = norm_eps(norm)
        self.input(
            norm,
            prefix + "hook_scale",
            lambda x: transform(norm_scale(x, eps, centred=centred, mean_square_dtype=mean_square_dtype)),
        )
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


def _implementation(hf_model, field: str, what: str) -> str | None:
    value = getattr(hf_model.config, field, None)
    if value is not None and not isinstance(value, str):
        raise ValueError(unsupported_transformers(f"the {what} implementation ({type(value).__name__})"))
    return value


def current_attention(hf_model) -> str:
    """The attention implementation a Hugging Face model runs now, to restore after a reference run.

    ``config._attn_implementation`` is how Hugging Face's documentation says to read it; it is
    read here and nowhere else, and a model without it gets a ``ValueError`` naming the
    supported versions, not an ``AttributeError``.
    """
    return _implementation(hf_model, "_attn_implementation", "attention") or "eager"


def current_experts(hf_model) -> str | None:
    """The experts implementation of a Hugging Face mixture of experts (``config._experts_implementation``, read
    here and nowhere else), to restore after a reference run; ``set_experts_implementation`` sets it."""
    return _implementation(hf_model, "_experts_implementation", "experts")


def split_heads(**sizes: int) -> Callable[[Tensor], Tensor]:
    """``[batch, pos, (head_index d_head)] -> [batch, pos, head_index, d_head]`` (``d_head=`` or ``head_index=``)."""
    return lambda x: einops.rearrange(x, SPLIT_HEADS, **sizes)


def with_positions(forward_kwargs: dict) -> dict:
    """``forward_kwargs`` with ``position_ids`` counted from each row's first real token when a mask is given."""
    mask = forward_kwargs.get("attention_mask")
    if mask is None or "position_ids" in forward_kwargs:
        return forward_kwargs
    return {**forward_kwargs, "position_ids": positions_from_mask(mask)}


def positions_from_mask(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Position ids counted from each row's first real token (padding: the last real position before it, or 0)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def rotate_like_hf(apply_rotary, query: Tensor, key: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Hugging Face's ``apply_rotary_pos_emb(q, k, cos, sin)`` (heads first) on our ``[batch, pos, head_index, d_head]``
    q and k."""
    rot_q, rot_k = apply_rotary(
        einops.rearrange(query, TO_HEADS_FIRST), einops.rearrange(key, TO_HEADS_FIRST), cos, sin
    )
    return einops.rearrange(rot_q, FROM_HEADS_FIRST), einops.rearrange(rot_k, FROM_HEADS_FIRST)


def eager_attention_in_input_dtype(
    module, query, key, value, attention_mask, scaling, dropout=0.0, softcap=None, s_aux=None, **kwargs
):
    """Hugging Face's eager attention with its softmax in the input's dtype (see the module docstring).

    ``[batch, head_index, pos, d_head]`` in (keys and values may have fewer heads: each is
    repeated for its group of query heads), ``(z [batch, pos, head_index, d_head], pattern)``
    out. Gemma 2's soft-cap of the scores, ``softcap * tanh(scores / softcap)``, applies when given;
    gpt-oss's sinks (``s_aux``, one logit per head) join the softmax as one more column, dropped after it.
    """
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask
    if s_aux is None:
        weights = weights.softmax(dim=-1)
    else:
        sinks = s_aux.to(weights.dtype).reshape(1, -1, 1, 1).expand(weights.shape[0], -1, weights.shape[2], 1)
        weights = torch.cat([weights, sinks], dim=-1).softmax(dim=-1)[..., :-1]
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@functools.cache
def _register_float64_attention() -> str:
    """Register ``eager_attention_in_input_dtype`` (and Hugging Face's eager mask) as ``FLOAT64_ATTENTION``, once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(FLOAT64_ATTENTION, eager_attention_in_input_dtype)
    AttentionMaskInterface.register(FLOAT64_ATTENTION, eager_mask)
    return FLOAT64_ATTENTION


@contextlib.contextmanager
def patched(target, name: str, value):
    """``target.<name> = value`` for the run (a method replacing ``forward``, a buffer, a module's function);
    restored afterwards."""
    own, previous = name in vars(target), getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        if not own and name in vars(target):  # it was the class's: drop the instance's copy
            del vars(target)[name]
        else:
            setattr(target, name, previous)


def forward_patch(module: nn.Module, forward: Callable) -> AbstractContextManager:
    """Replace ``module.forward`` by ``forward(module, ...)`` for the run."""
    return patched(module, "forward", types.MethodType(forward, module))


def is_float64(hf_model) -> bool:
    return hf_model.get_input_embeddings().weight.dtype == torch.float64


@contextlib.contextmanager
def reference_run(
    hf_model,
    float64_patches: Patches = no_patches,
    *,
    attention: str | None = FLOAT64_ATTENTION,
    patches: Sequence[AbstractContextManager] = (),
):
    """Eval mode, no gradients and eager attention for the call (see the module docstring); restored afterwards.

    ``float64_patches(hf_model)``: what a float64 run patches. ``attention``: the
    implementation a float64 run uses (``FLOAT64_ATTENTION``, or ``"eager"`` where Hugging
    Face's own is right in float64); other dtypes run ``"eager"``; ``None`` leaves the model's
    attention as it is. ``patches``: entered whatever the dtype.
    """
    float64 = is_float64(hf_model)
    previous_attention, was_training = current_attention(hf_model), hf_model.training
    chosen = attention if float64 else "eager"
    with contextlib.ExitStack() as stack:
        for patch in [*patches, *(float64_patches(hf_model) if float64 else [])]:
            stack.enter_context(patch)
        try:
            if attention is not None:
                hf_model.set_attn_implementation(
                    _register_float64_attention() if chosen == FLOAT64_ATTENTION else chosen
                )
            hf_model.eval()
            with torch.no_grad():
                yield
        finally:
            if attention is not None:
                hf_model.set_attn_implementation(previous_attention)
            hf_model.train(was_training)


def run_reference(
    hf_model, rec: Recorder, inputs: dict, float64_patches: Patches = no_patches, *, logits: bool = True, **run
) -> dict[str, Tensor]:
    """``hf_model(**inputs)`` (tensors on its device) as a reference (``reference_run(hf_model, float64_patches,
    **run)``); what ``rec`` kept, plus ``"logits"`` where the output has them and ``logits``.

    The recorder's hooks are removed afterwards, also on error.
    """
    device = hf_model.get_input_embeddings().weight.device
    try:
        with reference_run(hf_model, float64_patches, **run):
            output = hf_model(**{key: v.to(device) if isinstance(v, Tensor) else v for key, v in inputs.items()})
    finally:
        rec.remove()
    acts = rec.acts
    if logits and getattr(output, "logits", None) is not None:
        acts["logits"] = output.logits.detach()
    return acts


def add_rotated(acts: dict, layers: nn.ModuleList, rotary_inputs: dict) -> None:
    """``hook_rot_q``/``hook_rot_k``: Hugging Face's ``apply_rotary_pos_emb`` on its (normalized) q and k."""
    for layer, (cos, sin) in rotary_inputs.items():
        apply_rotary = sys.modules[type(layers[layer].self_attn).__module__].apply_rotary_pos_emb
        q = f"blocks.{layer}.attn."
        query = acts.get(q + "q_norm.hook_normalized", acts[q + "hook_q"])
        key = acts.get(q + "k_norm.hook_normalized", acts[q + "hook_k"])
        acts[q + "hook_rot_q"], acts[q + "hook_rot_k"] = rotate_like_hf(apply_rotary, query, key, cos, sin)


def reference_activations(
    hf_model,
    tokens: Tensor,
    forward_kwargs: dict,
    record_block: Callable[[Recorder, nn.Module, str, dict, int], None],
    float64_patches: Patches,
    record_more: Callable[[Recorder], None] = lambda rec: None,
) -> dict[str, Tensor]:
    """Hugging Face's value of each of our hooks in a decoder of ``embed_tokens``, ``layers`` and an RMSNorm ``norm``.

    ``record_block(rec, block, "blocks.L.", rotary_inputs, L)`` hooks one block;
    ``record_more(rec)`` anything else (a read-out's insides). The token embedding, the
    final norm, the rotated q/k and the logits are recorded here.
    """
    body = hf_model.model if hasattr(hf_model, "model") else hf_model
    rec = Recorder()
    rotary_inputs: dict[int, Any] = {}
    rec.output(body.embed_tokens, "hook_embed")
    for layer, block in enumerate(body.layers):
        record_block(rec, block, f"blocks.{layer}.", rotary_inputs, layer)
    rec.norm(body.norm, "ln_final.", centred=False)
    record_more(rec)
    inputs = {"input_ids": tokens, "use_cache": False, **with_positions(forward_kwargs)}
    acts = run_reference(hf_model, rec, inputs, float64_patches)
    add_rotated(acts, body.layers, rotary_inputs)
    return acts


__all__ = [
    "FLOAT64_ATTENTION",
    "FROM_HEADS_FIRST",
    "Recorder",
    "add_rotated",
    "current_attention",
    "current_experts",
    "eager_attention_in_input_dtype",
    "forward_patch",
    "is_float64",
    "no_patches",
    "norm_eps",
    "norm_scale",
    "patched",
    "positions_from_mask",
    "reference_activations",
    "reference_run",
    "rotate_like_hf",
    "run_reference",
    "split_heads",
    "unsupported_transformers",
    "with_positions",
]

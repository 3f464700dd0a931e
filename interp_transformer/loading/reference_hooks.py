"""Hugging Face's own tensors under our hook names: torch hooks on its modules, and how a reference run is made.

Every ``*_reference`` module (Llama family, Gemma, mixtures of experts) reads Hugging
Face's values with a ``Recorder``: forward hooks on its modules store their outputs (or
inputs) under our hook names, so the values are its own tensors, not recomputed. A few
values Hugging Face never forms are derived from its own tensors, each said where it is
(a norm's ``hook_scale`` from the input the norm received, the rotated q/k from the
cos/sin its model handed to the attention).

Float64. Hugging Face computes some steps in float32 whatever the model's dtype (RMSNorm,
the eager softmax, Gemma's norms, a router's softmax: choices made for half precision), so
its float64 run would be float32-accurate there and a float64 re-check could not tell
rounding from a bug. ``run_reference`` therefore takes the float64 *patches* an
architecture needs (the same formulas, computed in the input's dtype) and applies them for
the call only when the model is float64; the attention then runs ``FLOAT64_ATTENTION``,
Hugging Face's eager attention (soft-capping included) with its softmax in the input's
dtype. Every other dtype runs Hugging Face's code unchanged. The rotary cos/sin stay
float32 in both models: that is the models' math.

Padding: with an ``attention_mask``, Hugging Face's forward would number positions
``0 .. pos-1`` through the padding, while ours (and Hugging Face's ``generate``) count from
each row's first real token; the reference is run with those ``position_ids``.
"""

import contextlib
import sys
import types
from typing import Callable, NamedTuple, Optional

import einops
import torch
from jaxtyping import Int
from torch import Tensor, nn

from .hf_hooks import current_attention

SPLIT_HEADS = "batch pos (head_index d_head) -> batch pos head_index d_head"
FLOAT64_ATTENTION = "interp_transformer_eager_in_input_dtype"


def positions_from_mask(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Position ids counted from each row's first real token (padding: the last real position before it, or 0)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def norm_eps(norm: nn.Module) -> float:
    """The epsilon of a Hugging Face RMSNorm (``variance_epsilon`` in Llama's, ``eps`` in Gemma's)."""
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


class Recorder:
    """Forward hooks on Hugging Face modules that store tensors under our hook names in ``acts``."""

    def __init__(self) -> None:
        self.acts: dict[str, Tensor] = {}
        self.handles: list = []

    def output(self, module: nn.Module, name: str, transform: Callable = lambda out: out, index: int = 0) -> None:
        """``transform`` of ``module``'s output (element ``index`` of a tuple output) as ``name``."""

        def hook(m, args, out):
            self.acts[name] = transform(out[index] if isinstance(out, tuple) else out).detach()

        self.handles.append(module.register_forward_hook(hook))

    def input(self, module: nn.Module, name: str, transform: Callable = lambda x: x) -> None:
        """``transform`` of ``module``'s first input (or its ``hidden_states`` keyword) as ``name``."""

        def hook(m, args, kwargs):
            self.acts[name] = transform(args[0] if args else kwargs["hidden_states"]).detach()

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def norm(self, norm: nn.Module, prefix: str, transform: Callable = lambda x: x) -> None:
        """A norm's ``hook_normalized`` (its output) and ``hook_scale``: ``sqrt(mean(x^2) + eps)`` of its input.

        ``transform`` is applied to both (e.g. to move a head axis where ours is).
        """
        eps = norm_eps(norm)
        self.input(norm, prefix + "hook_scale", lambda x: transform((x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()))
        self.output(norm, prefix + "hook_normalized", transform)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def record_attention(
    rec: Recorder, attn: nn.Module, prefix: str, rotary_inputs: dict, layer: int, heads_first_norms: bool = False
) -> None:
    """q/k/v before rotation, q/k norms, the pattern and z of one Hugging Face attention (``q_proj`` ... ``o_proj``).

    The cos/sin the model hands the attention go to ``rotary_inputs[layer]`` (``add_rotated``
    turns them into ``hook_rot_q``/``hook_rot_k``). ``heads_first_norms``: the q/k norms read
    ``[batch, head_index, pos, d_head]`` (Gemma 3), not ``[batch, pos, head_index, d_head]`` (Qwen3).
    """
    split = lambda out: einops.rearrange(out, SPLIT_HEADS, d_head=attn.head_dim)  # noqa: E731
    for letter in "qkv":
        rec.output(getattr(attn, f"{letter}_proj"), prefix + f"attn.hook_{letter}", split)
    if hasattr(attn, "q_norm"):
        to_ours = (
            (lambda x: einops.rearrange(x, "batch head_index pos d -> batch pos head_index d"))
            if heads_first_norms
            else (lambda x: x)
        )
        rec.norm(attn.q_norm, prefix + "attn.q_norm.", to_ours)
        rec.norm(attn.k_norm, prefix + "attn.k_norm.", to_ours)
    rec.handles.append(
        attn.register_forward_pre_hook(
            lambda m, args, kwargs: rotary_inputs.__setitem__(layer, kwargs["position_embeddings"]), with_kwargs=True
        )
    )
    rec.output(attn, prefix + "attn.hook_pattern", index=1)
    rec.input(attn.o_proj, prefix + "attn.hook_z", split)


def add_rotated(acts: dict, layers: nn.ModuleList, rotary_inputs: dict) -> None:
    """``hook_rot_q``/``hook_rot_k``: Hugging Face's ``apply_rotary_pos_emb`` on its (normalized) q and k."""
    for layer, (cos, sin) in rotary_inputs.items():
        attn = layers[layer].self_attn
        apply_rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q = f"blocks.{layer}.attn."
        query = acts.get(q + "q_norm.hook_normalized", acts[q + "hook_q"])
        key = acts.get(q + "k_norm.hook_normalized", acts[q + "hook_k"])
        to_heads_first = "batch pos head_index d_head -> batch head_index pos d_head"
        rot_q, rot_k = apply_rotary(
            einops.rearrange(query, to_heads_first), einops.rearrange(key, to_heads_first), cos, sin
        )
        acts[q + "hook_rot_q"] = einops.rearrange(rot_q, "batch head_index pos d_head -> batch pos head_index d_head")
        acts[q + "hook_rot_k"] = einops.rearrange(rot_k, "batch head_index pos d_head -> batch pos head_index d_head")


class Patch(NamedTuple):
    """For the float64 reference run only: ``module.<name> = value`` (a method replacing ``forward``, or a buffer)."""

    module: nn.Module
    name: str
    value: object


def forward_patch(module: nn.Module, forward: Callable) -> Patch:
    """Replace ``module.forward`` by ``forward(module, ...)`` for the run."""
    return Patch(module, "forward", types.MethodType(forward, module))


def run_reference(
    hf_model,
    tokens: Tensor,
    rec: Recorder,
    forward_kwargs: dict,
    float64_patches: Callable[[nn.Module], list[Patch]] = lambda hf_model: [],
):
    """Run ``hf_model`` on ``tokens`` with eager attention (float64: patched, see the module docstring); hooks removed
    after.

    Returns Hugging Face's output; positions are counted from each row's first real token
    when ``forward_kwargs`` holds an attention mask.
    """
    body = hf_model.model if hasattr(hf_model, "model") else hf_model
    weight = body.embed_tokens.weight
    mask = forward_kwargs.get("attention_mask")
    if mask is not None and "position_ids" not in forward_kwargs:
        forward_kwargs = {**forward_kwargs, "position_ids": positions_from_mask(mask)}
    float64 = weight.dtype == torch.float64
    try:
        with reference_run(hf_model, float64_patches(hf_model) if float64 else None), torch.no_grad():
            return hf_model(tokens.to(weight.device), use_cache=False, **forward_kwargs)
    finally:
        rec.remove()


def reference_activations(
    hf_model,
    tokens: Tensor,
    forward_kwargs: dict,
    record_block: Callable[[Recorder, nn.Module, str, dict, int], None],
    float64_patches: Callable[[nn.Module], list[Patch]],
    record_more: Callable[[Recorder], None] = lambda rec: None,
) -> dict[str, Tensor]:
    """Hugging Face's value of each of our hooks in a decoder of ``embed_tokens``, ``layers`` and ``norm``.

    ``record_block(rec, block, "blocks.L.", rotary_inputs, L)`` hooks one block;
    ``record_more(rec)`` anything else (a read-out's insides). The token embedding, the
    final norm, the rotated q/k and the logits are recorded here.
    """
    body = hf_model.model if hasattr(hf_model, "model") else hf_model
    rec, rotary_inputs = Recorder(), {}
    rec.output(body.embed_tokens, "hook_embed")
    for layer, block in enumerate(body.layers):
        record_block(rec, block, f"blocks.{layer}.", rotary_inputs, layer)
    rec.norm(body.norm, "ln_final.")
    record_more(rec)
    output = run_reference(hf_model, tokens, rec, forward_kwargs, float64_patches)
    acts = rec.acts
    add_rotated(acts, body.layers, rotary_inputs)
    if getattr(output, "logits", None) is not None:
        acts["logits"] = output.logits.detach()
    return acts


@contextlib.contextmanager
def reference_run(hf_model, patches: Optional[list[Patch]]):
    """Eager attention (patterns visible) and eval mode for the call; with ``patches`` (float64), those and float64
    attention."""
    previous_attention, was_training = current_attention(hf_model), hf_model.training
    saved = []
    try:
        if patches is not None:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface, eager_mask

            AttentionInterface.register(FLOAT64_ATTENTION, _eager_attention_in_input_dtype)
            AttentionMaskInterface.register(FLOAT64_ATTENTION, eager_mask)
            for module, name, value in patches:
                saved.append((module, name, name in module.__dict__, getattr(module, name)))
                setattr(module, name, value)
        hf_model.set_attn_implementation(FLOAT64_ATTENTION if patches is not None else "eager")
        hf_model.eval()
        yield
    finally:
        for module, name, was_own, value in reversed(saved):
            if name == "forward" and not was_own:
                del module.__dict__["forward"]
            else:
                setattr(module, name, value)
        hf_model.set_attn_implementation(previous_attention)
        hf_model.train(was_training)


def rms_norm_in_input_dtype(norm, hidden_states: Tensor) -> Tensor:
    """Llama's RMSNorm formula, ``weight * (x * rsqrt(mean(x^2) + eps))``, without its cast to float32."""
    variance = hidden_states.pow(2).mean(dim=-1, keepdim=True)
    return norm.weight * (hidden_states * torch.rsqrt(variance + norm.variance_epsilon))


def _eager_attention_in_input_dtype(
    module, query, key, value, attention_mask, scaling, dropout=0.0, softcap=None, **kwargs
):
    """Hugging Face's eager attention (``[batch, head_index, pos, d_head]`` in, ``(z, pattern)`` out), softmax in the
    input's dtype.

    Gemma 2's soft-cap of the scores, ``softcap * tanh(scores / softcap)``, applies when given.
    """
    repeat_kv = sys.modules[type(module).__module__].repeat_kv
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = weights.softmax(dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


__all__ = [
    "FLOAT64_ATTENTION",
    "Patch",
    "Recorder",
    "SPLIT_HEADS",
    "add_rotated",
    "forward_patch",
    "norm_eps",
    "positions_from_mask",
    "record_attention",
    "reference_activations",
    "reference_run",
    "rms_norm_in_input_dtype",
    "run_reference",
]

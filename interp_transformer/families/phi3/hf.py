"""Phi-3 and Phi-4 from Hugging Face (``model_type`` "phi3"): config, pure converter, strict build, reference.

The checkpoint is Llama's layout (``model.layers.{L}...``, ``norm``, ``lm_head``) with two
fused projections, split here into our per-head and per-matrix weights:

- ``self_attn.qkv_proj.weight`` ``[(n_heads + 2 n_key_value_heads) d_head, d_model]``: the
  query rows of every head, then the key rows, then the value rows; they become ``W_Q``,
  ``W_K``, ``W_V`` (``_W_K``/``_W_V`` when grouped);
- ``mlp.gate_up_proj.weight`` ``[2 d_mlp, d_model]``: the gate's rows, then the up
  projection's; they become ``W_gate`` and ``W_in`` (Hugging Face computes
  ``up * act(gate)``, our ``GatedMLP`` ``act(gate) * up``: the same numbers).

Nothing has a bias, so every bias of ours is zero. With tied embeddings (Phi-4-mini, no
``lm_head.weight``) ``W_U`` is the transposed token embedding.

The rotation: the first ``int(d_head * partial_rotary_factor)`` dimensions of each head,
theta ``rope_theta``, and for ``rope_type`` "longrope" (``rope_scaling`` "su" and "yarn" of
old checkpoints are read as it by Hugging Face) the short and long factors, the
``original_max_position_embeddings`` between them, and the attention factor (``attention_factor``,
or Hugging Face's default from ``factor``, itself ``max_position_embeddings /
original_max_position_embeddings`` when absent). ``sliding_window`` applies to every layer.
``resid_pdrop``, ``embd_pdrop`` and ``attention_dropout`` act only in training, so they change
nothing here.

``config_from_hf`` refuses, before any weight is read, every feature it does not compute,
naming them all in one ``ValueError``: other rope types, per-layer rope parameters, an odd
or empty rotated width, LongRoPE factors of the wrong length, a non-positive window,
factor or attention factor, an activation we do not have.
"""

import math
from collections.abc import Mapping
from typing import TypeGuard

import einops
import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.families.conversion import (
    CheckedCheckpoint,
    convert_llama_layout,
    fresh,
    heads_in,
    heads_out,
    linear_to_ours,
    llama_layout_shapes,
    per_head_bias,
    read_model_type,
    refuse_features,
    require_rms_decoder_fields,
    rms_decoder_fields,
)
from interp_transformer.families.gpt2.hf import ACTIVATIONS
from interp_transformer.families.llama.hf import load_hf_model
from interp_transformer.families.llama.reference import llama_float64_patches
from interp_transformer.families.phi3.recipe import Phi3Config
from interp_transformer.families.reference import Recorder, reference_activations, split_heads
from interp_transformer.parts.rotary import RopeScaling

MODEL_TYPES = ("phi3",)
SUPPORTED_ROPE_TYPES = ("default", "longrope")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def head_width(hf_config) -> int:
    """``d_head``: ``head_dim`` where the config sets it, else ``hidden_size // num_attention_heads`` (Hugging Face's
    rule)."""
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def _rotary(hf_config, d_head: int, problems: list[str]) -> dict:
    """``rotary_dim``, ``rotary_base`` and ``rope_scaling`` from ``rope_parameters``; what we do not compute goes to
    ``problems``."""
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    if parameters and all(isinstance(value, dict) for value in parameters.values()):
        problems.append(f"rope_parameters per layer type ({sorted(parameters)}; one set for every layer is supported)")
        return {}
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        problems.append(f"rope_type={rope_type!r} (supported: {list(SUPPORTED_ROPE_TYPES)})")
    partial = parameters.get("partial_rotary_factor", 1.0)
    rotary_dim = int(d_head * partial) if _is_number(partial) else 0
    if not 0 < rotary_dim <= d_head or rotary_dim % 2:
        problems.append(
            f"partial_rotary_factor={partial!r}, which rotates {rotary_dim} of d_head={d_head} dimensions (rotary "
            "positions rotate pairs: an even number in [2, d_head] is supported)"
        )
    base = parameters.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    if not _is_number(base) or not base > 1:
        problems.append(f"rope_theta={base!r} (a number > 1 is needed)")
    scaling = _long_rope(hf_config, parameters, rotary_dim, problems) if rope_type == "longrope" else None
    return dict(rotary_dim=rotary_dim, rotary_base=float(base) if _is_number(base) else base, rope_scaling=scaling)


def _long_rope(hf_config, parameters: dict, rotary_dim: int, problems: list[str]) -> RopeScaling | None:
    """LongRoPE's ``RopeScaling`` as Hugging Face's ``_compute_longrope_parameters`` reads ``rope_parameters``."""
    found = len(problems)
    original = parameters.get("original_max_position_embeddings")
    if not _is_int(original) or original <= 0:
        problems.append(f"longrope original_max_position_embeddings={original!r} (a positive int is needed)")
    factors: dict[str, tuple[float, ...]] = {}
    for name in ("short_factor", "long_factor"):
        value = parameters.get(name)
        if not isinstance(value, (list, tuple)) or not all(_is_number(x) and x > 0 for x in value):
            problems.append(f"longrope {name}={value!r} (a list of numbers > 0 is needed)")
        elif len(value) != rotary_dim // 2:
            problems.append(
                f"longrope {name} of {len(value)} entries (rotary_dim={rotary_dim} needs {rotary_dim // 2}, one per "
                "frequency)"
            )
        else:
            factors[name] = tuple(float(x) for x in value)
    factor = parameters.get("factor")
    if factor is None and _is_int(original) and original > 0:
        factor = hf_config.max_position_embeddings / original  # Hugging Face's default
    if not _is_number(factor) or not factor > 0:
        problems.append(f"longrope factor={factor!r} (a number > 0 is needed)")
    attention_factor = parameters.get("attention_factor")
    if attention_factor is not None and (not _is_number(attention_factor) or not attention_factor > 0):
        problems.append(f"longrope attention_factor={attention_factor!r} (a number > 0 or none is needed)")
    if len(problems) > found or not _is_int(original) or not _is_number(factor):  # each of those is a problem
        return None
    return RopeScaling(
        "longrope",
        float(factor),
        original_max_position_embeddings=original,
        attention_factor=None if attention_factor is None else float(attention_factor),
        short_factor=factors["short_factor"],  # both are set when no problem was found
        long_factor=factors["long_factor"],
    )


def unsupported_features(hf_config) -> list[str]:
    """Every feature of a Phi-3 config this converter does not compute, in words (empty: all is supported)."""
    problems = []
    if hf_config.hidden_act not in ACTIVATIONS:
        problems.append(f"hidden_act={hf_config.hidden_act!r} (supported: {sorted(ACTIVATIONS)})")
    window = getattr(hf_config, "sliding_window", None)
    if window is not None and (not _is_int(window) or window <= 0):
        problems.append(f"sliding_window={window!r} (a positive int or none is needed)")
    n_heads, n_kv = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if not _is_int(n_kv) or n_kv <= 0 or n_heads % n_kv:
        problems.append(f"num_key_value_heads={n_kv!r} (a positive int dividing num_attention_heads={n_heads})")
    if not getattr(hf_config, "head_dim", None) and hf_config.hidden_size % n_heads:
        problems.append(
            f"hidden_size={hf_config.hidden_size} not divisible by num_attention_heads={n_heads} without a head_dim"
        )
    return problems


def config_from_hf(hf_config) -> Phi3Config:
    """Our config from a ``transformers.Phi3Config``; ``ValueError`` naming every feature not computed here."""
    model_type = read_model_type(hf_config, MODEL_TYPES)
    require_rms_decoder_fields(hf_config, model_type)
    problems = unsupported_features(hf_config)
    d_head = head_width(hf_config)
    rotary = _rotary(hf_config, d_head, problems)
    refuse_features(model_type, problems)
    return Phi3Config(
        n_key_value_heads=hf_config.num_key_value_heads,
        d_head=d_head,
        d_mlp=hf_config.intermediate_size,
        act_fn=ACTIVATIONS[hf_config.hidden_act],
        sliding_window=getattr(hf_config, "sliding_window", None),
        **rotary,
        **rms_decoder_fields(hf_config, model_type),
    )


def expected_hf_shapes(cfg: Phi3Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face Phi-3 checkpoint of ``cfg`` (``model.`` prefix removed)."""
    d_model, d_mlp = cfg.d_model, cfg.d_mlp
    q_width, kv_width = cfg.n_heads * cfg.d_head, cfg.n_key_value_heads * cfg.d_head

    def layer_shapes(p: str) -> dict[str, tuple[int, ...]]:
        return {
            p + "input_layernorm.weight": (d_model,),
            p + "post_attention_layernorm.weight": (d_model,),
            p + "self_attn.qkv_proj.weight": (q_width + 2 * kv_width, d_model),
            p + "self_attn.o_proj.weight": (d_model, q_width),
            p + "mlp.gate_up_proj.weight": (2 * d_mlp, d_model),
            p + "mlp.down_proj.weight": (d_model, d_mlp),
        }

    return llama_layout_shapes(cfg, layer_shapes)


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: Phi3Config) -> dict[str, Tensor]:
    """Hugging Face Phi-3 state dict -> ours. Pure: the input is not changed, the output shares no memory with it.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    Each input tensor is read once.
    """
    read = CheckedCheckpoint(hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg))
    kv = "" if cfg.n_key_value_heads == cfg.n_heads else "_"  # grouped keys/values are stored as _W_K, _W_V, ...
    q_width, kv_width = cfg.n_heads * cfg.d_head, cfg.n_key_value_heads * cfg.d_head

    def convert_layer(layer: int, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        zeros = lambda *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        m, q = f"layers.{layer}.", f"blocks.{layer}."
        ours: dict[str, Tensor] = {}
        ours[q + "ln1.w"] = fresh(read(m + "input_layernorm.weight"))
        W_Q, W_K, W_V = read(m + "self_attn.qkv_proj.weight").split((q_width, kv_width, kv_width))
        ours[q + "attn.W_Q"], ours[q + f"attn.{kv}W_K"], ours[q + f"attn.{kv}W_V"] = (
            heads_in(W, cfg.d_head) for W in (W_Q, W_K, W_V)
        )
        ours[q + "attn.b_Q"] = per_head_bias(zeros(q_width), cfg.d_head)
        ours[q + f"attn.{kv}b_K"] = per_head_bias(zeros(kv_width), cfg.d_head)
        ours[q + f"attn.{kv}b_V"] = per_head_bias(zeros(kv_width), cfg.d_head)
        ours[q + "attn.W_O"] = heads_out(read(m + "self_attn.o_proj.weight"), cfg.d_head)
        ours[q + "attn.b_O"] = zeros(cfg.d_model)
        ours[q + "ln2.w"] = fresh(read(m + "post_attention_layernorm.weight"))
        gate, up = read(m + "mlp.gate_up_proj.weight").chunk(2, dim=0)
        ours[q + "mlp.W_gate"], ours[q + "mlp.W_in"] = linear_to_ours(gate), linear_to_ours(up)
        ours[q + "mlp.b_in"] = zeros(cfg.d_mlp)
        ours[q + "mlp.W_out"] = linear_to_ours(read(m + "mlp.down_proj.weight"))
        ours[q + "mlp.b_out"] = zeros(cfg.d_model)
        return ours

    return convert_llama_layout(read, cfg, convert_layer)


def _fused_part(start: int, stop: int, d_head: int):
    """Columns ``start:stop`` of a fused projection's output, split per head ``[batch, pos, head_index, d_head]``."""
    return lambda out: einops.rearrange(
        out[..., start:stop], "batch pos (head_index d_head) -> batch pos head_index d_head", d_head=d_head
    )


def _record_block(rec: Recorder, block, prefix: str, rotary_inputs: dict, layer: int) -> None:
    """One ``Phi3DecoderLayer``: residual stream, norms, q/k/v from ``qkv_proj``, pattern, z, the gated MLP."""
    attn, mlp = block.self_attn, block.mlp
    d_head = attn.head_dim
    q_width, kv_width = attn.config.num_attention_heads * d_head, attn.num_key_value_heads * d_head
    rec.input(block, prefix + "hook_resid_pre")
    rec.norm(block.input_layernorm, prefix + "ln1.", centred=False)
    bounds = {"q": (0, q_width), "k": (q_width, q_width + kv_width), "v": (q_width + kv_width, q_width + 2 * kv_width)}
    for letter, (start, stop) in bounds.items():
        rec.output(attn.qkv_proj, prefix + f"attn.hook_{letter}", _fused_part(start, stop, d_head))
    rec.kwargs(attn, lambda kwargs: rotary_inputs.__setitem__(layer, kwargs["position_embeddings"]))
    rec.output(attn, prefix + "attn.hook_pattern", index=1)
    rec.input(attn.o_proj, prefix + "attn.hook_z", split_heads(d_head=d_head))
    rec.output(attn, prefix + "hook_attn_out")
    rec.input(block.post_attention_layernorm, prefix + "hook_resid_mid")
    rec.norm(block.post_attention_layernorm, prefix + "ln2.", centred=False)
    rec.output(mlp.gate_up_proj, prefix + "mlp.hook_pre", lambda out: out.chunk(2, dim=-1)[0])
    rec.output(mlp.gate_up_proj, prefix + "mlp.hook_pre_linear", lambda out: out.chunk(2, dim=-1)[1])
    rec.input(mlp.down_proj, prefix + "mlp.hook_post")
    rec.output(mlp, prefix + "hook_mlp_out")
    rec.output(block, prefix + "hook_resid_post")


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face ``Phi3ForCausalLM`` (or ``Phi3Model``) and return its value for each of our hooks.

    Read with torch hooks on its modules (``reference.Recorder``): the token embedding, each
    block's residual stream (pre, mid, post), the norms (``hook_scale`` from each norm's input),
    q/k/v from the columns of ``qkv_proj``'s output, the rotated q/k by Hugging Face's own
    ``apply_rotary_pos_emb`` (partial rotary included) with the cos/sin its model handed the
    attention (LongRoPE's factors and attention factor included), the patterns, z (``o_proj``'s
    input), the attention and MLP outputs, the gate and up halves of ``gate_up_proj``'s output,
    ``down_proj``'s input, the final norm and the logits. Not mapped: ``hook_attn_scores``
    (Hugging Face masks with the dtype's minimum, not ``-inf``). Float64: its RMSNorms and
    softmax computed in float64 (``llama_reference``).
    """
    return reference_activations(hf_model, tokens, forward_kwargs, _record_block, llama_float64_patches)


__all__ = [
    "MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "head_width",
    "hf_reference_activations",
    "load_hf_model",
    "unsupported_features",
]

"""gpt-oss from Hugging Face (``model_type`` ``gpt_oss``): config, pure converter, strict build, reference.

===================================================  ===================================================
Hugging Face                                         ours
===================================================  ===================================================
``layers.L.self_attn.{q,k,v,o}_proj`` (with biases)  ``blocks.L.attn.W_Q`` ... ``b_O`` (the Llama family's)
``layers.L.self_attn.sinks [head_index]``            ``blocks.L.attn.sinks.logits``
``layers.L.mlp.router.weight``, ``.bias``            ``blocks.L.mlp.W_router`` (transposed), ``b_router``
``layers.L.mlp.experts.gate_up_proj``                ``experts.E.W_gate``: its even columns,
``[expert, d_model, 2 d_mlp]`` (and ``_bias``)       ``experts.E.W_in``: its odd ones (and ``b_gate``, ``b_in``)
``layers.L.mlp.experts.down_proj``                   ``experts.E.W_out`` (as stored), ``b_out``
``[expert, d_mlp, d_model]`` (and ``_bias``)
===================================================  ===================================================

Hugging Face keeps each expert's gate and up projections in one tensor with their columns
interleaved (gate, up, gate, up, ...: its experts read ``gate_up[..., ::2]`` and
``gate_up[..., 1::2]``); they are split here. Norms, the embedding and the read-out are the
Llama family's.

``config_from_hf`` honours every field Hugging Face's model reads (sizes, ``layer_types``
and ``sliding_window``, ``attention_bias``, ``rope_parameters``: default, linear, llama3 or
yarn with its ``factor``, ``beta_fast``, ``beta_slow``, ``truncate``, ``attention_factor``,
``mscale``/``mscale_all_dim``, ``swiglu_alpha``, ``swiglu_limit``, ``tie_word_embeddings``) and
refuses, naming them all in one ``ValueError`` before any weight is read, what it does not
compute: other rope types, partial rotary, per-layer-type rope parameters, other layer
types, sliding layers without a window, and quantized weights (``quantization_config``:
gpt-oss's published MXFP4 experts; load them dequantized). ``hidden_act`` is not read by
Hugging Face's model (its experts' activation is fixed) and not here; ``router_aux_loss_coef``
and ``output_router_logits`` concern its training loss and extra outputs, and
``attention_dropout`` acts only in training: none changes the logits.
"""

import math
from collections.abc import Mapping

import einops
import torch
from torch import Tensor

from interp_transformer.core.strict import require_config_fields
from interp_transformer.families.conversion import (
    CheckedCheckpoint,
    convert_llama_layout,
    fresh,
    linear_to_ours,
    read_model_type,
    refuse_features,
    rms_decoder_fields,
)
from interp_transformer.families.gpt_oss.recipe import LAYER_TYPES, GptOssConfig
from interp_transformer.families.gpt_oss.reference import hf_reference_activations
from interp_transformer.families.llama.hf import (
    convert_llama_block,
    load_hf_model,
    rope_from_parameters,
)
from interp_transformer.families.llama.hf import (
    expected_hf_shapes as llama_shapes,
)
from interp_transformer.parts.rotary import RopeScaling

MODEL_TYPES = ("gpt_oss",)
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _mscale(factor: float, mscale: float) -> float:
    """Hugging Face's ``get_mscale``: ``0.1 mscale ln(factor) + 1``, or 1 for ``factor <= 1``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(parameters: dict, hf_config) -> RopeScaling:
    """Hugging Face's ``_compute_yarn_parameters`` settings as a ``RopeScaling("yarn", ...)``."""
    old_context = int(parameters["original_max_position_embeddings"])
    factor = parameters.get("factor")
    factor = float(hf_config.max_position_embeddings / old_context if factor is None else factor)
    attention_factor = parameters.get("attention_factor")
    mscale, mscale_all_dim = parameters.get("mscale"), parameters.get("mscale_all_dim")
    if attention_factor is None and mscale and mscale_all_dim:  # DeepSeek's ratio of two scales
        attention_factor = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
    return RopeScaling(
        "yarn",
        factor,
        original_max_position_embeddings=old_context,
        attention_factor=None if attention_factor is None else float(attention_factor),
        beta_fast=float(parameters.get("beta_fast") or 32),  # Hugging Face reads a missing or zero beta as the default
        beta_slow=float(parameters.get("beta_slow") or 1),
        truncate=bool(parameters.get("truncate", True)),
    )


def _rotary(hf_config, problems: list[str]) -> dict:
    """``rotary_base`` and ``rope_scaling`` from ``rope_parameters``; what is not computed goes to ``problems``."""
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    if parameters and all(isinstance(value, dict) for value in parameters.values()):
        problems.append(f"rope_parameters per layer type ({sorted(parameters)}; one set for every layer is supported)")
        return {}
    factor = parameters.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    if factor is not None and float(factor) != 1.0:
        problems.append(f"partial_rotary_factor={factor} (gpt-oss rotates whole heads)")
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        problems.append(f"rope_type={rope_type!r} (supported: {list(ROPE_TYPES)})")
        return {}
    base = float(parameters.get("rope_theta", getattr(hf_config, "rope_theta", 150000.0)))
    if rope_type == "yarn":
        if parameters.get("original_max_position_embeddings") is None:
            problems.append("yarn rope_parameters without original_max_position_embeddings")
            return {}
        return dict(rotary_base=base, rope_scaling=_yarn(parameters, hf_config))
    base, scaling = rope_from_parameters(parameters, f"{hf_config.model_type} config", default_base=base)
    return dict(rotary_base=base, rope_scaling=scaling)


def _layers(hf_config, problems: list[str]) -> dict:
    """``layer_types`` and ``sliding_window``; unknown layer types and a window-less sliding layer go to
    ``problems``."""
    layer_types = getattr(hf_config, "layer_types", None)
    layer_types = tuple(layer_types) if layer_types is not None else None
    window = getattr(hf_config, "sliding_window", None)
    if layer_types is not None:
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown:
            problems.append(f"layer_types {unknown} (supported: {list(LAYER_TYPES)})")
        if len(layer_types) != hf_config.num_hidden_layers:
            problems.append(f"{len(layer_types)} layer_types for num_hidden_layers={hf_config.num_hidden_layers}")
    sliding = "sliding_attention" in layer_types if layer_types is not None else hf_config.num_hidden_layers > 0
    if sliding and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        problems.append(f"sliding_attention layers with sliding_window={window!r} (a positive int is needed)")
    return dict(layer_types=layer_types, sliding_window=window if sliding else None)


def unsupported_features(hf_config) -> list[str]:
    """Every feature of a gpt-oss config this converter does not compute, in words (empty: all is supported)."""
    problems = []
    quantization = getattr(hf_config, "quantization_config", None)
    if quantization is not None:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        problems.append(
            f"quantization_config ({method}: quantized expert weights; load the model dequantized, e.g. "
            "transformers' Mxfp4Config(dequantize=True), and convert that)"
        )
    _layers(hf_config, problems)
    _rotary(hf_config, problems)
    return problems


def config_from_hf(hf_config) -> GptOssConfig:
    """Our config from a ``transformers`` ``GptOssConfig``; ``ValueError`` naming every feature not computed
    here."""
    model_type = read_model_type(hf_config, MODEL_TYPES)
    require_config_fields(
        hf_config,
        model_type,
        positive_ints=(
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "num_local_experts",
            "num_experts_per_tok",
            "vocab_size",
            "max_position_embeddings",
        ),
        positive_floats=("rms_norm_eps", "swiglu_alpha", "swiglu_limit"),
    )
    problems = unsupported_features(hf_config)
    refuse_features(model_type, problems)
    return GptOssConfig(
        n_key_value_heads=hf_config.num_key_value_heads,
        d_head=hf_config.head_dim,
        d_mlp=hf_config.intermediate_size,
        n_experts=hf_config.num_local_experts,
        experts_per_token=hf_config.num_experts_per_tok,
        swiglu_alpha=float(hf_config.swiglu_alpha),
        swiglu_limit=float(hf_config.swiglu_limit),
        attn_biases=("q", "k", "v", "o") if getattr(hf_config, "attention_bias", True) else (),
        **_layers(hf_config, []),
        **_rotary(hf_config, []),
        **rms_decoder_fields(hf_config, model_type),
    )


def expected_hf_shapes(cfg: GptOssConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face gpt-oss checkpoint of ``cfg`` (``model.`` prefix removed)."""
    d_model, d_mlp, n_experts = cfg.d_model, cfg.d_mlp, cfg.n_experts
    shapes = {name: shape for name, shape in llama_shapes(cfg).items() if ".mlp." not in name}
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        shapes[p + "self_attn.sinks"] = (cfg.n_heads,)
        shapes[p + "mlp.router.weight"] = (n_experts, d_model)
        shapes[p + "mlp.router.bias"] = (n_experts,)
        shapes[p + "mlp.experts.gate_up_proj"] = (n_experts, d_model, 2 * d_mlp)
        shapes[p + "mlp.experts.gate_up_proj_bias"] = (n_experts, 2 * d_mlp)
        shapes[p + "mlp.experts.down_proj"] = (n_experts, d_mlp, d_model)
        shapes[p + "mlp.experts.down_proj_bias"] = (n_experts, d_model)
    return shapes


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: GptOssConfig) -> dict[str, Tensor]:
    """Hugging Face gpt-oss state dict -> ours. Pure: the input is not changed, the output shares no memory with it.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    Each input tensor is read once.
    """
    read = CheckedCheckpoint(hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg))

    def convert_layer(layer: int, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        block = convert_llama_block(read, cfg, layer, dtype, device, lambda: _convert_mixture(read, cfg, layer))
        return {**block, f"blocks.{layer}.attn.sinks.logits": fresh(read(f"layers.{layer}.self_attn.sinks"))}

    return convert_llama_layout(read, cfg, convert_layer)


def _convert_mixture(read, cfg: GptOssConfig, layer: int) -> dict[str, Tensor]:
    """One block's router and experts under our names, the interleaved gate and up columns split."""
    m, q = f"layers.{layer}.mlp.", f"blocks.{layer}.mlp."
    ours = {q + "W_router": linear_to_ours(read(m + "router.weight")), q + "b_router": fresh(read(m + "router.bias"))}
    interleaved = "expert d_model (d_mlp gate_or_up) -> gate_or_up expert d_model d_mlp"
    W_gate, W_in = einops.rearrange(read(m + "experts.gate_up_proj"), interleaved, gate_or_up=2)
    b_gate, b_in = einops.rearrange(
        read(m + "experts.gate_up_proj_bias"), "expert (d_mlp gate_or_up) -> gate_or_up expert d_mlp", gate_or_up=2
    )
    W_out, b_out = read(m + "experts.down_proj"), read(m + "experts.down_proj_bias")
    for expert in range(cfg.n_experts):
        e = q + f"experts.{expert}."
        ours.update(
            {
                e + "W_gate": fresh(W_gate[expert]),
                e + "b_gate": fresh(b_gate[expert]),
                e + "W_in": fresh(W_in[expert]),
                e + "b_in": fresh(b_in[expert]),
                e + "W_out": fresh(W_out[expert]),
                e + "b_out": fresh(b_out[expert]),
            }
        )
    return ours


__all__ = [
    "MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
    "unsupported_features",
]

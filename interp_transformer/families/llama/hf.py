"""The Llama family from Hugging Face (Llama, Mistral, Qwen2, Qwen3): config, pure converter, strict build, reference.

One converter serves four ``model_type`` values, because their checkpoints share one
layout (``model.layers.{L}.self_attn.q_proj`` ...) and differ only in what
``LlamaConfig`` already expresses:

==========  ====================================  ===============================================
model_type  what differs                          in our config
==========  ====================================  ===============================================
llama       ``attention_bias`` (q, k, v, o)       ``attn_biases``; Llama 3.1 ``rope_scaling``
mistral     sliding-window attention              ``sliding_window``
qwen2       q, k, v biases (always)               ``attn_biases=("q", "k", "v")``
qwen3       per-head RMSNorm of q and k           ``qk_norm=True``; ``attention_bias`` (q, k, v, o)
==========  ====================================  ===============================================

Hugging Face's ``nn.Linear`` weights are ``[d_out, d_in]``: ``q_proj.weight``
``[(head_index d_head), d_model]`` becomes ``W_Q [head_index, d_model, d_head]``,
``k_proj``/``v_proj`` (``n_key_value_heads`` heads) become ``W_K``/``W_V`` (stored as
``_W_K``/``_W_V`` when grouped), ``o_proj`` becomes ``W_O [head_index, d_head, d_model]``,
``gate_proj``/``up_proj``/``down_proj`` become ``W_gate``/``W_in``/``W_out`` (transposed),
the norms' ``weight`` our ``w``. Biases the checkpoint lacks are ours at zero. With tied
embeddings (no ``lm_head.weight``) ``W_U`` is the transposed token embedding.

Variants not computed here are refused by ``config_from_hf`` with a ``ValueError``
naming them, before any weight is read.
"""

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
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
    require_rms_decoder_fields,
    rms_decoder_fields,
)
from interp_transformer.families.gpt2.hf import ACTIVATIONS
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.llama.reference import hf_reference_activations
from interp_transformer.parts.rotary import RopeScaling

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# model types whose attention biases are fixed, not set by attention_bias (which puts them on q, k, v and o)
FIXED_BIASES = {"mistral": (), "qwen2": ("q", "k", "v")}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# model types whose attention slides over sliding_window keys on every layer / on the layers layer_types names
WINDOW_EVERY_LAYER = ("mistral", "mixtral", "qwen3_moe")
WINDOW_BY_LAYER_TYPE = ("qwen2", "qwen3", "qwen2_moe")


def _attn_biases(hf_config) -> tuple[str, ...]:
    model_type = hf_config.model_type
    if model_type in FIXED_BIASES:
        return FIXED_BIASES[model_type]
    return ("q", "k", "v", "o") if getattr(hf_config, "attention_bias", False) else ()


def _rope_scaling(hf_config, d_head: int) -> tuple[float, RopeScaling | None]:
    """``(rotary_base, rope_scaling)`` from Hugging Face's ``rope_parameters``; ``ValueError`` for what we do not
    compute."""
    what = f"{hf_config.model_type} config"
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    if parameters and all(isinstance(value, dict) for value in parameters.values()):
        raise ValueError(
            f"{what} has rope_parameters per layer type ({sorted(parameters)}); one set for every layer is supported"
        )
    factor = parameters.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    if factor is not None and float(factor) != 1.0:
        raise ValueError(
            f"{what} has partial_rotary_factor={factor}: Hugging Face's {hf_config.model_type} rotates whole heads "
            f"(d_head={d_head}), so a partial factor is not a variant this family computes"
        )
    return rope_from_parameters(parameters, what, default_base=getattr(hf_config, "rope_theta", 10000.0))


def rope_from_parameters(
    parameters: dict, what: str, default_base: float = 10000.0
) -> tuple[float, RopeScaling | None]:
    """``(rotary_base, rope_scaling)`` from one set of Hugging Face ``rope_parameters``; ``ValueError`` naming an
    unknown rope type."""
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{what} has rope_type={rope_type!r}; supported: {list(SUPPORTED_ROPE_TYPES)}")
    base = float(parameters.get("rope_theta", default_base))
    if rope_type == "default":
        return base, None
    if rope_type == "linear":
        return base, RopeScaling("linear", float(parameters["factor"]))
    return base, RopeScaling(
        "llama3",
        float(parameters["factor"]),
        low_freq_factor=float(parameters["low_freq_factor"]),
        high_freq_factor=float(parameters["high_freq_factor"]),
        original_max_position_embeddings=int(parameters["original_max_position_embeddings"]),
    )


def _sliding_window(hf_config):
    """The window every layer uses, or None; mixed full and sliding layers are refused.

    Read as Hugging Face's model of the ``model_type`` reads it: Llama's attention has no
    window (a ``sliding_window`` or ``layer_types`` in its config changes nothing there),
    Mistral's, Mixtral's and Qwen3-MoE's apply ``sliding_window`` to every layer whatever
    ``layer_types`` says, Qwen2's, Qwen3's and Qwen2-MoE's slide on the layers ``layer_types`` names.
    """
    model_type = hf_config.model_type
    if model_type not in WINDOW_EVERY_LAYER + WINDOW_BY_LAYER_TYPE:
        return None
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and model_type in WINDOW_BY_LAYER_TYPE:
        kinds = sorted(set(layer_types))
        unknown = [kind for kind in kinds if kind not in ("full_attention", "sliding_attention")]
        if unknown:
            raise ValueError(
                f"{model_type} config has layer_types {unknown}; supported: full_attention, sliding_attention"
            )
        if len(kinds) > 1:
            raise ValueError(
                f"{model_type} config mixes full_attention and sliding_attention layers "
                f"(layer_types={list(layer_types)}); one kind of attention for every layer is supported"
            )
        if kinds != ["sliding_attention"]:
            return None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise ValueError(
            f"{model_type} config slides its attention with sliding_window={window!r}; a positive int is supported"
        )
    return window


def config_from_hf(hf_config) -> LlamaConfig:
    """Our config from a ``LlamaConfig``/``MistralConfig``/``Qwen2Config``/``Qwen3Config`` of ``transformers``.

    ``ValueError`` naming the field for what is not computed here: MLP biases, an
    activation we do not have, rope types other than default/linear/llama3, partial
    rotary, per-layer rope parameters, a mix of full and sliding-window layers.
    """
    model_type = read_model_type(hf_config, MODEL_TYPES)
    return LlamaConfig(
        **llama_fields(hf_config), sliding_window=_sliding_window(hf_config), qk_norm=model_type == "qwen3"
    )


def llama_fields(hf_config) -> dict:
    """The fields of ``LlamaConfig`` every Llama-like config gives alike: all but ``sliding_window`` and ``qk_norm``.

    ``ValueError`` naming the field for MLP biases, an activation we do not have, rope types
    other than default/linear/llama3, partial rotary and per-layer rope parameters.
    """
    model_type = hf_config.model_type
    require_rms_decoder_fields(hf_config, model_type)
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError(
            f"{model_type} config has mlp_bias=True (biases on gate/up/down projections); only "
            "mlp_bias=False is supported"
        )
    activation = hf_config.hidden_act
    if activation not in ACTIVATIONS:
        raise ValueError(f"{model_type} hidden_act={activation!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    rotary_base, rope_scaling = _rope_scaling(hf_config, d_head)
    return dict(
        n_key_value_heads=hf_config.num_key_value_heads or hf_config.num_attention_heads,
        d_head=d_head,
        d_mlp=hf_config.intermediate_size,
        act_fn=ACTIVATIONS[activation],
        rotary_base=rotary_base,
        rope_scaling=rope_scaling,
        attn_biases=_attn_biases(hf_config),
        **rms_decoder_fields(hf_config, model_type),
    )


def expected_hf_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:  # any config with Llama's fields (MoE, gpt-oss, Gemma)
    """Name -> shape of every tensor of a Hugging Face checkpoint of ``cfg`` (``model.`` prefix removed)."""

    def layer_shapes(p: str) -> dict[str, tuple[int, ...]]:
        shapes = {p + "input_layernorm.weight": (cfg.d_model,), **attention_shapes(cfg, p + "self_attn.")}
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (cfg.d_head,)
        shapes[p + "post_attention_layernorm.weight"] = (cfg.d_model,)
        return {**shapes, **gated_mlp_shapes(p + "mlp.", cfg.d_model, cfg.d_mlp)}

    return llama_layout_shapes(cfg, layer_shapes)


def attention_shapes(cfg, p: str) -> dict[str, tuple[int, ...]]:
    """The shapes of one Llama-style attention's ``{q,k,v,o}_proj`` weights and the biases ``cfg.attn_biases``
    names; ``p`` ends in ``self_attn.``."""
    widths = {"q": cfg.n_heads * cfg.d_head, "k": cfg.n_key_value_heads * cfg.d_head}
    widths["v"] = widths["k"]
    shapes: dict[str, tuple[int, ...]] = {
        p + f"{letter}_proj.weight": (width, cfg.d_model) for letter, width in widths.items()
    }
    shapes[p + "o_proj.weight"] = (cfg.d_model, widths["q"])
    for letter in cfg.attn_biases:
        shapes[p + f"{letter}_proj.bias"] = (widths.get(letter, cfg.d_model),)
    return shapes


def gated_mlp_shapes(p: str, d_model: int, d_mlp: int) -> dict[str, tuple[int, ...]]:
    """The shapes of a gated MLP's ``gate_proj``, ``up_proj`` and ``down_proj`` weights; ``p`` ends in a dot."""
    return {
        p + "gate_proj.weight": (d_mlp, d_model),
        p + "up_proj.weight": (d_mlp, d_model),
        p + "down_proj.weight": (d_model, d_mlp),
    }


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: LlamaConfig) -> dict[str, Tensor]:
    """Hugging Face Llama-family state dict -> ours. Pure: the input is not changed, the output shares no memory with
    it.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    Each input tensor is read once.
    """
    read = CheckedCheckpoint(hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg))
    return convert_llama_layout(read, cfg, functools.partial(convert_llama_block, read, cfg))


def convert_llama_block(
    read: Callable[[str], Tensor],
    cfg,
    layer: int,
    dtype: torch.dtype,
    device: torch.device,
    convert_mlp: Callable[[], dict[str, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """One Llama-style block under our names: ``input_layernorm`` as ``ln1``, the attention,
    ``post_attention_layernorm`` as ``ln2``, then the MLP: ``convert_mlp()``, or by default the gated MLP."""
    m, q = f"layers.{layer}.", f"blocks.{layer}."
    return {
        q + "ln1.w": fresh(read(m + "input_layernorm.weight")),
        **convert_attention(read, cfg, layer, dtype, device),
        q + "ln2.w": fresh(read(m + "post_attention_layernorm.weight")),
        **(convert_mlp() if convert_mlp else convert_gated_mlp(read, m + "mlp.", q + "mlp.", dtype, device)),
    }


def convert_attention(read: Callable[[str], Tensor], cfg, layer: int, dtype: torch.dtype, device) -> dict[str, Tensor]:
    """One Llama-style attention (``layers.L.self_attn.{q,k,v,o}_proj``, q/k norms) under our names; zeros for absent
    biases.

    ``cfg`` is any config with Llama's attention fields; the q/k norms' weights go to
    ``attn.q_norm.w``/``k_norm.w``.
    """
    p, q = f"layers.{layer}.self_attn.", f"blocks.{layer}.attn."
    kv = "" if cfg.n_key_value_heads == cfg.n_heads else "_"  # grouped keys/values are stored as _W_K, _W_V, ...
    ours = {}
    for letter, ours_name in (("q", "W_Q"), ("k", kv + "W_K"), ("v", kv + "W_V")):
        ours[q + ours_name] = heads_in(read(p + f"{letter}_proj.weight"), cfg.d_head)
    ours[q + "W_O"] = heads_out(read(p + "o_proj.weight"), cfg.d_head)
    heads = {"q": cfg.n_heads, "k": cfg.n_key_value_heads, "v": cfg.n_key_value_heads}
    for letter, ours_name in (("q", "b_Q"), ("k", kv + "b_K"), ("v", kv + "b_V")):
        bias = (
            read(p + f"{letter}_proj.bias")
            if letter in cfg.attn_biases
            else torch.zeros(heads[letter] * cfg.d_head, dtype=dtype, device=device)
        )
        ours[q + ours_name] = per_head_bias(bias, cfg.d_head)
    ours[q + "b_O"] = (
        fresh(read(p + "o_proj.bias"))
        if "o" in cfg.attn_biases
        else torch.zeros(cfg.d_model, dtype=dtype, device=device)
    )
    if cfg.qk_norm:
        ours[q + "q_norm.w"] = fresh(read(p + "q_norm.weight"))
        ours[q + "k_norm.w"] = fresh(read(p + "k_norm.weight"))
    return ours


def convert_gated_mlp(
    read: Callable[[str], Tensor], hf_prefix: str, prefix: str, dtype: torch.dtype, device
) -> dict[str, Tensor]:
    """A Hugging Face gated MLP (``gate_proj``, ``up_proj``, ``down_proj``, no biases) as ``W_gate``, ``W_in``,
    ``W_out`` (zero biases)."""
    W_out = linear_to_ours(read(hf_prefix + "down_proj.weight"))
    d_mlp, d_model = W_out.shape
    return {
        prefix + "W_gate": linear_to_ours(read(hf_prefix + "gate_proj.weight")),
        prefix + "W_in": linear_to_ours(read(hf_prefix + "up_proj.weight")),
        prefix + "b_in": torch.zeros(d_mlp, dtype=dtype, device=device),
        prefix + "W_out": W_out,
        prefix + "b_out": torch.zeros(d_model, dtype=dtype, device=device),
    }


def load_hf_model(directory, *, dtype=torch.float32):
    """The Hugging Face reference model of a decoder directory (Llama family, Gemma, mixtures of experts), eager
    attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager").eval()


__all__ = [
    "MODEL_TYPES",
    "config_from_hf",
    "convert_attention",
    "convert_gated_mlp",
    "convert_llama_block",
    "convert_state_dict",
    "attention_shapes",
    "expected_hf_shapes",
    "gated_mlp_shapes",
    "hf_reference_activations",
    "llama_fields",
    "load_hf_model",
    "rope_from_parameters",
]

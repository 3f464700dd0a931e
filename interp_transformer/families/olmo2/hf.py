"""OLMo 2 and OLMo 3 from Hugging Face: config, pure converter, strict build, reference.

==========  ======================  ==============================================================
model_type  Hugging Face class      in our config
==========  ======================  ==============================================================
``olmo2``   ``Olmo2ForCausalLM``    every block full attention (``layer_types=None``)
``olmo3``   ``Olmo3ForCausalLM``    ``layer_types`` and ``sliding_window``; ``rope_parameters`` per
                                    layer type: the full layers' ``rotary_base``/``rope_scaling``,
                                    the sliding layers' ``rotary_base_local``/``rope_scaling_local``
==========  ======================  ==============================================================

Weights are the Llama family's layout (``convert_attention``, ``convert_gated_mlp``) without the
norms before the sublayers: ``post_attention_layernorm`` becomes ``ln1_post``,
``post_feedforward_layernorm`` ``ln2_post``, ``norm`` ``ln_final``; ``q_norm``/``k_norm``
(``[(head_index d_head)]``, over all heads) become ``attn.q_norm.w``/``attn.k_norm.w`` as they are.
``attention_bias`` puts biases on q, k, v and o; the q/k norms then read the biased projections,
as ours do.

What Hugging Face's OLMo reads and this converter does not compute is refused by
``config_from_hf``, before any weight is read, in one ``ValueError`` naming every such field:
an activation we do not have, rope types other than default/linear/llama3, partial rotary, a
layer type other than full or sliding attention, sliding layers without a window. Read only in
training, and so not part of what a model in eval mode computes: ``attention_dropout``.
"""

from collections.abc import Mapping

import torch
from torch import Tensor

from interp_transformer.families.conversion import (
    HF_ACTIVATIONS,
    CheckedCheckpoint,
    convert_llama_layout,
    fresh,
    llama_layout_shapes,
    read_model_type,
    refuse_features,
    require_rms_decoder_fields,
    rms_decoder_fields,
)
from interp_transformer.families.llama.hf import (
    attention_shapes,
    convert_attention,
    convert_gated_mlp,
    gated_mlp_shapes,
    load_hf_model,
    rope_from_parameters,
)
from interp_transformer.families.olmo2.recipe import LAYER_TYPES, Olmo2Config
from interp_transformer.families.olmo2.reference import hf_reference_activations

MODEL_TYPES = ("olmo2", "olmo3")
# Hugging Face norm -> ours, per block
BLOCK_NORMS = {"post_attention_layernorm": "ln1_post", "post_feedforward_layernorm": "ln2_post"}


def _head_dim(hf_config, problems: list[str]) -> int:
    """``head_dim`` where the config gives one (Hugging Face's attention reads it), else ``hidden_size / heads``."""
    d_head = getattr(hf_config, "head_dim", None)
    if d_head is None:
        return hf_config.hidden_size // hf_config.num_attention_heads
    if isinstance(d_head, bool) or not isinstance(d_head, int) or d_head <= 0:
        problems.append(f"head_dim={d_head!r} (a positive int is needed)")
    return d_head


def _layers(hf_config, problems: list[str]) -> tuple[tuple[str, ...] | None, int | None]:
    """OLMo 3's ``(layer_types, sliding_window)``; OLMo 2's attention reads neither: ``(None, None)``."""
    if hf_config.model_type != "olmo3":
        return None, None
    layer_types = tuple(getattr(hf_config, "layer_types", None) or ())
    if len(layer_types) != hf_config.num_hidden_layers:
        problems.append(
            f"layer_types {list(layer_types)} (one per layer, num_hidden_layers={hf_config.num_hidden_layers})"
        )
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        problems.append(f"layer_types {unknown} (supported: {', '.join(LAYER_TYPES)})")
    window = getattr(hf_config, "sliding_window", None)
    if "sliding_attention" not in layer_types:
        return layer_types, None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        problems.append(f"sliding_attention layers with sliding_window={window!r} (a positive int is needed)")
    return layer_types, window


def _rope(parameters: dict, what: str, default_base: float, problems: list[str]) -> tuple | None:
    """``(base, scaling)`` of one set of ``rope_parameters``; None (and a problem) for what is not computed."""
    factor = parameters.get("partial_rotary_factor")
    if factor is not None and float(factor) != 1.0:
        problems.append(f"{what} has partial_rotary_factor={factor} (OLMo rotates whole heads)")
    try:
        return rope_from_parameters(parameters, what, default_base)
    except ValueError as error:
        problems.append(str(error))
        return None


def _rotary(hf_config, problems: list[str]) -> dict:
    """The full layers' ``rotary_base``/``rope_scaling`` and (OLMo 3) the sliding layers' own.

    Read as Hugging Face's models read ``rope_parameters``: OLMo 2 one flat set for every layer
    (entries per layer type beside it are not read); OLMo 3 one set per layer type its
    ``layer_types`` uses, ``rope_parameters[layer_type]`` (flat entries beside them, which its
    config keeps when given a flat set, are not read).
    """
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    default_base = float(getattr(hf_config, "rope_theta", 10000.0) or 10000.0)
    if hf_config.model_type != "olmo3":
        flat = {name: value for name, value in parameters.items() if not isinstance(value, dict)}
        full = _rope(flat, "rope_parameters", default_base, problems)
        return {} if full is None else dict(rotary_base=full[0], rope_scaling=full[1])
    used = [kind for kind in LAYER_TYPES if kind in tuple(getattr(hf_config, "layer_types", None) or ())]
    found = {}  # kind -> its (base, scaling); a kind whose settings are refused has none
    for kind in used:
        values = parameters.get(kind)
        if not isinstance(values, dict):
            problems.append(f"rope_parameters[{kind}]={values!r} (a dict of rope settings for the {kind} layers)")
            continue
        rope = _rope(values, f"rope_parameters[{kind}]", default_base, problems)
        if rope is not None:
            found[kind] = rope
    if not used or any(found.get(kind) is None for kind in used):
        return {}
    full = found.get("full_attention") or found["sliding_attention"]  # the base of the layers that use it
    local = found.get("sliding_attention")
    return dict(
        rotary_base=full[0],
        rope_scaling=full[1],
        rotary_base_local=None if local is None else local[0],
        rope_scaling_local=None if local is None else local[1],
    )


def unsupported_features(hf_config) -> list[str]:
    """Every field value of an OLMo 2/3 config this converter does not compute, in words (empty: all is)."""
    problems = []
    activation = getattr(hf_config, "hidden_act", None)
    if activation not in HF_ACTIVATIONS:
        problems.append(f"hidden_act={activation!r} (supported: {sorted(HF_ACTIVATIONS)})")
    _head_dim(hf_config, problems)
    _layers(hf_config, problems)
    _rotary(hf_config, problems)
    return problems


def config_from_hf(hf_config) -> Olmo2Config:
    """Our config from an ``Olmo2Config`` or ``Olmo3Config`` of ``transformers``.

    ``ValueError`` naming every field value not computed here (see the module docstring).
    """
    model_type = read_model_type(hf_config, MODEL_TYPES)
    require_rms_decoder_fields(hf_config, model_type)
    problems = unsupported_features(hf_config)
    refuse_features(model_type, problems)
    layer_types, window = _layers(hf_config, problems)
    return Olmo2Config(
        n_key_value_heads=hf_config.num_key_value_heads or hf_config.num_attention_heads,
        d_head=_head_dim(hf_config, problems),
        d_mlp=hf_config.intermediate_size,
        act_fn=HF_ACTIVATIONS[hf_config.hidden_act],
        layer_types=layer_types,
        sliding_window=window,
        attn_biases=("q", "k", "v", "o") if getattr(hf_config, "attention_bias", False) else (),
        **_rotary(hf_config, problems),
        **rms_decoder_fields(hf_config, model_type),
    )


def expected_hf_shapes(cfg: Olmo2Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face OLMo 2/3 checkpoint of ``cfg`` (``model.`` prefix removed)."""

    def layer_shapes(p: str) -> dict[str, tuple[int, ...]]:
        shapes = attention_shapes(cfg, p + "self_attn.")
        shapes[p + "self_attn.q_norm.weight"] = (cfg.n_heads * cfg.d_head,)
        shapes[p + "self_attn.k_norm.weight"] = (cfg.n_key_value_heads * cfg.d_head,)
        for hf_norm in BLOCK_NORMS:
            shapes[p + hf_norm + ".weight"] = (cfg.d_model,)
        return {**shapes, **gated_mlp_shapes(p + "mlp.", cfg.d_model, cfg.d_mlp)}

    return llama_layout_shapes(cfg, layer_shapes)


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: Olmo2Config) -> dict[str, Tensor]:
    """Hugging Face OLMo 2/3 state dict -> ours. Pure: the input is not changed, the output shares no memory with it.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    """
    read = CheckedCheckpoint(hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg))

    def convert_layer(layer: int, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        m, q = f"layers.{layer}.", f"blocks.{layer}."
        ours = convert_attention(read, cfg, layer, dtype, device)  # q/k norms included (cfg.qk_norm)
        for hf_norm, our_norm in BLOCK_NORMS.items():
            ours[q + our_norm + ".w"] = fresh(read(m + hf_norm + ".weight"))
        return {**ours, **convert_gated_mlp(read, m + "mlp.", q + "mlp.", dtype, device)}

    return convert_llama_layout(read, cfg, convert_layer)


__all__ = [
    "MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
    "unsupported_features",
]

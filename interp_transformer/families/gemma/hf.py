"""The Gemma family from Hugging Face (Gemma 1, 2, 3 text models): config, pure converter, strict build, reference.

==============  ========================  ===========================================================
model_type      Hugging Face class        in our config
==============  ========================  ===========================================================
``gemma``       ``GemmaForCausalLM``      ``post_norms=False``, no soft-caps, no window, d_head^-1/2
``gemma2``      ``Gemma2ForCausalLM``     pre- and post-norms, ``attn_softcap``, ``final_softcap``,
                                          ``query_pre_attn_scalar``, sliding layers from ``layer_types``
``gemma3_text``  ``Gemma3ForCausalLM``    as Gemma 2 without the attention soft-cap, plus ``qk_norm``
                                          and the sliding layers' own rotary base (``rope_parameters``
                                          per layer type)
``gemma3``      ``Gemma3ForConditional``  refused: it carries a vision tower
                ``Generation``
==============  ========================  ===========================================================

Weights are Llama's layout (``convert_attention``, ``convert_gated_mlp``) with Gemma's norms:
each norm's ``weight`` becomes the ``w_offset`` of a ``GemmaRMSNorm`` (gain ``1 + w_offset``).
In Gemma 1, ``post_attention_layernorm`` is the norm before the MLP (our ``ln2``); in Gemma
2/3 it is the norm *after* attention (our ``ln1_post``), ``pre_feedforward_layernorm`` is
``ln2`` and ``post_feedforward_layernorm`` is ``ln2_post``. ``W_E`` is the embedding as
stored; the ``sqrt(d_model)`` factor is the ``ScaledEmbed`` part's.

``config_from_hf`` refuses, before any weight is read, every feature it does not compute,
naming them all in one ``ValueError``.
"""

from collections.abc import Mapping

import torch
from torch import Tensor

from interp_transformer.core.strict import require_config_fields
from interp_transformer.families.conversion import (
    CheckedCheckpoint,
    convert_llama_layout,
    fresh,
    refuse_features,
    rms_decoder_fields,
)
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gemma.reference import hf_reference_activations
from interp_transformer.families.gpt2.hf import ACTIVATIONS
from interp_transformer.families.llama.hf import (
    convert_attention,
    convert_gated_mlp,
    load_hf_model,
    rope_from_parameters,
)
from interp_transformer.families.llama.hf import (
    expected_hf_shapes as llama_shapes,
)

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")
PER_LAYER_WINDOWS = ("gemma2", "gemma3_text")  # model types whose attention reads layer_types and sliding_window
PER_LAYER_TYPE_ROPE = ("gemma3_text",)  # model types whose rotary reads rope_parameters per layer type
REFUSED_MODEL_TYPES = {
    "gemma3": "Gemma3ForConditionalGeneration: a vision tower (vision_config) and a multimodal projector beside the "
    "text model, which are not implemented; load a text-only Gemma 3 (Gemma3ForCausalLM, model_type 'gemma3_text')",
}


def _window(hf_config, problems: list[str]) -> tuple[int | None, int | None]:
    """``(sliding_window, global_every)`` from ``layer_types``; a pattern other than every n-th layer global is a
    problem. Gemma 1's attention reads neither field: ``(None, None)``."""
    if hf_config.model_type not in PER_LAYER_WINDOWS:
        return None, None
    layer_types = list(getattr(hf_config, "layer_types", None) or [])
    if not layer_types or "sliding_attention" not in layer_types:
        return None, None
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    window = getattr(hf_config, "sliding_window", None)
    if unknown:
        problems.append(f"layer_types {unknown} (supported: full_attention, sliding_attention)")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        problems.append(f"sliding_attention layers with sliding_window={window!r} (a positive int is needed)")
    if unknown or "full_attention" not in layer_types:
        return window, None
    every = layer_types.index("full_attention") + 1
    expected = [
        "full_attention" if (layer + 1) % every == 0 else "sliding_attention" for layer in range(len(layer_types))
    ]
    if layer_types != expected:
        problems.append(f"layer_types {layer_types} (supported: every n-th layer global, the others sliding)")
    return window, every


def _rotary(hf_config, d_head: int, problems: list[str]) -> dict:
    """``rotary_base``, ``rope_scaling`` and (Gemma 3) ``rotary_base_local`` from ``rope_parameters``.

    Read as Hugging Face's models read it: Gemma 1 and 2 one flat set for every layer, Gemma 3
    one set per layer type, ``rope_parameters[layer_type]`` (flat entries beside them, which
    its config keeps when given a flat set, are not read).
    """
    what = f"{hf_config.model_type} config"
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    nested = {name: value for name, value in parameters.items() if isinstance(value, dict)}
    flat = {name: value for name, value in parameters.items() if not isinstance(value, dict)}
    per_layer_type = hf_config.model_type in PER_LAYER_TYPE_ROPE
    sets = nested if per_layer_type else {"full_attention": flat}
    for name, values in sets.items():
        factor = values.get("partial_rotary_factor")
        if factor is not None and float(factor) != 1.0:
            problems.append(
                f"partial_rotary_factor={factor} for {name} layers (Gemma rotates whole heads, d_head={d_head})"
            )
    try:
        base, scaling = rope_from_parameters(
            sets.get("full_attention", {}), what, getattr(hf_config, "rope_theta", 10000.0)
        )
        local = None
        if per_layer_type and "sliding_attention" in sets:
            local, local_scaling = rope_from_parameters(sets["sliding_attention"], what)
            if local_scaling is not None:
                problems.append(
                    f"rope_parameters[sliding_attention]={sets['sliding_attention']} (the sliding layers rotate "
                    "unscaled here: rope_type 'default' is supported there)"
                )
    except ValueError as error:
        problems.append(str(error).removeprefix(what + " has "))
        return {}
    return dict(rotary_base=base, rope_scaling=scaling, rotary_base_local=local)


def unsupported_features(hf_config) -> list[str]:
    """Every feature of a Gemma config this converter does not compute, in words (empty: all is supported)."""
    model_type = hf_config.model_type
    problems = []
    if model_type in REFUSED_MODEL_TYPES:
        return [REFUSED_MODEL_TYPES[model_type]]
    if getattr(hf_config, "vision_config", None) is not None:
        problems.append("a vision tower (vision_config)")
    if getattr(hf_config, "use_bidirectional_attention", False):
        problems.append("use_bidirectional_attention=True (an embedding model's bidirectional attention)")
    if model_type == "gemma3_text" and getattr(hf_config, "attn_logit_softcapping", None) is not None:
        problems.append(
            f"attn_logit_softcapping={hf_config.attn_logit_softcapping} (Hugging Face's Gemma 3 attention does "
            "not apply it, so what it would compute is not defined)"
        )
    activation = _activation(hf_config, problems)
    if activation is not None and activation not in ACTIVATIONS:
        fields = [name for name in ("hidden_act", "hidden_activation") if getattr(hf_config, name, None) is not None]
        problems.append(
            f"hidden activation {activation!r} ({', '.join(f'{name}={activation!r}' for name in fields)}; supported: "
            f"{sorted(ACTIVATIONS)})"
        )
    return problems


def _activation(hf_config, problems: list[str]) -> str | None:
    """The MLP's activation, from ``hidden_act`` or ``hidden_activation``; a problem when both are given and differ.

    ``transformers`` releases disagree on which field a Gemma MLP reads (5.24 reads
    ``hidden_act`` for Gemma 1 and ``hidden_activation`` for Gemma 2 and 3; earlier releases
    preferred ``hidden_activation`` for Gemma 1), so a config whose two fields differ has no
    single meaning and is refused, naming both.
    """
    given = {name: getattr(hf_config, name, None) for name in ("hidden_act", "hidden_activation")}
    given = {name: value for name, value in given.items() if value is not None}
    if len(set(given.values())) > 1:
        act, activation = given["hidden_act"], given["hidden_activation"]
        problems.append(
            f"hidden_act={act!r} and hidden_activation={activation!r} differ "
            "(transformers releases differ on which one Gemma's MLP reads; give both the same value)"
        )
        return None
    if not given:
        problems.append("no hidden activation (neither hidden_act nor hidden_activation is set)")
        return None
    return next(iter(given.values()))


def config_from_hf(hf_config) -> GemmaConfig:
    """Our config from a ``GemmaConfig``/``Gemma2Config``/``Gemma3TextConfig`` of ``transformers``.

    ``ValueError`` naming every feature not computed here (a vision tower, bidirectional
    attention, an attention soft-cap Gemma 3 ignores, rope types other than default/linear/
    llama3, scaled or partial rotary on sliding layers, a sliding pattern other than every
    n-th layer global, an unknown activation).
    """
    model_type = hf_config.model_type
    if model_type not in MODEL_TYPES and model_type not in REFUSED_MODEL_TYPES:
        raise ValueError(f"config_from_hf reads the model types {list(MODEL_TYPES)}, got {model_type!r}")
    problems = unsupported_features(hf_config)
    if model_type in REFUSED_MODEL_TYPES:
        raise ValueError(f"{model_type} config has features not implemented here: {'; '.join(problems)}")
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
            "vocab_size",
            "max_position_embeddings",
        ),
        positive_floats=("rms_norm_eps",),
    )
    window, global_every = _window(hf_config, problems)
    rotary = _rotary(hf_config, hf_config.head_dim, problems)
    refuse_features(model_type, problems)
    later = model_type != "gemma"  # Gemma 2 and 3
    activation = _activation(hf_config, problems)
    if activation is None:  # unsupported_features has refused such a config already
        raise ValueError(f"{model_type} config has features not implemented here: {'; '.join(problems)}")
    return GemmaConfig(
        n_key_value_heads=hf_config.num_key_value_heads,
        d_head=hf_config.head_dim,
        d_mlp=hf_config.intermediate_size,
        act_fn=ACTIVATIONS[activation],
        query_pre_attn_scalar=float(hf_config.query_pre_attn_scalar) if later else None,
        post_norms=later,
        qk_norm=model_type == "gemma3_text",
        attn_softcap=_optional_float(getattr(hf_config, "attn_logit_softcapping", None))
        if model_type == "gemma2"
        else None,
        final_softcap=_optional_float(getattr(hf_config, "final_logit_softcapping", None)) if later else None,
        sliding_window=window,
        global_every=global_every,
        attn_biases=("q", "k", "v", "o") if getattr(hf_config, "attention_bias", False) else (),
        **rotary,
        **rms_decoder_fields(hf_config, model_type),
    )


def _optional_float(value) -> float | None:
    return None if value is None else float(value)


def expected_hf_shapes(cfg: GemmaConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face Gemma checkpoint of ``cfg`` (``model.`` prefix removed)."""
    shapes = llama_shapes(cfg)  # Llama's layout; Gemma 2/3 add the norms around the MLP
    if cfg.post_norms:
        for layer in range(cfg.n_layers):
            for norm in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                shapes[f"layers.{layer}.{norm}.weight"] = (cfg.d_model,)
    return shapes


# Hugging Face norm -> ours, per block: Gemma 1 has two norms (Llama's), Gemma 2/3 four.
BLOCK_NORMS = {
    False: {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"},
    True: {
        "input_layernorm": "ln1",
        "post_attention_layernorm": "ln1_post",
        "pre_feedforward_layernorm": "ln2",
        "post_feedforward_layernorm": "ln2_post",
    },
}


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: GemmaConfig) -> dict[str, Tensor]:
    """Hugging Face Gemma state dict -> ours. Pure: the input is not changed, the output shares no memory with it.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    """
    read = CheckedCheckpoint(hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg))

    def convert_layer(layer: int, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        m, q = f"layers.{layer}.", f"blocks.{layer}."
        ours = {
            q + our_norm + ".w_offset": fresh(read(m + hf_norm + ".weight"))
            for hf_norm, our_norm in BLOCK_NORMS[cfg.post_norms].items()
        }
        for name, tensor in convert_attention(read, cfg, layer, dtype, device).items():
            ours[name + "_offset" if name.endswith("_norm.w") else name] = tensor  # q_norm.w -> q_norm.w_offset
        return {**ours, **convert_gated_mlp(read, m + "mlp.", q + "mlp.", dtype, device)}

    return convert_llama_layout(read, cfg, convert_layer, final_norm="ln_final.w_offset")


__all__ = [
    "MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
    "unsupported_features",
]

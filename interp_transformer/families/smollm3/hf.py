"""SmolLM3 from Hugging Face (``model_type`` "smollm3"): config, converter, strict build, reference.

The checkpoint is Llama's, tensor for tensor (``loading.llama`` converts it); the config says
two more things per layer, read into ``SmolLM3Config``:

- ``no_rope_layers``: 1 where the layer rotates q and k, 0 where it does not (NoPE); the
  zeros become ``nope_layers``. Hugging Face's default (``no_rope_layer_interval`` 4) is
  already written into the list by its config.
- ``layer_types``: ``sliding_attention`` layers see at most ``sliding_window`` keys
  (``sliding_layers``). Hugging Face masks them by ``layer_types`` and passes the window to its
  attention only with ``use_sliding_window``, so sliding layers without ``use_sliding_window``
  (where the two disagree) are refused, as are sliding layers without a window.

Llama's fields are read as for Llama (``llama.llama_fields``: rope types default, linear and
llama3, ``attention_bias``, tied embeddings, ...). ``attention_dropout`` acts only in
training. ``config_from_hf`` refuses, before any weight is read, what it does not compute,
naming every feature in one ``ValueError``.
"""

from collections.abc import Mapping

from jaxtyping import Int
from torch import Tensor

from interp_transformer.families.conversion import read_model_type, refuse_features
from interp_transformer.families.llama.hf import convert_state_dict as llama_convert_state_dict
from interp_transformer.families.llama.hf import expected_hf_shapes, llama_fields, load_hf_model
from interp_transformer.families.llama.reference import hf_reference_activations as llama_reference_activations
from interp_transformer.families.smollm3.recipe import SmolLM3Config

MODEL_TYPES = ("smollm3",)
LAYER_TYPES = ("full_attention", "sliding_attention")


def _per_layer(hf_config, field: str, n_layers: int, problems: list[str]) -> list:
    """The first ``n_layers`` entries of a per-layer list of the config; a problem when it is shorter."""
    values = getattr(hf_config, field, None)
    if not isinstance(values, (list, tuple)) or len(values) < n_layers:
        problems.append(f"{field}={values!r} (one entry per layer, num_hidden_layers={n_layers}, is needed)")
        return []
    return list(values[:n_layers])


def layer_choices(hf_config) -> tuple[dict, list[str]]:
    """``nope_layers``, ``sliding_window`` and ``sliding_layers`` from the config, and the problems found."""
    n_layers = hf_config.num_hidden_layers
    problems: list[str] = []
    uses_rope = _per_layer(hf_config, "no_rope_layers", n_layers, problems)
    if any(flag not in (0, 1) for flag in uses_rope):  # True and False are 1 and 0
        problems.append(f"no_rope_layers={uses_rope} (1 for a rotary layer, 0 for a NoPE layer)")
    layer_types = _per_layer(hf_config, "layer_types", n_layers, problems)
    unknown = sorted({str(kind) for kind in layer_types} - set(LAYER_TYPES))
    if unknown:
        problems.append(f"layer_types {unknown} (supported: {list(LAYER_TYPES)})")
    sliding = tuple(layer for layer, kind in enumerate(layer_types) if kind == "sliding_attention")
    window = getattr(hf_config, "sliding_window", None)
    if sliding and not getattr(hf_config, "use_sliding_window", False):
        problems.append(
            f"sliding_attention layers {list(sliding)} with use_sliding_window=False (Hugging Face's eager attention "
            "slides there, its flash attention does not)"
        )
    if sliding and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        problems.append(f"sliding_attention layers {list(sliding)} with sliding_window={window!r} (a positive int)")
    choices = dict(
        nope_layers=tuple(layer for layer, flag in enumerate(uses_rope) if not flag),
        sliding_window=window if sliding else None,
        sliding_layers=sliding or None,
    )
    return choices, problems


def config_from_hf(hf_config) -> SmolLM3Config:
    """Our config from a ``transformers.SmolLM3Config``; ``ValueError`` naming what is not computed here."""
    model_type = read_model_type(hf_config, MODEL_TYPES)
    fields = llama_fields(hf_config)
    choices, problems = layer_choices(hf_config)
    refuse_features(model_type, problems)
    return SmolLM3Config(**fields, **choices)


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: SmolLM3Config) -> dict[str, Tensor]:
    """Hugging Face SmolLM3 state dict -> ours: Llama's layout and conversion (``loading.llama``), checked first."""
    return llama_convert_state_dict(hf_state_dict, cfg)


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face ``SmolLM3ForCausalLM`` (or ``SmolLM3Model``) and return its value for each of our hooks.

    Llama's reference (``llama_reference``); a NoPE layer's attention (``use_rope`` false) does
    not rotate, so it has no ``hook_rot_q``/``hook_rot_k``.
    """
    acts = llama_reference_activations(hf_model, tokens, **forward_kwargs)
    body = hf_model.model if hasattr(hf_model, "model") else hf_model
    for layer, block in enumerate(body.layers):
        if not block.self_attn.use_rope:
            for name in ("hook_rot_q", "hook_rot_k"):
                acts.pop(f"blocks.{layer}.attn.{name}", None)
    return acts


__all__ = [
    "MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "layer_choices",
    "load_hf_model",
]

"""Mixture-of-experts decoders from Hugging Face (Mixtral, Qwen2-MoE, Qwen3-MoE): config, pure converter, strict build.

=============  =====================================  ===============================================
model_type     what differs                           in our config
=============  =====================================  ===============================================
``mixtral``    top-k of ``num_local_experts``, the    ``normalize_routing=True``; Mistral's window
               chosen weights renormalised
``qwen2_moe``  a shared expert and its sigmoid gate,  ``d_mlp_shared``, ``normalize_routing`` from
               q/k/v biases, dense layers             ``norm_topk_prob``, ``dense_layers``
``qwen3_moe``  q/k norms, dense layers                ``qk_norm=True``, ``normalize_routing``
=============  =====================================  ===============================================

A block is dense (an ordinary gated MLP of ``intermediate_size``) when Qwen's config says
so: its index is in ``mlp_only_layers``, or ``(index + 1)`` is not a multiple of
``decoder_sparse_step``.

Two checkpoint layouts are read, because Hugging Face writes one and holds the other:
the files (``save_pretrained``, the hub) keep one tensor per expert
(``block_sparse_moe.experts.E.w1/w2/w3`` in Mixtral, ``mlp.experts.E.gate_proj/up_proj/
down_proj`` in Qwen), while a model in memory stacks them (``mlp.experts.gate_up_proj
[expert, 2 d_mlp, d_model]``, gate rows first, and ``mlp.experts.down_proj``). Either becomes
``blocks.L.mlp.experts.E.W_gate/W_in/W_out`` (zero biases) and ``blocks.L.mlp.W_router``
(the transposed ``gate.weight``). Attention and norms are the Llama family's.
"""

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
    rms_decoder_fields,
)
from interp_transformer.families.gpt2.hf import ACTIVATIONS
from interp_transformer.families.llama.hf import (
    _rope_scaling,
    _sliding_window,
    convert_gated_mlp,
    convert_llama_block,
    gated_mlp_shapes,
    load_hf_model,
)
from interp_transformer.families.llama.hf import (
    expected_hf_shapes as llama_shapes,
)
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.families.moe.reference import hf_reference_activations

MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
# Hugging Face's per-expert file names: (module of the mixture, gate, up, down)
PER_EXPERT_NAMES = {
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
    "qwen2_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
}


def _dense_layers(hf_config) -> tuple[int, ...]:
    """Qwen's blocks without experts: in ``mlp_only_layers``, or off the ``decoder_sparse_step`` grid."""
    if hf_config.model_type == "mixtral":
        return ()
    step, only = getattr(hf_config, "decoder_sparse_step", 1), set(getattr(hf_config, "mlp_only_layers", None) or [])
    return tuple(layer for layer in range(hf_config.num_hidden_layers) if layer in only or (layer + 1) % step)


def config_from_hf(hf_config) -> MoEConfig:
    """Our config from a ``MixtralConfig``/``Qwen2MoeConfig``/``Qwen3MoeConfig``; ``ValueError`` naming what is not
    computed."""
    model_type = read_model_type(hf_config, MODEL_TYPES)
    experts_field = "num_local_experts" if model_type == "mixtral" else "num_experts"
    width_field = "intermediate_size" if model_type == "mixtral" else "moe_intermediate_size"
    require_config_fields(
        hf_config,
        model_type,
        positive_ints=(
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
            "max_position_embeddings",
            experts_field,
            width_field,
            "num_experts_per_tok",
        ),
        positive_floats=("rms_norm_eps",),
    )
    activation = hf_config.hidden_act
    if activation not in ACTIVATIONS:
        raise ValueError(f"{model_type} hidden_act={activation!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    rotary_base, rope_scaling = _rope_scaling(hf_config, d_head)
    dense = _dense_layers(hf_config)
    biases = {
        "mixtral": (),
        "qwen2_moe": ("q", "k", "v") if getattr(hf_config, "qkv_bias", True) else (),
        "qwen3_moe": ("q", "k", "v", "o") if getattr(hf_config, "attention_bias", False) else (),
    }
    return MoEConfig(
        n_key_value_heads=hf_config.num_key_value_heads or hf_config.num_attention_heads,
        d_head=d_head,
        d_mlp=getattr(hf_config, width_field),
        n_experts=getattr(hf_config, experts_field),
        experts_per_token=hf_config.num_experts_per_tok,
        normalize_routing=True if model_type == "mixtral" else bool(hf_config.norm_topk_prob),
        d_mlp_shared=hf_config.shared_expert_intermediate_size if model_type == "qwen2_moe" else None,
        dense_layers=dense,
        d_mlp_dense=hf_config.intermediate_size if dense else None,
        act_fn=ACTIVATIONS[activation],
        rotary_base=rotary_base,
        rope_scaling=rope_scaling,
        sliding_window=_sliding_window(hf_config) or None,  # Qwen2-MoE writes 0 for "no window"
        qk_norm=model_type == "qwen3_moe",
        attn_biases=biases[model_type],
        **rms_decoder_fields(hf_config, model_type),
    )


def is_stacked(names) -> bool:
    """Whether a checkpoint stacks its experts (``experts.gate_up_proj``, a model in memory) or keeps one tensor
    each."""
    return any(name.endswith("experts.gate_up_proj") for name in names)


def expected_hf_shapes(cfg: MoEConfig, model_type: str, stacked: bool) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face checkpoint of ``cfg`` in one of the two layouts (no
    ``model.``)."""
    d_model, d_mlp, n_experts = cfg.d_model, cfg.d_mlp, cfg.n_experts
    shapes = {name: shape for name, shape in llama_shapes(cfg).items() if ".mlp." not in name}
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        if layer in cfg.dense_layers:
            d_dense = cfg.d_mlp_dense
            if d_dense is None:  # MoEConfig refuses dense layers without their width
                raise ValueError(f"dense layers {list(cfg.dense_layers)} need d_mlp_dense, got None")
            shapes.update(gated_mlp_shapes(p + "mlp.", d_model, d_dense))
            continue
        module, gate, up, down = PER_EXPERT_NAMES[model_type]
        if stacked:
            module = "mlp"
            shapes[p + "mlp.experts.gate_up_proj"] = (n_experts, 2 * d_mlp, d_model)
            shapes[p + "mlp.experts.down_proj"] = (n_experts, d_model, d_mlp)
        else:
            for expert in range(n_experts):
                e = p + f"{module}.experts.{expert}."
                shapes[e + f"{gate}.weight"] = shapes[e + f"{up}.weight"] = (d_mlp, d_model)
                shapes[e + f"{down}.weight"] = (d_model, d_mlp)
        shapes[p + f"{module}.gate.weight"] = (n_experts, d_model)
        if cfg.d_mlp_shared is not None:
            shapes.update(gated_mlp_shapes(p + "mlp.shared_expert.", d_model, cfg.d_mlp_shared))
            shapes[p + "mlp.shared_expert_gate.weight"] = (1, d_model)
    return shapes


def _file_family(names) -> str:
    """Which family's per-expert file names a checkpoint uses: Mixtral's ``block_sparse_moe`` or Qwen's ``mlp``."""
    return "mixtral" if any(".block_sparse_moe." in name for name in names) else "qwen2_moe"


def convert_state_dict(
    hf_state_dict: Mapping[str, Tensor], cfg: MoEConfig, model_type: str | None = None
) -> dict[str, Tensor]:
    """Hugging Face mixture-of-experts state dict (either layout) -> ours. Pure; each input tensor is read once.

    Every name and shape is checked first (``CheckpointError`` listing every problem).
    ``model_type`` picks the per-expert file names (default: read from the names).
    """
    read = CheckedCheckpoint(
        hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg, model_type or _file_family(names), is_stacked(names))
    )
    file_family, stacked = model_type or _file_family(read.names), is_stacked(read.names)

    def convert_layer(layer: int, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        if layer in cfg.dense_layers:
            return convert_llama_block(read, cfg, layer, dtype, device)
        mixture = lambda: _convert_mixture(read, cfg, layer, file_family, stacked, dtype, device)  # noqa: E731
        return convert_llama_block(read, cfg, layer, dtype, device, mixture)

    return convert_llama_layout(read, cfg, convert_layer)


def _convert_mixture(
    read, cfg: MoEConfig, layer: int, model_type: str, stacked: bool, dtype, device
) -> dict[str, Tensor]:
    """One block's router, experts and (Qwen2-MoE) shared expert under our names."""
    module, gate, up, down = PER_EXPERT_NAMES[model_type]
    m, q = f"layers.{layer}.{'mlp' if stacked else module}.", f"blocks.{layer}.mlp."
    ours = {q + "W_router": linear_to_ours(read(m + "gate.weight"))}
    if stacked:
        gate_up = einops.rearrange(
            read(m + "experts.gate_up_proj"), "expert (two d_mlp) d_model -> two expert d_model d_mlp", two=2
        )
        gates, ups = gate_up[0], gate_up[1]  # Hugging Face's gate rows come first
        downs = einops.rearrange(read(m + "experts.down_proj"), "expert d_model d_mlp -> expert d_mlp d_model")
        for expert in range(cfg.n_experts):
            e = q + f"experts.{expert}."
            ours.update(
                {e + "W_gate": fresh(gates[expert]), e + "W_in": fresh(ups[expert]), e + "W_out": fresh(downs[expert])}
            )
    else:
        for expert in range(cfg.n_experts):
            e, files = q + f"experts.{expert}.", m + f"experts.{expert}."
            ours[e + "W_gate"] = linear_to_ours(read(files + f"{gate}.weight"))
            ours[e + "W_in"] = linear_to_ours(read(files + f"{up}.weight"))
            ours[e + "W_out"] = linear_to_ours(read(files + f"{down}.weight"))
    for expert in range(cfg.n_experts):
        ours[q + f"experts.{expert}.b_in"] = torch.zeros(cfg.d_mlp, dtype=dtype, device=device)
        ours[q + f"experts.{expert}.b_out"] = torch.zeros(cfg.d_model, dtype=dtype, device=device)
    if cfg.d_mlp_shared is not None:
        p = f"layers.{layer}.mlp."
        ours.update(convert_gated_mlp(read, p + "shared_expert.", q + "shared_expert.", dtype, device))
        ours[q + "W_shared_gate"] = linear_to_ours(read(p + "shared_expert_gate.weight"))
    return ours


__all__ = [
    "MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "is_stacked",
    "load_hf_model",
]

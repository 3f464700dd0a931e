"""Small pieces every converter uses: activation names, prefixes, fresh tensors, fused q/k/v, linear weights."""

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

import einops
import torch
from torch import Tensor

from interp_transformer.core.strict import (
    DECODER_SHAPE_FIELDS,
    check_checkpoint,
    check_layer_count,
    require_config_fields,
    state_dict_shapes,
)
from interp_transformer.families.gpt2.hf import ACTIVATIONS as GPT2_ACTIVATIONS
from interp_transformer.parts.head_projection import placed_copy

# Hugging Face activation names -> ours (components.activations). gelu_pytorch_tanh is the formula of gelu_new.
HF_ACTIVATIONS = {**GPT2_ACTIVATIONS, "gelu_fast": "gelu_fast", "quick_gelu": "quick_gelu"}


def activation(hf_name, what: str, field: str) -> str:
    """Our activation for Hugging Face's ``hf_name`` (the config's ``field``); ``ValueError`` naming the field and the
    supported ones otherwise."""
    if hf_name not in HF_ACTIVATIONS:
        raise ValueError(
            f"{what} activation {hf_name!r} is not supported ({field}={hf_name!r}); supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[hf_name]


def read_model_type(hf_config, model_types: tuple[str, ...]) -> str:
    """The config's ``model_type``; ``ValueError`` naming the ones ``config_from_hf`` reads unless it is one."""
    model_type = hf_config.model_type
    if model_type not in model_types:
        raise ValueError(f"config_from_hf reads the model types {list(model_types)}, got {model_type!r}")
    return model_type


def refuse_features(model_type: str, problems: list[str]) -> None:
    """``ValueError`` listing every feature of the config not implemented here, when there is one."""
    if problems:
        raise ValueError(f"{model_type} config has features not implemented here: {'; '.join(problems)}")


def require_rms_decoder_fields(hf_config, model_type: str) -> None:
    """``ValueError`` naming the field unless the shape fields of a Llama-lineage decoder are positive ints and its
    ``rms_norm_eps`` a positive number."""
    require_config_fields(hf_config, model_type, positive_ints=DECODER_SHAPE_FIELDS, positive_floats=("rms_norm_eps",))


def rms_decoder_fields(hf_config, model_type: str) -> dict:
    """The config fields every RMSNorm decoder of the Llama lineage (Llama, the mixtures, OLMo, Phi-3, gpt-oss, Gemma)
    reads from its Hugging Face config alike: widths, counts, the norm's epsilon, tying, the init range and the name."""
    return dict(
        d_model=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers,
        n_heads=hf_config.num_attention_heads,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.max_position_embeddings,
        rms_norm_eps=float(hf_config.rms_norm_eps),
        tied_embeddings=bool(hf_config.tie_word_embeddings),
        init_range=float(hf_config.initializer_range),
        name=getattr(hf_config, "name_or_path", "") or model_type,
    )


def fresh(tensor: Tensor) -> Tensor:
    """A contiguous copy: our weights never alias the source's (weight processing edits them in place)."""
    return tensor.clone(memory_format=torch.contiguous_format)


class Layout(NamedTuple):
    """Where a checkpoint's names put the model: the prefixes a body's names may carry (removed in turn), the
    pattern of a layer's names (its index the group) and the config field that counts the layers."""

    prefixes: tuple[str, ...]
    layers: str
    layer_field: str


LLAMA_LAYOUT = Layout(("model.",), r"^layers\.(\d+)\.", "num_hidden_layers")
GPT2_LAYOUT = Layout(("transformer.",), r"^h\.(\d+)\.", "n_layer")


class CheckedCheckpoint:
    """A Hugging Face state dict whose names and shapes were checked: ``read(name)``, the name without its prefixes.

    On construction each name loses the ``layout``'s prefixes in turn (``LLAMA_LAYOUT``: ``model.`` of a
    ``*ForCausalLM`` body), an old name in ``aliases`` is read as its new one, then the layer count and every name
    and shape are compared with ``expected_shapes(names)`` (``CheckpointError`` listing every problem; names
    matching ``ignored`` skipped); ``lm_head.weight`` may be absent only when ``cfg.tied_embeddings``. No tensor is
    read before that.
    """

    def __init__(
        self,
        hf_state_dict: Mapping[str, Tensor],
        cfg,
        expected_shapes: Callable[[set], dict],
        *,
        layout: Layout = LLAMA_LAYOUT,
        ignored: re.Pattern | None = None,
        aliases: Mapping[str, str] | None = None,
    ):
        prefixes, layers, layer_field = layout

        def strip(name: str) -> str:
            for prefix in prefixes:
                name = name[len(prefix) :] if name.startswith(prefix) else name
            return name

        self.hf_state_dict = hf_state_dict
        self.names = {strip(name): name for name in hf_state_dict}
        shapes = {strip(name): shape for name, shape in state_dict_shapes(hf_state_dict).items()}
        for old, new in (aliases or {}).items():
            if old in self.names:
                self.names[new], shapes[new] = self.names.pop(old), shapes.pop(old)
        check_layer_count(shapes, layers, cfg.n_layers, f"{cfg.name} checkpoint", layer_field)
        optional = ["lm_head.weight"] if cfg.tied_embeddings else []
        check_checkpoint(
            shapes, expected_shapes(set(self.names)), what=f"{cfg.name} checkpoint", ignored=ignored, optional=optional
        )

    def __call__(self, name: str) -> Tensor:
        return self.hf_state_dict[self.names[name]]

    def __contains__(self, name: str) -> bool:
        return name in self.names


def convert_read_out(read: CheckedCheckpoint, W_E: Tensor, cfg) -> dict[str, Tensor]:
    """``W_U`` from ``lm_head.weight``, or (tied embeddings, no ``lm_head.weight``) the transposed token embedding;
    ``b_U = 0``."""
    lm_head = read("lm_head.weight") if "lm_head.weight" in read else W_E
    return {
        "unembed.W_U": linear_to_ours(lm_head),
        "unembed.b_U": torch.zeros(cfg.d_vocab, dtype=W_E.dtype, device=W_E.device),
    }


def convert_llama_layout(
    read: CheckedCheckpoint,
    cfg,
    convert_layer: Callable[[int, torch.dtype, torch.device], dict[str, Tensor]],
    final_norm: str = "ln_final.w",
) -> dict[str, Tensor]:
    """A checkpoint in Llama's layout under our names: ``embed_tokens`` as ``W_E``, each layer's
    ``convert_layer(layer, dtype, device)`` (the embedding's dtype and device), ``norm`` as ``final_norm``, then
    the read-out (``convert_read_out``)."""
    ours: dict[str, Tensor] = {"embed.W_E": fresh(read("embed_tokens.weight"))}
    dtype, device = ours["embed.W_E"].dtype, ours["embed.W_E"].device
    for layer in range(cfg.n_layers):
        ours.update(convert_layer(layer, dtype, device))
    ours[final_norm] = fresh(read("norm.weight"))
    ours.update(convert_read_out(read, ours["embed.W_E"], cfg))
    return ours


def llama_layout_shapes(cfg, layer_shapes: Callable[[str], dict[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """The checkpoint shapes of Llama's layout (``model.`` prefix removed): ``embed_tokens``, each layer's
    ``layer_shapes(prefix)`` (prefix ``layers.L.``), ``norm`` and ``lm_head``."""
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (cfg.d_vocab, cfg.d_model)}
    for layer in range(cfg.n_layers):
        shapes.update(layer_shapes(f"layers.{layer}."))
    shapes["norm.weight"] = (cfg.d_model,)
    shapes["lm_head.weight"] = (cfg.d_vocab, cfg.d_model)
    return shapes


def linear_to_ours(weight: Tensor) -> Tensor:
    """``nn.Linear``'s ``[d_out, d_in]`` weight as ours, ``[d_in, d_out]``."""
    return fresh(einops.rearrange(weight, "d_out d_in -> d_in d_out"))


def linear_shapes(name: str, d_out: int, d_in: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint shapes of an ``nn.Linear`` with a bias: ``name.weight`` ``[d_out, d_in]``, ``name.bias``
    ``[d_out]``."""
    return {name + ".weight": (d_out, d_in), name + ".bias": (d_out,)}


def layer_norm_shapes(name: str, d_model: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint shapes of an ``nn.LayerNorm``: ``name.weight`` and ``name.bias``, ``[d_model]``."""
    return {name + ".weight": (d_model,), name + ".bias": (d_model,)}


def mlp_shapes(hf_in: str, hf_out: str, d_model: int, d_mlp: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint shapes of an MLP of two ``nn.Linear`` with biases, ``hf_in`` and ``hf_out``."""
    return {**linear_shapes(hf_in, d_mlp, d_model), **linear_shapes(hf_out, d_model, d_mlp)}


def convert_layer_norm(read: Callable[[str], Tensor], hf_name: str, ours_name: str) -> dict[str, Tensor]:
    """An ``nn.LayerNorm``'s ``weight`` and ``bias`` as our ``w`` and ``b``."""
    return {ours_name + ".w": fresh(read(hf_name + ".weight")), ours_name + ".b": fresh(read(hf_name + ".bias"))}


def convert_mlp(read: Callable[[str], Tensor], hf_in: str, hf_out: str, prefix: str) -> dict[str, Tensor]:
    """An MLP of two ``nn.Linear`` with biases, ``hf_in`` and ``hf_out``, as ``W_in``, ``b_in``, ``W_out``,
    ``b_out``."""
    return {
        prefix + "W_in": linear_to_ours(read(hf_in + ".weight")),
        prefix + "b_in": fresh(read(hf_in + ".bias")),
        prefix + "W_out": linear_to_ours(read(hf_out + ".weight")),
        prefix + "b_out": fresh(read(hf_out + ".bias")),
    }


def heads_in(weight: Tensor, d_head: int) -> Tensor:
    """An ``nn.Linear`` weight ``[(head_index d_head), d_model]`` as ``W_Q``/``W_K``/``W_V`` ``[head_index, d_model,
    d_head]``."""
    return placed_copy(
        einops.rearrange(weight, "(head_index d_head) d_model -> head_index d_model d_head", d_head=d_head)
    )


def heads_out(weight: Tensor, d_head: int) -> Tensor:
    """An ``nn.Linear`` weight ``[d_model, (head_index d_head)]`` as ``W_O`` ``[head_index, d_head, d_model]``."""
    return fresh(einops.rearrange(weight, "d_model (head_index d_head) -> head_index d_head d_model", d_head=d_head))


def per_head_bias(bias: Tensor, d_head: int) -> Tensor:
    """``[(head_index d_head)]`` as ``[head_index, d_head]``."""
    return fresh(einops.rearrange(bias, "(head_index d_head) -> head_index d_head", d_head=d_head))


def split_fused_qkv(weight: Tensor, bias: Tensor, d_head: int, prefix: str) -> dict[str, Tensor]:
    """GPT-NeoX's and BLOOM's fused ``query_key_value``: per head, q, k and v side by side.

    Its ``nn.Linear`` weight is ``[(head_index qkv d_head), d_model]`` and its bias
    ``[(head_index qkv d_head)]``; returns ``prefix + W_Q`` ... ``prefix + b_V``.
    """
    W = einops.rearrange(
        weight, "(head_index qkv d_head) d_model -> qkv head_index d_model d_head", qkv=3, d_head=d_head
    )
    b = einops.rearrange(bias, "(head_index qkv d_head) -> qkv head_index d_head", qkv=3, d_head=d_head)
    out = {}
    for index, letter in enumerate("QKV"):
        out[prefix + f"W_{letter}"] = placed_copy(W[index])
        out[prefix + f"b_{letter}"] = fresh(b[index])
    return out


def fused_qkv_activation(which: int, d_head: int):
    """The ``which``-th of q, k, v (0, 1, 2) from a fused ``query_key_value`` output ``[batch, pos, (head_index qkv
    d_head)]``."""
    return lambda out: einops.rearrange(
        out, "batch pos (head_index qkv d_head) -> qkv batch pos head_index d_head", qkv=3, d_head=d_head
    )[which]


def hf_model_loader(class_name: str, **from_pretrained_kwargs):
    """``load_hf_model(directory, *, dtype)`` for a ``transformers`` class: the reference ``verify_pretrained`` compares
    with."""

    def load_hf_model(directory, *, dtype=torch.float32):
        import transformers

        model_class = getattr(transformers, class_name)
        return model_class.from_pretrained(str(directory), dtype=dtype, **from_pretrained_kwargs).eval()

    load_hf_model.__doc__ = (
        f"The Hugging Face reference model of a directory: ``transformers.{class_name}`` in eval mode."
    )
    return load_hf_model


__all__ = [
    "HF_ACTIVATIONS",
    "CheckedCheckpoint",
    "GPT2_LAYOUT",
    "LLAMA_LAYOUT",
    "Layout",
    "activation",
    "convert_layer_norm",
    "convert_llama_layout",
    "convert_mlp",
    "convert_read_out",
    "hf_model_loader",
    "fresh",
    "fused_qkv_activation",
    "heads_in",
    "heads_out",
    "layer_norm_shapes",
    "linear_shapes",
    "linear_to_ours",
    "llama_layout_shapes",
    "mlp_shapes",
    "per_head_bias",
    "read_model_type",
    "refuse_features",
    "require_rms_decoder_fields",
    "rms_decoder_fields",
    "split_fused_qkv",
]

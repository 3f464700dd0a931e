"""A family's GGUF entry: how one llama.cpp ``general.architecture`` maps onto ``transformers``.

llama.cpp's converter writes every family with one shared vocabulary of names
(``token_embd``, ``blk.{L}.attn_q``, ``ffn_gate``, ``output_norm`` ...) and metadata keys
(``{arch}.embedding_length``, ``{arch}.attention.head_count`` ...). A ``GGUFArchitecture`` says,
for one architecture, what its file changed and how to undo it; each family folder's ``gguf.py``
holds its entries (``ARCHITECTURES``, keyed by ``general.architecture``) and its ``register(...)`` line
hands them in, so ``loading.gguf`` reads the one table ``families.gguf_architectures()`` derives.

What a file does not say is what llama.cpp assumes for that family; each family's entry (and its
config class's defaults) says it.
"""

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# llama.cpp tensor names -> Hugging Face names shared by the Llama-like decoders.
GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
LLAMA_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
QK_NORM_TENSORS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one ``general.architecture`` maps onto ``transformers``."""

    config_class: str  # a transformers config class, e.g. "LlamaConfig"
    model_class: str  # the causal LM the state dict is for, e.g. "LlamaForCausalLM"
    permuted_qk: bool  # llama.cpp reorders attn_q / attn_k rows for its rotary layout
    # config field -> GGUF tensor-name suffix whose presence turns it on, e.g. attention_bias <- ".attn_q.bias"
    flags_from_tensors: tuple[tuple[str, str], ...] = ()
    block_tensors: Mapping[str, str] = field(default_factory=lambda: LLAMA_BLOCK_TENSORS)
    # llama.cpp stores Gemma's norm gains as 1 + w; Hugging Face's Gemma norms hold w (gain 1 + w)
    norm_offset: float = 0.0
    # its SentencePiece (tokenizer.ggml.model 'llama') vocabulary is ranked by file order, with no prefix space
    sentencepiece_by_file_order: bool = False
    # config fields beyond the shared ones, from (metadata, arch)
    extra_fields: Callable[[Mapping[str, Any], str], dict] | None = None
    # block tensors whose ``.weight`` is a Hugging Face parameter with no ``.weight`` of its own (stacked experts)
    bare_tensors: Mapping[str, str] = field(default_factory=dict)
    # Hugging Face parameter -> the block tensors stored in its place, in order, to be joined along its rows (dim -2)
    joined_tensors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # block tensors llama.cpp stores without Hugging Face's leading dimension of length 1
    squeezed_tensors: frozenset = frozenset()
    # metadata key read for ``intermediate_size`` when ``feed_forward_length`` is absent (all-expert files omit it)
    feed_forward_fallback: str | None = None
    # Hugging Face names of the tensors outside the blocks, and the prefix of block L's
    global_tensors: Mapping[str, str] = field(default_factory=lambda: GLOBAL_TENSORS)
    block_prefix: str = "model.layers"
    # block tensors whose weight llama.cpp stores transposed (GPT-2's Conv1D keeps [d_in, d_out])
    transposed_tensors: frozenset = frozenset()
    # the config's fields, from (metadata, arch), when they are not the Llama-like ones of ``hf_config_fields``
    config_fields: Callable[[Mapping[str, Any], str], dict] | None = None

    def hf_name(self, gguf_name: str) -> str | None:
        """The Hugging Face name of a llama.cpp tensor name, or ``None`` if it has none."""
        match = BLOCK_NAME.fullmatch(gguf_name)
        if match:
            layer, part, kind = match.groups()
            prefix = f"{self.block_prefix}.{layer}"
            if part in self.bare_tensors and kind == "weight":
                return f"{prefix}.{self.bare_tensors[part]}"
            return f"{prefix}.{self.block_tensors[part]}.{kind}" if part in self.block_tensors else None
        base, _, kind = gguf_name.rpartition(".")
        known = base in self.global_tensors and kind in ("weight", "bias")
        return f"{self.global_tensors[base]}.{kind}" if known else None

    def stored_offset(self, gguf_name: str) -> float:
        """What llama.cpp added to this tensor's values (Gemma's norm gains: 1), to be subtracted."""
        return self.norm_offset if gguf_name.endswith("norm.weight") else 0.0

    def join_order(self, gguf_name: str) -> int:
        """Where this tensor's rows go among those joined into one Hugging Face parameter (0 if it is not joined)."""
        match = BLOCK_NAME.fullmatch(gguf_name)
        part = match.group(2) if match else None
        return next((parts.index(part) for parts in self.joined_tensors.values() if part in parts), 0)

    def squeezed(self, gguf_name: str) -> bool:
        """Whether llama.cpp dropped this tensor's leading dimension of length 1."""
        match = BLOCK_NAME.fullmatch(gguf_name)
        return match is not None and match.group(2) in self.squeezed_tensors

    def transposed(self, gguf_name: str) -> bool:
        """Whether llama.cpp stored this weight as the transpose of Hugging Face's."""
        match = BLOCK_NAME.fullmatch(gguf_name)
        return match is not None and match.group(2) in self.transposed_tensors and match.group(3) == "weight"


def metadata_int(metadata: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """One positive integer (a per-layer list that is the same for every layer counts as one)."""
    value = metadata.get(key, default)
    if isinstance(value, list) and value and all(item == value[0] for item in value):
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        found = "absent" if key not in metadata else repr(value)
        raise ValueError(f"GGUF metadata {key!r} must be one positive integer, received {found}")
    return value


def metadata_float(metadata: Mapping[str, Any], key: str, default: float | None = None) -> float:
    """One positive finite number."""
    value = metadata.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        found = "absent" if key not in metadata else repr(value)
        raise ValueError(f"GGUF metadata {key!r} must be a positive finite number, received {found}")
    return float(value)


def rope_parameters(metadata: Mapping[str, Any], arch: str, head_dim: int) -> dict:
    """Hugging Face's ``rope_parameters`` from ``{arch}.rope.*`` (default, linear or YaRN scaling)."""
    rotary_dims = metadata.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary_dims != head_dim:
        raise ValueError(
            f"{arch}.rope.dimension_count={rotary_dims} rotates part of each head (d_head={head_dim}); not supported"
        )
    theta = metadata_float(metadata, f"{arch}.rope.freq_base", 10000.0)  # llama.cpp's default
    scaling = metadata.get(f"{arch}.rope.scaling.type", "linear" if f"{arch}.rope.scale_linear" in metadata else "none")
    factor = metadata_float(metadata, f"{arch}.rope.scaling.factor", metadata.get(f"{arch}.rope.scale_linear", 1.0))
    if scaling == "none" or (scaling == "linear" and factor == 1.0):
        return {"rope_type": "default", "rope_theta": theta}
    if scaling == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": factor}
    if scaling == "yarn":
        parameters = {"rope_type": "yarn", "rope_theta": theta, "factor": factor}
        optional = {
            "original_max_position_embeddings": "original_context_length",
            "beta_fast": "yarn_beta_fast",
            "beta_slow": "yarn_beta_slow",
            "attention_factor": "attn_factor",
        }
        for name, key in optional.items():
            if f"{arch}.rope.scaling.{key}" in metadata:
                parameters[name] = metadata[f"{arch}.rope.scaling.{key}"]
        return parameters
    raise ValueError(f"{arch}.rope.scaling.type={scaling!r} is not supported; supported: ['none', 'linear', 'yarn']")


def sliding_window(metadata: Mapping[str, Any], arch: str) -> dict:
    key = f"{arch}.attention.sliding_window"
    return {"sliding_window": metadata_int(metadata, key)} if key in metadata else {}


def soft_cap(metadata: Mapping[str, Any], arch: str, name: str) -> dict:
    key = f"{arch}.{name}"
    return {name: metadata_float(metadata, key)} if key in metadata else {}


__all__ = [
    "BLOCK_NAME",
    "GGUFArchitecture",
    "GLOBAL_TENSORS",
    "LLAMA_BLOCK_TENSORS",
    "QK_NORM_TENSORS",
    "metadata_float",
    "metadata_int",
    "rope_parameters",
    "sliding_window",
    "soft_cap",
]

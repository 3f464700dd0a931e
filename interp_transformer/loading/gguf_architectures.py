"""What each GGUF ``general.architecture`` means in Hugging Face terms: tensor names, stored values, config.

llama.cpp's converter writes every family with one shared vocabulary of names
(``token_embd``, ``blk.{L}.attn_q``, ``ffn_gate``, ``output_norm`` ...) and metadata keys
(``{arch}.embedding_length``, ``{arch}.attention.head_count`` ...). A row of
``GGUF_ARCHITECTURES`` says, for one architecture, what its file changed and how to undo it:

============  =======================  ==========================================================================
arch          config class             beyond the shared names
============  =======================  ==========================================================================
``llama``     ``LlamaConfig``          q/k rows reordered for llama.cpp's rotary layout (``permuted_qk``);
                                       attention / MLP biases when their tensors are present
``qwen2``     ``Qwen2Config``          q/k/v biases (always), no reordering
``qwen3``     ``Qwen3Config``          per-head q/k norms (``attn_q_norm``), ``attention_bias`` from its tensors
``gemma``     ``GemmaConfig``          norms stored as ``1 + w`` (``norm_offset``)
``gemma2``    ``Gemma2Config``         as ``gemma``, with norms after each sublayer (``post_attention_norm`` is
                                       Hugging Face's ``post_attention_layernorm``, ``ffn_norm`` its
                                       ``pre_feedforward_layernorm``), soft-caps and the sliding window from
                                       the metadata
``gemma3``    ``Gemma3TextConfig``     as ``gemma2`` with q/k norms and no attention soft-cap; the sliding
                                       layers' rotary base ``rope.freq_base_swa`` (10,000 where absent)
``qwen2moe``  ``Qwen2MoeConfig``       experts stacked (``ffn_gate_exps`` / ``ffn_up_exps`` joined into Hugging
                                       Face's ``experts.gate_up_proj``, ``ffn_down_exps``), the router
                                       ``ffn_gate_inp``, a shared expert (``ffn_*_shexp``) whose gate
                                       ``ffn_gate_inp_shexp`` lost its leading dimension; ``expert_*`` metadata
``qwen3moe``  ``Qwen3MoeConfig``       as ``qwen2moe`` without the shared expert, with q/k norms
``phi3``      ``Phi3Config``           fused ``attn_qkv`` (Hugging Face's ``qkv_proj``) and ``ffn_up`` (gate rows
                                       then up rows: ``gate_up_proj``); the sliding window (0: none)
``gpt2``      ``GPT2Config``           ``transformer.*`` names, ``position_embd``, fused ``attn_qkv``, LayerNorm and
                                       linear biases; ``attn_qkv`` / ``attn_output`` / ``ffn_up`` / ``ffn_down``
                                       stored transposed (Hugging Face's ``Conv1D`` keeps ``[d_in, d_out]``)
============  =======================  ==========================================================================

What a file does not say is what llama.cpp assumes for that family: Gemma 2/3 scale
queries by ``d_head^-1/2`` (``query_pre_attn_scalar = d_head``; ``d_model / n_heads`` for
the 27B sizes, told apart by their layer count), Gemma 3 has five sliding layers to one
global, the activation is GELU (tanh); the config class's defaults say the same. Its
MoE files make every layer sparse and renormalise the chosen routing weights of Qwen3-MoE
(``norm_topk_prob``), not of Qwen2-MoE.
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
# Gemma 2/3: a norm after each sublayer; the one llama.cpp calls ffn_norm is the norm *before* the MLP
SANDWICH_BLOCK_TENSORS = {
    **LLAMA_BLOCK_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# config field -> tokenizer.ggml key of the special token ids a config carries
SPECIAL_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "padding_token_id"}
GEMMA_LOCAL_ROPE_BASE = 10000.0  # Gemma 3's sliding layers, which llama.cpp's converter does not write down


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


def _sliding_window(metadata: Mapping[str, Any], arch: str) -> dict:
    key = f"{arch}.attention.sliding_window"
    return {"sliding_window": metadata_int(metadata, key)} if key in metadata else {}


def _soft_cap(metadata: Mapping[str, Any], arch: str, name: str) -> dict:
    key = f"{arch}.{name}"
    return {name: metadata_float(metadata, key)} if key in metadata else {}


# llama.cpp's 27B Gemmas (by layer count) scale queries by (d_model / n_heads)^-1/2, the others by d_head^-1/2
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _query_scale(metadata: Mapping[str, Any], arch: str) -> dict:
    """``query_pre_attn_scalar`` as llama.cpp computes it, which the file does not store."""
    if metadata_int(metadata, f"{arch}.block_count") == GEMMA_27B_LAYERS[arch]:
        hidden = metadata_int(metadata, f"{arch}.embedding_length")
        return {"query_pre_attn_scalar": hidden // metadata_int(metadata, f"{arch}.attention.head_count")}
    return {"query_pre_attn_scalar": metadata_int(metadata, f"{arch}.attention.key_length")}


def _gemma2_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    return {
        **_query_scale(metadata, arch),
        **_sliding_window(metadata, arch),
        **_soft_cap(metadata, arch, "attn_logit_softcapping"),
        **_soft_cap(metadata, arch, "final_logit_softcapping"),
    }


def _gemma3_layer_types(metadata: Mapping[str, Any], arch: str, layers: int) -> dict:
    """``layer_types`` from ``{arch}.attention.sliding_window_pattern`` where the file has it (a period, or one bool
    per layer: True = sliding); the config class's default pattern otherwise."""
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = metadata.get(key)
    if pattern is None:
        return {}
    if isinstance(pattern, list) and len(pattern) == layers and all(isinstance(item, bool) for item in pattern):
        return {"layer_types": ["sliding_attention" if sliding else "full_attention" for sliding in pattern]}
    period = metadata_int(metadata, key)
    return {"layer_types": ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)]}


def _gemma3_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    head_dim = metadata_int(metadata, f"{arch}.attention.key_length")
    local_base = metadata_float(metadata, f"{arch}.rope.freq_base_swa", GEMMA_LOCAL_ROPE_BASE)
    return {
        **_query_scale(metadata, arch),
        **_sliding_window(metadata, arch),
        **_soft_cap(metadata, arch, "final_logit_softcapping"),
        **_gemma3_layer_types(metadata, arch, metadata_int(metadata, f"{arch}.block_count")),
        "rope_parameters": {
            "full_attention": rope_parameters(metadata, arch, head_dim),
            "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
        },
    }


def _moe_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    """Experts from ``{arch}.expert_*``; llama.cpp makes every layer sparse and renormalises Qwen3-MoE's top-k
    routing weights (not Qwen2-MoE's), which its files do not say."""
    fields: dict[str, Any] = dict(
        num_experts=metadata_int(metadata, f"{arch}.expert_count"),
        num_experts_per_tok=metadata_int(metadata, f"{arch}.expert_used_count"),
        moe_intermediate_size=metadata_int(metadata, f"{arch}.expert_feed_forward_length"),
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=arch == "qwen3moe",
    )
    if fields["num_experts_per_tok"] > fields["num_experts"]:
        raise ValueError(
            f"{arch}.expert_used_count={fields['num_experts_per_tok']} exceeds {arch}.expert_count="
            f"{fields['num_experts']}"
        )
    if arch == "qwen2moe":
        key = f"{arch}.expert_shared_feed_forward_length"
        fields["shared_expert_intermediate_size"] = metadata_int(metadata, key)
    return fields


# llama.cpp's stacked experts: [expert, rows, columns], as Hugging Face's model holds them in memory
MOE_BLOCK_TENSORS = {
    **{part: name for part, name in LLAMA_BLOCK_TENSORS.items() if not part.startswith("ffn_") or part == "ffn_norm"},
    "ffn_gate_inp": "mlp.gate",
}
MOE_BARE_TENSORS = {
    "ffn_gate_exps": "mlp.experts.gate_up_proj",
    "ffn_up_exps": "mlp.experts.gate_up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
MOE_JOINED_TENSORS = {"mlp.experts.gate_up_proj": ("ffn_gate_exps", "ffn_up_exps")}  # gate rows first
SHARED_EXPERT_TENSORS = {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_MOE: dict[str, Any] = dict(
    permuted_qk=False,
    extra_fields=_moe_fields,
    bare_tensors=MOE_BARE_TENSORS,
    joined_tensors=MOE_JOINED_TENSORS,
    feed_forward_fallback="expert_feed_forward_length",
)


def _phi3_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    """Phi-3's sliding window (0: none), and the context length its rotary base was trained for."""
    key = f"{arch}.attention.sliding_window"
    window = None if metadata.get(key, 0) == 0 else metadata_int(metadata, key)
    context = metadata_int(metadata, f"{arch}.context_length")
    original = metadata_int(metadata, f"{arch}.rope.scaling.original_context_length", context)
    return {"sliding_window": window, "original_max_position_embeddings": original}


# Phi-3 keeps Hugging Face's fused projections: q/k/v rows in one tensor, gate rows then up rows in another
PHI3_BLOCK_TENSORS = {part: LLAMA_BLOCK_TENSORS[part] for part in ("attn_norm", "attn_output", "ffn_norm", "ffn_down")}
PHI3_BLOCK_TENSORS.update(attn_qkv="self_attn.qkv_proj", ffn_up="mlp.gate_up_proj")


def _gpt2_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    """``GPT2Config``'s fields; llama.cpp's GELU is the tanh approximation (``gelu_new``)."""
    heads = metadata_int(metadata, f"{arch}.attention.head_count")
    kv_heads = metadata_int(metadata, f"{arch}.attention.head_count_kv", heads)
    if kv_heads != heads:
        raise ValueError(f"GPT-2 has one key/value head per query head: head_count_kv={kv_heads}, head_count={heads}")
    return dict(
        n_embd=metadata_int(metadata, f"{arch}.embedding_length"),
        n_layer=metadata_int(metadata, f"{arch}.block_count"),
        n_head=heads,
        n_positions=metadata_int(metadata, f"{arch}.context_length"),
        n_inner=metadata_int(metadata, f"{arch}.feed_forward_length"),
        layer_norm_epsilon=metadata_float(metadata, f"{arch}.attention.layer_norm_epsilon"),
        activation_function="gelu_new",
    )


GPT2_GLOBAL_TENSORS = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe", "output": "lm_head"}
GPT2_GLOBAL_TENSORS["output_norm"] = "transformer.ln_f"
GPT2_BLOCK_TENSORS = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2"}
GPT2_BLOCK_TENSORS.update(ffn_up="mlp.c_fc", ffn_down="mlp.c_proj")
_GEMMA: dict[str, Any] = dict(permuted_qk=False, norm_offset=1.0)
GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture(
        "LlamaConfig",
        "LlamaForCausalLM",
        permuted_qk=True,
        flags_from_tensors=(("attention_bias", ".attn_q.bias"), ("mlp_bias", ".ffn_up.bias")),
    ),
    "qwen2": GGUFArchitecture("Qwen2Config", "Qwen2ForCausalLM", permuted_qk=False),
    "qwen3": GGUFArchitecture(
        "Qwen3Config",
        "Qwen3ForCausalLM",
        permuted_qk=False,
        flags_from_tensors=(("attention_bias", ".attn_q.bias"),),
        block_tensors={**LLAMA_BLOCK_TENSORS, **QK_NORM_TENSORS},
    ),
    "gemma": GGUFArchitecture("GemmaConfig", "GemmaForCausalLM", **_GEMMA),
    "gemma2": GGUFArchitecture(
        "Gemma2Config", "Gemma2ForCausalLM", block_tensors=SANDWICH_BLOCK_TENSORS, extra_fields=_gemma2_fields, **_GEMMA
    ),
    "gemma3": GGUFArchitecture(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        block_tensors={**SANDWICH_BLOCK_TENSORS, **QK_NORM_TENSORS},
        extra_fields=_gemma3_fields,
        **_GEMMA,
    ),
    "qwen2moe": GGUFArchitecture(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        block_tensors={**MOE_BLOCK_TENSORS, **SHARED_EXPERT_TENSORS},
        squeezed_tensors=frozenset({"ffn_gate_inp_shexp"}),
        **_MOE,
    ),
    "qwen3moe": GGUFArchitecture(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        flags_from_tensors=(("attention_bias", ".attn_q.bias"),),
        block_tensors={**MOE_BLOCK_TENSORS, **QK_NORM_TENSORS},
        **_MOE,
    ),
    "phi3": GGUFArchitecture(
        "Phi3Config", "Phi3ForCausalLM", permuted_qk=False, block_tensors=PHI3_BLOCK_TENSORS, extra_fields=_phi3_fields
    ),
    "gpt2": GGUFArchitecture(
        "GPT2Config",
        "GPT2LMHeadModel",
        permuted_qk=False,
        block_tensors=GPT2_BLOCK_TENSORS,
        global_tensors=GPT2_GLOBAL_TENSORS,
        block_prefix="transformer.h",
        transposed_tensors=frozenset({"attn_qkv", "attn_output", "ffn_up", "ffn_down"}),
        config_fields=_gpt2_fields,
    ),
}


def hf_config_fields(metadata: Mapping[str, Any], tensors: Mapping[str, Any], arch: str, path) -> dict:
    """The keyword arguments of ``arch``'s config class, from the file's metadata and tensor shapes."""
    spec = GGUF_ARCHITECTURES[arch]
    names = set(tensors)
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    hidden = metadata_int(metadata, key("embedding_length"))
    heads = metadata_int(metadata, key("attention.head_count"))
    head_dim = metadata_int(metadata, key("attention.key_length"), hidden // heads)
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path} has no token_embd.weight, so the vocabulary size is unknown")
    vocab = tensors["token_embd.weight"].shape[0]  # vocab_size, where the file has it, agrees (gguf_consistency)
    token_ids = {name: metadata.get(f"tokenizer.ggml.{gguf}") for name, gguf in SPECIAL_TOKEN_IDS.items()}
    for name, token_id in token_ids.items():
        if token_id is not None and (not isinstance(token_id, int) or not 0 <= token_id < vocab):
            raise ValueError(
                f"GGUF metadata tokenizer.ggml.{SPECIAL_TOKEN_IDS[name]}={token_id!r} must be a token id "
                f"in [0, {vocab})"
            )
    common = dict(
        name_or_path=path.stem,
        vocab_size=vocab,
        # llama.cpp writes output.weight only when the unembedding is not the embedding matrix
        tie_word_embeddings="output.weight" not in names,
        **token_ids,
    )
    if spec.config_fields is not None:
        return {**common, **spec.config_fields(metadata, arch)}
    feed_forward = None  # an all-expert file may leave out the width of a dense MLP it does not have
    if spec.feed_forward_fallback is not None and key("feed_forward_length") not in metadata:
        feed_forward = metadata_int(metadata, key(spec.feed_forward_fallback))
    fields = dict(
        **common,
        hidden_size=hidden,
        intermediate_size=metadata_int(metadata, key("feed_forward_length"), feed_forward),
        num_hidden_layers=metadata_int(metadata, key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=metadata_int(metadata, key("attention.head_count_kv"), heads),
        head_dim=head_dim,
        rms_norm_eps=metadata_float(metadata, key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=metadata_int(metadata, key("context_length")),
        rope_parameters=rope_parameters(metadata, arch, head_dim),
        **{name: any(tensor.endswith(suffix) for tensor in names) for name, suffix in spec.flags_from_tensors},
    )
    if spec.extra_fields is not None:
        fields.update(spec.extra_fields(metadata, arch))
    return fields


__all__ = ["GGUFArchitecture", "GGUF_ARCHITECTURES", "hf_config_fields", "rope_parameters"]

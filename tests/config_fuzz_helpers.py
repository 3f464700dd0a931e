"""Random small configs of every decoder family, their Hugging Face models, and a comparison of logits.

``draw(family, seed)`` gives the fields of one config: each field of ``FAMILIES[family]`` takes
one of its choices (``OMIT`` leaves it out; a function of ``d_head`` and the layer count gives
``rope_parameters`` and ``layer_types`` of the right size), over one of ``SHAPES`` (grouped
key/value heads, ``head_dim`` beside ``hidden_size / heads``). The choices include fields the
family's Hugging Face model reads and, now and then, fields it does not read (a window or
layer types for Llama, Gemma 1 and OLMo 2, ``hidden_act`` for gpt-oss, ``attention_bias`` for
Phi-3, ...), which must change nothing.
"""

import random

import torch
import transformers

from interp_transformer.families.reference import positions_from_mask

from .llama_helpers import left_padded, perturb_

VOCAB = 29
TOKENS = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
PADDED, MASK = left_padded(TOKENS, (2, 0))  # rows of 8 and 10 real tokens
OMIT = object()  # a choice that leaves the field out of the config
# hidden_size, num_attention_heads, num_key_value_heads, head_dim (None: hidden_size / num_attention_heads)
SHAPES = [(16, 2, 2, None), (24, 3, 1, None), (16, 4, 2, 8), (24, 2, 1, 12), (32, 4, 4, None), (12, 2, 1, 10)]
SEEDS = range(5)


def _longrope(d_head: int, partial: float = 1.0, original: int = 4) -> dict:
    # original context 4 or 16: the padded batch's rows (8 and 10 tokens) lie on one side of it
    pairs = int(d_head * partial) // 2
    return dict(
        rope_type="longrope",
        rope_theta=1000.0,
        partial_rotary_factor=partial,
        original_max_position_embeddings=original,
        short_factor=[1.0 + 0.25 * i for i in range(pairs)],
        long_factor=[2.0 + 0.5 * i for i in range(pairs)],
    )


# rope_parameters, each a function of d_head
ROPES = [
    OMIT,
    lambda d: {"rope_type": "default", "rope_theta": 100.0},
    lambda d: {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
    lambda d: {
        "rope_type": "llama3",
        "rope_theta": 500.0,
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
    lambda d: {
        "rope_type": "yarn",
        "rope_theta": 1000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 8,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "truncate": False,
    },
    lambda d: _longrope(d, original=16),
    lambda d: {"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 2.0},
    lambda d: {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
]
ACTIVATIONS = ["silu", "silu", "gelu", "gelu_pytorch_tanh", "relu", "quick_gelu", "relu2"]


def _layer_types(kinds):
    return lambda d, n: [kinds[layer % len(kinds)] for layer in range(n)]


LAYER_TYPES = [
    OMIT,
    _layer_types(["sliding_attention"]),
    _layer_types(["full_attention"]),
    _layer_types(["sliding_attention", "full_attention"]),
]
IDS = dict(pad_token_id=[None, 0], bos_token_id=[None, 1], eos_token_id=[None, VOCAB - 1])
DECODER = dict(
    IDS,
    num_hidden_layers=[1, 2],
    intermediate_size=[16, 24],
    vocab_size=[VOCAB],
    max_position_embeddings=[32],
    rms_norm_eps=[1e-6, 0.1],
    tie_word_embeddings=[False, True],
    hidden_act=ACTIVATIONS,
    rope_parameters=ROPES,
    attention_dropout=[0.0, 0.1],  # training only
)
QWEN_WINDOWS = dict(use_sliding_window=[False, True], sliding_window=[None, 3], max_window_layers=[0, 1, 28])
MOE = dict(num_experts_per_tok=[1, 2], output_router_logits=[False, True])
GEMMA = dict({**DECODER, "hidden_act": [OMIT]}, hidden_activation=ACTIVATIONS[:5], attention_bias=[False, True])
LATER_GEMMA = dict(
    GEMMA,
    query_pre_attn_scalar=[8, 20],
    final_logit_softcapping=[None, 3.0],
    sliding_window=[3, 100],
    layer_types=LAYER_TYPES,
)
T = transformers
# family -> (model class, config class, field -> choices); a choice may be OMIT or a function of (d_head, n_layers)
FAMILIES = {
    "llama": (
        T.LlamaForCausalLM,
        T.LlamaConfig,
        dict(
            DECODER,
            attention_bias=[False, True],
            mlp_bias=[False] * 3 + [True],
            sliding_window=[OMIT, 3],
            layer_types=[OMIT, LAYER_TYPES[1]],
        ),
    ),
    "mistral": (
        T.MistralForCausalLM,
        T.MistralConfig,
        dict(DECODER, sliding_window=[None, 3, 100], layer_types=[OMIT, LAYER_TYPES[2]]),
    ),
    "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config, dict(DECODER, **QWEN_WINDOWS)),
    "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config, dict(DECODER, **QWEN_WINDOWS, attention_bias=[False, True])),
    "gemma": (
        T.GemmaForCausalLM,
        T.GemmaConfig,
        dict(GEMMA, sliding_window=[OMIT, 3], layer_types=[OMIT, LAYER_TYPES[1]]),
    ),
    "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config, dict(LATER_GEMMA, attn_logit_softcapping=[None, 5.0])),
    "gemma3_text": (
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig,
        dict(
            LATER_GEMMA,
            rope_parameters=[
                OMIT,
                ROPES[2],
                lambda d: {"full_attention": ROPES[3](d), "sliding_attention": ROPES[1](d)},
            ],
        ),
    ),
    "mixtral": (
        T.MixtralForCausalLM,
        T.MixtralConfig,
        dict(DECODER, **MOE, num_local_experts=[3, 4], sliding_window=[None, 3], layer_types=[OMIT, LAYER_TYPES[2]]),
    ),
    "qwen2_moe": (
        T.Qwen2MoeForCausalLM,
        T.Qwen2MoeConfig,
        dict(
            DECODER,
            **MOE,
            **QWEN_WINDOWS,
            num_experts=[3, 4],
            moe_intermediate_size=[8, 12],
            shared_expert_intermediate_size=[8, 20],
            norm_topk_prob=[False, True],
            decoder_sparse_step=[1, 2],
            mlp_only_layers=[[], [0]],
            qkv_bias=[False, True],
        ),
    ),
    "qwen3_moe": (
        T.Qwen3MoeForCausalLM,
        T.Qwen3MoeConfig,
        dict(
            DECODER,
            **MOE,
            **QWEN_WINDOWS,
            num_experts=[3, 4],
            moe_intermediate_size=[8, 12],
            norm_topk_prob=[False, True],
            decoder_sparse_step=[1, 2],
            mlp_only_layers=[[], [0]],
            attention_bias=[False, True],
            layer_types=[OMIT, LAYER_TYPES[2]],
        ),
    ),
    "olmo2": (
        T.Olmo2ForCausalLM,
        T.Olmo2Config,
        dict(DECODER, attention_bias=[False, True], sliding_window=[OMIT, 3], layer_types=[OMIT, LAYER_TYPES[1]]),
    ),
    "olmo3": (
        T.Olmo3ForCausalLM,
        T.Olmo3Config,
        dict(
            DECODER,
            attention_bias=[False, True],
            sliding_window=[3, 100],
            layer_types=LAYER_TYPES,
            rope_parameters=ROPES[:4] + [lambda d: {"full_attention": ROPES[3](d), "sliding_attention": ROPES[2](d)}],
        ),
    ),
    "phi3": (
        T.Phi3ForCausalLM,
        T.Phi3Config,
        dict(
            DECODER,
            sliding_window=[None, 3],
            resid_pdrop=[0.0, 0.1],
            original_max_position_embeddings=[4, 16],
            rope_parameters=[OMIT, ROPES[1], ROPES[7], _longrope, lambda d: _longrope(d, 0.5, 16), ROPES[2]],
            attention_bias=[OMIT, True],
        ),
    ),
    "smollm3": (
        T.SmolLM3ForCausalLM,
        T.SmolLM3Config,
        dict(
            DECODER,
            attention_bias=[False, True],
            mlp_bias=[False] * 3 + [True],
            use_sliding_window=[False, True],
            sliding_window=[None, 3],
            no_rope_layer_interval=[1, 2, 4],
            layer_types=LAYER_TYPES,
        ),
    ),
    "gpt_oss": (
        T.GptOssForCausalLM,
        T.GptOssConfig,
        dict(
            {**DECODER, "hidden_act": [OMIT, "relu2"]},
            **MOE,
            num_local_experts=[3, 4],
            attention_bias=[False, True],
            sliding_window=[3, 100],
            layer_types=LAYER_TYPES,
            swiglu_alpha=[1.702, 0.5],
            swiglu_limit=[7.0, 0.5],
            rope_parameters=ROPES[:5],
        ),
    ),
    "gpt_neox": (
        T.GPTNeoXForCausalLM,
        T.GPTNeoXConfig,
        dict(
            IDS,
            num_hidden_layers=[1, 2],
            intermediate_size=[16, 24],
            vocab_size=[VOCAB],
            max_position_embeddings=[32],
            layer_norm_eps=[1e-5, 0.1],
            tie_word_embeddings=[False, True],
            hidden_act=ACTIVATIONS,
            use_parallel_residual=[False, True],
            attention_bias=[False, True],
            rope_parameters=[OMIT, ROPES[2], ROPES[3], lambda d: dict(ROPES[1](d), partial_rotary_factor=0.5)],
        ),
    ),
    "gptj": (
        T.GPTJForCausalLM,
        T.GPTJConfig,
        dict(
            IDS,
            n_layer=[1, 2],
            n_inner=[None, 24],
            vocab_size=[VOCAB],
            n_positions=[32],
            layer_norm_epsilon=[1e-5, 0.1],
            tie_word_embeddings=[False, True],
            activation_function=ACTIVATIONS,
            rotary_dim=[None, lambda d, n: d // 2 // 2 * 2, 4],
        ),
    ),
    "opt": (
        T.OPTForCausalLM,
        T.OPTConfig,
        dict(
            IDS,
            num_hidden_layers=[1, 2],
            ffn_dim=[16, 24],
            vocab_size=[VOCAB],
            max_position_embeddings=[32],
            do_layer_norm_before=[True, True, False],
            word_embed_proj_dim=[None, 8],
            activation_function=ACTIVATIONS,
            enable_bias=[False, True],
            layer_norm_elementwise_affine=[False, True],
            tie_word_embeddings=[False, True],
        ),
    ),
    "bloom": (
        T.BloomForCausalLM,
        T.BloomConfig,
        dict(
            IDS,
            n_layer=[1, 2],
            vocab_size=[VOCAB],
            layer_norm_epsilon=[1e-5, 0.1],
            tie_word_embeddings=[True, False],
            apply_residual_connection_post_layernorm=[False] * 3 + [True],
            pretraining_tp=[1, 2],
            slow_but_exact=[False, True],
        ),
    ),
    "gpt2": (
        T.GPT2LMHeadModel,
        T.GPT2Config,
        dict(
            IDS,
            n_layer=[1, 2],
            n_inner=[None, 24],
            vocab_size=[VOCAB],
            n_positions=[32],
            layer_norm_epsilon=[1e-5, 0.1],
            activation_function=ACTIVATIONS,
            scale_attn_weights=[True] * 3 + [False],
            reorder_and_upcast_attn=[False, True],
            tie_word_embeddings=[True, False],
        ),
    ),
}
# families whose size fields carry GPT-2's names; those without head_dim (their attention computes hidden / heads)
SIZE_NAMES = {"gptj": ("n_embd", "n_head"), "gpt2": ("n_embd", "n_head"), "bloom": ("hidden_size", "n_head")}
NO_HEAD_DIM = ("qwen2", "qwen2_moe", "gpt_neox", "gptj", "opt", "bloom", "gpt2")
NO_KV_HEADS = ("gpt_neox", "gptj", "opt", "bloom", "gpt2")


def draw(family: str, seed: int) -> dict:
    """The config fields of one random config of ``family``."""
    rng = random.Random(f"{family}-{seed}")
    hidden, heads, kv_heads, head_dim = rng.choice(SHAPES)
    if family in NO_HEAD_DIM:
        head_dim = None
    hidden_name, heads_name = SIZE_NAMES.get(family, ("hidden_size", "num_attention_heads"))
    fields = {hidden_name: hidden, heads_name: heads}
    if family not in NO_KV_HEADS:
        fields["num_key_value_heads"] = kv_heads
    if head_dim is not None or family.startswith("gemma"):
        fields["head_dim"] = head_dim or hidden // heads
    d_head = fields.get("head_dim") or hidden // heads
    for name, choices in FAMILIES[family][2].items():
        value = rng.choice(choices)
        if callable(value):
            n_layers = fields.get("num_hidden_layers", fields.get("n_layer", 1))
            value = value(d_head) if name == "rope_parameters" else value(d_head, n_layers)
        if value is not OMIT:
            fields[name] = value
    return fields


def field_names(hf_config, fields: dict) -> set[str]:
    """The fields set, those of the family's config class (defaults included, fields every config has left
    out), and the keys of the dicts among them (``rope_parameters``' own fields)."""
    generic = set(transformers.PreTrainedConfig().to_dict())
    return _names(fields) | (_names(hf_config.to_dict()) - generic)


def _names(fields: dict) -> set[str]:
    names = {name for name in fields if isinstance(name, str)}
    for value in fields.values():
        if isinstance(value, dict):
            names |= _names(value)
    return names


def hf_logits(hf_model, tokens, mask=None):
    """Hugging Face's logits; with a mask, positions counted from each row's first real token, as ours are."""
    kwargs = {} if mask is None else dict(attention_mask=mask, position_ids=positions_from_mask(mask))
    with torch.no_grad():
        return hf_model(input_ids=tokens, use_cache=False, **kwargs).logits


def assert_same_logits(model, hf_model, what: str) -> None:
    """Our logits are Hugging Face's within 1e-4 (float32) at every real position, on ``TOKENS`` and on ``PADDED``."""
    for tokens, mask in ((TOKENS, None), (PADDED, MASK)):
        theirs = hf_logits(hf_model, tokens, mask)
        with torch.no_grad():
            ours = model(tokens) if mask is None else model(tokens, attention_mask=mask)
        real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()
        torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-5, msg=lambda m: f"{what}: {m}")


def hf_model_of(family: str, fields: dict, seed: int = 0):
    """The random Hugging Face model of ``fields`` (every parameter perturbed), or None where transformers refuses
    to build or run it."""
    model_class, config_class, _ = FAMILIES[family]
    torch.manual_seed(seed)
    try:
        hf_model = perturb_(model_class(config_class(**fields, attn_implementation="eager")), seed).eval()
        if hf_model.config.tie_word_embeddings:
            hf_model.tie_weights()
        hf_logits(hf_model, TOKENS)
    except Exception:  # a config transformers itself refuses (at build or forward) says nothing about ours
        return None
    return hf_model

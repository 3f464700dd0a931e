"""GPT-NeoX and Pythia from Hugging Face: config, pure converter, strict build, reference activations.

Hugging Face's ``GPTNeoXForCausalLM`` fuses q, k and v into one ``query_key_value`` whose
output holds, for each head in turn, its q, k and v side by side (``[(head_index qkv
d_head), d_model]``, unlike GPT-2's ``(qkv head_index d_head)``); ``dense`` becomes ``W_O``,
``dense_h_to_4h``/``dense_4h_to_h`` become ``W_in``/``W_out`` (transposed), the norms'
``weight``/``bias`` our ``w``/``b``, and the read-out ``lm_head`` (``embed_out`` in checkpoints
written before transformers 5) ``W_U``; there is no read-out bias, so ``b_U = 0``. Without
``attention_bias`` the attention biases are ours at zero. Old checkpoints' causal-mask and
rotary buffers (``attention.bias``, ``attention.masked_bias``, ``attention.rotary_emb.inv_freq``)
are skipped.

The rotation is Hugging Face's: half-split pairs on the first ``int(d_head *
partial_rotary_factor)`` dimensions of each head, theta ``rope_theta``. ``config_from_hf``
refuses by name what is not computed here: rope types other than default and linear, an
odd number of rotated dimensions, an activation we do not have.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.core.strict import (
    DECODER_SHAPE_FIELDS,
    require_config_fields,
)
from interp_transformer.families.conversion import (
    LLAMA_LAYOUT,
    CheckedCheckpoint,
    activation,
    convert_layer_norm,
    convert_mlp,
    convert_read_out,
    fresh,
    fused_qkv_activation,
    heads_out,
    hf_model_loader,
    layer_norm_shapes,
    mlp_shapes,
    split_fused_qkv,
)
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.reference import Recorder, rotate_like_hf, run_reference, split_heads, with_positions
from interp_transformer.parts.rotary import RopeScaling

IGNORED_KEYS = re.compile(r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)")
SUPPORTED_ROPE_TYPES = ("default", "linear")


def _rotary(hf_config, d_head: int) -> tuple[int, float, RopeScaling | None]:
    """``(rotary_dim, rotary_base, scaling)`` from ``rope_parameters``; ``ValueError`` for what we do not compute."""
    parameters = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"gpt_neox config has rope_type={rope_type!r}; supported: {list(SUPPORTED_ROPE_TYPES)}")
    factor = float(parameters.get("partial_rotary_factor", getattr(hf_config, "rotary_pct", 1.0)))
    rotary_dim = int(d_head * factor)  # Hugging Face's rounding
    if not 0 < rotary_dim <= d_head or rotary_dim % 2:
        raise ValueError(
            f"gpt_neox config rotates {rotary_dim} of d_head={d_head} dimensions "
            f"(partial_rotary_factor={factor}): "
            "rotary positions rotate pairs, so an even number in [2, d_head] is supported"
        )
    base = float(parameters.get("rope_theta", getattr(hf_config, "rotary_emb_base", 10000.0)))
    scaling = RopeScaling("linear", float(parameters["factor"])) if rope_type == "linear" else None
    return rotary_dim, base, scaling


def config_from_hf(hf_config) -> GPTNeoXConfig:
    """Our config from a ``transformers.GPTNeoXConfig``; ``ValueError`` naming what is not computed here."""
    require_config_fields(
        hf_config,
        "gpt_neox",
        positive_ints=DECODER_SHAPE_FIELDS,
        positive_floats=("layer_norm_eps",),
    )
    d_model, n_heads = hf_config.hidden_size, hf_config.num_attention_heads
    if d_model % n_heads:
        raise ValueError(f"gpt_neox hidden_size={d_model} must be divisible by num_attention_heads={n_heads}")
    d_head = d_model // n_heads
    rotary_dim, base, scaling = _rotary(hf_config, d_head)
    return GPTNeoXConfig(
        d_model=d_model,
        n_layers=hf_config.num_hidden_layers,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=hf_config.intermediate_size,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.max_position_embeddings,
        rotary_dim=rotary_dim,
        rotary_base=base,
        rope_scaling=scaling,
        parallel_residual=bool(hf_config.use_parallel_residual),
        attn_bias=bool(getattr(hf_config, "attention_bias", True)),
        tied_embeddings=bool(hf_config.tie_word_embeddings),
        act_fn=activation(hf_config.hidden_act, "gpt_neox", "hidden_act"),
        layer_norm_eps=float(hf_config.layer_norm_eps),
        init_range=float(hf_config.initializer_range),
        name=getattr(hf_config, "name_or_path", "") or "gpt_neox",
    )


def expected_hf_shapes(cfg: GPTNeoXConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face checkpoint of ``cfg`` (``gpt_neox.`` prefix removed)."""
    d, d_mlp = cfg.d_model, cfg.d_mlp
    shapes: dict[str, tuple[int, ...]] = {"embed_in.weight": (cfg.d_vocab, d)}
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        shapes.update(
            {**layer_norm_shapes(p + "input_layernorm", d), **layer_norm_shapes(p + "post_attention_layernorm", d)}
        )
        shapes[p + "attention.query_key_value.weight"] = (3 * d, d)
        shapes[p + "attention.dense.weight"] = (d, d)
        if cfg.attn_bias:
            shapes[p + "attention.query_key_value.bias"] = (3 * d,)
            shapes[p + "attention.dense.bias"] = (d,)
        shapes.update(mlp_shapes(p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h", d, d_mlp))
    shapes.update({**layer_norm_shapes("final_layer_norm", d), "lm_head.weight": (cfg.d_vocab, d)})
    return shapes


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: GPTNeoXConfig) -> dict[str, Tensor]:
    """Hugging Face GPT-NeoX state dict -> ours. Pure: the input is not changed, the output shares no memory with it.

    Every name and shape is checked first (``CheckpointError`` listing every missing,
    unexpected or mis-shaped tensor); the read-out may be named ``lm_head`` or
    ``embed_out``, and may be absent only when ``cfg.tied_embeddings``. Each input tensor is read once.
    """
    read = CheckedCheckpoint(
        hf_state_dict,
        cfg,
        lambda names: expected_hf_shapes(cfg),
        layout=LLAMA_LAYOUT._replace(prefixes=("gpt_neox.",)),
        ignored=IGNORED_KEYS,
        aliases={"embed_out.weight": "lm_head.weight"},  # the read-out's name before transformers 5
    )

    ours: dict[str, Tensor] = {"embed.W_E": fresh(read("embed_in.weight"))}
    dtype, device = ours["embed.W_E"].dtype, ours["embed.W_E"].device
    zeros = lambda *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
    for layer in range(cfg.n_layers):
        p, q = f"layers.{layer}.", f"blocks.{layer}."
        ours.update(convert_layer_norm(read, p + "input_layernorm", q + "ln1"))
        qkv_bias = read(p + "attention.query_key_value.bias") if cfg.attn_bias else zeros(3 * cfg.d_model)
        ours.update(split_fused_qkv(read(p + "attention.query_key_value.weight"), qkv_bias, cfg.d_head, q + "attn."))
        ours[q + "attn.W_O"] = heads_out(read(p + "attention.dense.weight"), cfg.d_head)
        ours[q + "attn.b_O"] = fresh(read(p + "attention.dense.bias")) if cfg.attn_bias else zeros(cfg.d_model)
        ours.update(convert_layer_norm(read, p + "post_attention_layernorm", q + "ln2"))
        ours.update(convert_mlp(read, p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h", q + "mlp."))
    ours.update(convert_layer_norm(read, "final_layer_norm", "ln_final"))
    ours.update(convert_read_out(read, ours["embed.W_E"], cfg))  # GPT-NeoX's read-out has no bias
    return ours


load_hf_model = hf_model_loader("GPTNeoXForCausalLM", attn_implementation="eager")


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face GPT-NeoX (``GPTNeoXForCausalLM`` or ``GPTNeoXModel``) and return its value for each of our
    hooks.

    Read with torch hooks on its modules: the token embedding, each block's residual stream
    (``hook_resid_mid`` only for sequential blocks, ``use_parallel_residual=False``), the
    norms (``hook_scale`` from each norm's input), q/k/v from ``query_key_value``, the
    rotated q/k by Hugging Face's own ``apply_rotary_pos_emb`` on them with the cos/sin its
    model handed the attention, the patterns, z (``dense``'s input), the attention and MLP
    outputs, the MLP's pre- and post-activation, the final norm and the logits. Not mapped:
    ``hook_attn_scores`` (Hugging Face masks with the dtype's minimum, not ``-inf``).
    """
    import transformers.models.gpt_neox.modeling_gpt_neox as neox

    body = hf_model.gpt_neox if hasattr(hf_model, "gpt_neox") else hf_model
    d_head = body.config.hidden_size // body.config.num_attention_heads
    recorder = Recorder()
    rotary_inputs: dict[int, Any] = {}
    recorder.output(body.embed_in, "hook_embed")
    for layer, block in enumerate(body.layers):
        q, attn = f"blocks.{layer}.", block.attention
        recorder.input(block, q + "hook_resid_pre")
        recorder.norm(block.input_layernorm, q + "ln1.", centred=True)
        for index, letter in enumerate("qkv"):
            recorder.output(attn.query_key_value, q + f"attn.hook_{letter}", fused_qkv_activation(index, d_head))

        def store(kwargs: dict, layer: int = layer) -> None:
            rotary_inputs[layer] = kwargs["position_embeddings"]

        recorder.kwargs(attn, store)
        recorder.output(attn, q + "attn.hook_pattern", index=1)
        recorder.input(attn.dense, q + "attn.hook_z", split_heads(d_head=d_head))
        recorder.output(attn, q + "hook_attn_out")
        if not block.use_parallel_residual:
            recorder.input(block.post_attention_layernorm, q + "hook_resid_mid")
        recorder.norm(block.post_attention_layernorm, q + "ln2.", centred=True)
        recorder.output(block.mlp.dense_h_to_4h, q + "mlp.hook_pre")
        recorder.input(block.mlp.dense_4h_to_h, q + "mlp.hook_post")
        recorder.output(block.mlp, q + "hook_mlp_out")
        recorder.output(block, q + "hook_resid_post")
    recorder.norm(body.final_layer_norm, "ln_final.", centred=True)
    acts = run_reference(
        hf_model, recorder, {"input_ids": tokens, "use_cache": False, **with_positions(forward_kwargs)}
    )
    for layer, (cos, sin) in rotary_inputs.items():
        q = f"blocks.{layer}.attn."
        rotated = rotate_like_hf(neox.apply_rotary_pos_emb, acts[q + "hook_q"], acts[q + "hook_k"], cos, sin)
        acts[q + "hook_rot_q"], acts[q + "hook_rot_k"] = rotated
    return acts


__all__ = [
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
    "rotate_like_hf",
]

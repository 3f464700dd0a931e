"""GPT-J from Hugging Face: config, pure converter, strict build, reference activations.

Hugging Face's ``GPTJForCausalLM`` keeps separate bias-free ``q_proj``, ``k_proj``, ``v_proj``
and ``out_proj`` (``nn.Linear``, ``[d_out, d_in]``), which become ``W_Q``/``W_K``/``W_V``
``[head_index, d_model, d_head]`` and ``W_O`` (attention biases ours at zero); one ``ln_1``
per block (our ``ln1``, read by attention and MLP); ``fc_in``/``fc_out`` become
``W_in``/``W_out``; ``lm_head`` has a bias, our ``b_U``. Old checkpoints' causal-mask buffers
(``attn.bias``, ``attn.masked_bias``) are skipped.

The rotation is GPT-J's: interleaved pairs ``(2i, 2i + 1)`` on the first ``rotary_dim``
dimensions of each head (all of them when ``rotary_dim`` is None), theta 10000.
"""

import re
from collections.abc import Mapping

import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.core.strict import require_config_fields
from interp_transformer.families.conversion import (
    GPT2_LAYOUT,
    CheckedCheckpoint,
    activation,
    convert_layer_norm,
    convert_mlp,
    fresh,
    heads_in,
    heads_out,
    hf_model_loader,
    layer_norm_shapes,
    linear_shapes,
    linear_to_ours,
    mlp_shapes,
)
from interp_transformer.families.gpt2.hf import gpt2_fields
from interp_transformer.families.gptj.recipe import GPTJConfig
from interp_transformer.families.reference import (
    Recorder,
    run_reference,
    split_heads,
    unsupported_transformers,
    with_positions,
)

IGNORED_KEYS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


def config_from_hf(hf_config) -> GPTJConfig:
    """Our config from a ``transformers.GPTJConfig``; ``ValueError`` naming what is not computed here."""
    require_config_fields(
        hf_config,
        "gptj",
        positive_ints=("n_embd", "n_layer", "n_head", "vocab_size", "n_positions"),
        positive_floats=("layer_norm_epsilon",),
    )
    if hf_config.n_inner is not None:
        require_config_fields(hf_config, "gptj", positive_ints=("n_inner",))
    d_model, n_heads = hf_config.n_embd, hf_config.n_head
    if d_model % n_heads:
        raise ValueError(f"gptj n_embd={d_model} must be divisible by n_head={n_heads}")
    return GPTJConfig(
        rotary_dim=hf_config.rotary_dim,
        tied_embeddings=bool(hf_config.tie_word_embeddings),
        act_fn=activation(hf_config.activation_function, "gptj", "activation_function"),
        name=getattr(hf_config, "name_or_path", "") or "gptj",
        **gpt2_fields(hf_config),
    )


def expected_hf_shapes(cfg: GPTJConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face checkpoint of ``cfg`` (``transformer.`` prefix removed)."""
    d, d_mlp = cfg.d_model, cfg.d_mlp
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (cfg.d_vocab, d)}
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        shapes.update(layer_norm_shapes(p + "ln_1", d))
        for projection in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[p + f"attn.{projection}.weight"] = (d, d)
        shapes.update(mlp_shapes(p + "mlp.fc_in", p + "mlp.fc_out", d, d_mlp))
    shapes.update({**layer_norm_shapes("ln_f", d), **linear_shapes("lm_head", cfg.d_vocab, d)})
    return shapes


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: GPTJConfig) -> dict[str, Tensor]:
    """Hugging Face GPT-J state dict -> ours. Pure: the input is not changed, the output shares no memory with it.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    Each input tensor is read once.
    """
    read = CheckedCheckpoint(
        hf_state_dict,
        cfg,
        lambda names: expected_hf_shapes(cfg),
        layout=GPT2_LAYOUT,
        ignored=IGNORED_KEYS,
    )

    ours: dict[str, Tensor] = {"embed.W_E": fresh(read("wte.weight"))}
    dtype, device = ours["embed.W_E"].dtype, ours["embed.W_E"].device
    for layer in range(cfg.n_layers):
        p, q = f"h.{layer}.", f"blocks.{layer}."
        ours.update(convert_layer_norm(read, p + "ln_1", q + "ln1"))
        for letter in "QKV":
            ours[q + f"attn.W_{letter}"] = heads_in(read(p + f"attn.{letter.lower()}_proj.weight"), cfg.d_head)
            ours[q + f"attn.b_{letter}"] = torch.zeros(cfg.n_heads, cfg.d_head, dtype=dtype, device=device)
        ours[q + "attn.W_O"] = heads_out(read(p + "attn.out_proj.weight"), cfg.d_head)
        ours[q + "attn.b_O"] = torch.zeros(cfg.d_model, dtype=dtype, device=device)
        ours.update(convert_mlp(read, p + "mlp.fc_in", p + "mlp.fc_out", q + "mlp."))
    ours.update(convert_layer_norm(read, "ln_f", "ln_final"))
    ours["unembed.W_U"] = linear_to_ours(read("lm_head.weight") if "lm_head.weight" in read else ours["embed.W_E"])
    ours["unembed.b_U"] = fresh(read("lm_head.bias"))
    return ours


load_hf_model = hf_model_loader("GPTJForCausalLM", attn_implementation="eager")


def rotate_like_gptj(x: Tensor, sin: Tensor, cos: Tensor, rotary_dim: int | None) -> Tensor:
    """Hugging Face GPT-J's rotation of q or k ``[batch, pos, head_index, d_head]``, by its ``apply_rotary_pos_emb``.

    ``sin``/``cos`` ``[batch, pos, rotary_dim / 2]`` are what the model's ``rotary_emb`` gave its
    attention for this run; the first ``rotary_dim`` dimensions (all when None) are rotated.
    """
    import transformers.models.gptj.modeling_gptj as gptj

    rotary_dim = rotary_dim or x.shape[-1]
    return torch.cat([gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos), x[..., rotary_dim:]], dim=-1)


def _rotary_module(body):
    """The model's rotary table module: its output, ``(sin, cos)``, is the rotation every attention layer applies."""
    rotary = getattr(body, "rotary_emb", None)
    if rotary is None:
        raise ValueError(unsupported_transformers("a GPT-J without a rotary_emb module to read its rotation from"))
    return rotary


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face GPT-J (``GPTJForCausalLM`` or ``GPTJModel``) and return its value for each of our hooks.

    Read with torch hooks on its modules: the token embedding, each block's input and output,
    ``ln_1`` (``hook_scale`` from its input), q/k/v from the projections, the rotated q/k by
    GPT-J's own ``apply_rotary_pos_emb`` with the sines and cosines its ``rotary_emb`` gave the
    attention layers, the patterns, z (``out_proj``'s input), the attention and MLP outputs, the MLP's
    pre- and post-activation, the final norm and the logits. GPT-J computes its scores in
    float32 whatever the model's dtype; a float64 model's reference run keeps them in float64
    through ``AttentionInterface`` (see ``reference``). Not mapped: ``hook_attn_scores`` (masked with the dtype's
    minimum).
    """
    body = hf_model.transformer if hasattr(hf_model, "transformer") else hf_model
    d_head, rotary_dim = body.config.n_embd // body.config.n_head, body.config.rotary_dim
    recorder = Recorder()
    recorder.output(body.wte, "hook_embed")
    recorder.outputs(_rotary_module(body), ("sin", "cos"))
    for layer, block in enumerate(body.h):
        q, attn = f"blocks.{layer}.", block.attn
        recorder.input(block, q + "hook_resid_pre")
        recorder.norm(block.ln_1, q + "ln1.", centred=True)
        for letter in "qkv":
            recorder.output(getattr(attn, f"{letter}_proj"), q + f"attn.hook_{letter}", split_heads(d_head=d_head))
        recorder.output(attn, q + "attn.hook_pattern", index=1)
        recorder.input(attn.out_proj, q + "attn.hook_z", split_heads(d_head=d_head))
        recorder.output(attn, q + "hook_attn_out")
        recorder.output(block.mlp.fc_in, q + "mlp.hook_pre")
        recorder.input(block.mlp.fc_out, q + "mlp.hook_post")
        recorder.output(block.mlp, q + "hook_mlp_out")
        recorder.output(block, q + "hook_resid_post")
    recorder.norm(body.ln_f, "ln_final.", centred=True)
    acts = run_reference(
        hf_model, recorder, {"input_ids": tokens, "use_cache": False, **with_positions(forward_kwargs)}
    )
    sin, cos = acts.pop("sin"), acts.pop("cos")
    for layer in range(len(body.h)):
        q = f"blocks.{layer}.attn."
        acts[q + "hook_rot_q"] = rotate_like_gptj(acts[q + "hook_q"], sin, cos, rotary_dim)
        acts[q + "hook_rot_k"] = rotate_like_gptj(acts[q + "hook_k"], sin, cos, rotary_dim)
    return acts


__all__ = [
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
    "rotate_like_gptj",
]

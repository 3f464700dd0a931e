"""OPT from Hugging Face: config, pure converter, strict build, reference activations.

Hugging Face's ``OPTForCausalLM`` keeps separate ``q_proj``, ``k_proj``, ``v_proj`` and
``out_proj`` (``nn.Linear``, ``[d_out, d_in]``) that become ``W_Q``/``W_K``/``W_V``/``W_O``,
``fc1``/``fc2`` that become ``W_in``/``W_out``, ``self_attn_layer_norm`` and the layer's
``final_layer_norm`` that become ``ln1`` and ``ln2``, the decoder's ``final_layer_norm`` our
``ln_final``. ``do_layer_norm_before=False`` (OPT-350m) is the post-norm order,
``OPTPostNormConfig``; otherwise ``OPTConfig``.

Two layouts are rewritten, exactly:

- positions: OPT's table has two rows more than positions (its ``offset = 2``: position
  ``p`` reads row ``p + 2``, rows 0 and 1 are never read for a real token); ``W_pos`` is
  ``embed_positions.weight[2:]``.
- projections: where the embeddings are narrower than the residual stream (OPT-350m: 512
  against 1024), ``project_in`` widens the token embedding and ``project_out`` narrows the
  last residual stream before the tied read-out. Both are linear and bias-free, so they are
  folded: ``W_E = embed_tokens project_in^T`` ``[d_vocab, d_model]`` and ``W_U =
  project_out^T lm_head^T`` ``[d_model, d_vocab]``, computed in float32 or wider. ``hook_embed``
  is then what Hugging Face's ``project_in`` outputs, and every tool reads ``W_E`` and ``W_U``
  at ``d_model``; the 512-wide bottleneck survives as their rank.

Without ``enable_bias`` the biases are ours at zero; without ``layer_norm_elementwise_affine``
the norms' ``w`` and ``b`` are 1 and 0. The read-out has no bias, so ``b_U = 0``.
"""

from collections.abc import Mapping

import einops
import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.core.strict import require_config_fields
from interp_transformer.families.conversion import (
    LLAMA_LAYOUT,
    CheckedCheckpoint,
    activation,
    fresh,
    heads_in,
    heads_out,
    hf_model_loader,
    linear_to_ours,
    per_head_bias,
)
from interp_transformer.families.opt.recipe import OPTConfig, OPTPostNormConfig
from interp_transformer.families.reference import Recorder, run_reference, split_heads

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: position p is row p + 2


def config_from_hf(hf_config):
    """``OPTConfig`` (pre-norm) or ``OPTPostNormConfig`` (``do_layer_norm_before=False``) from a
    ``transformers.OPTConfig``."""
    require_config_fields(
        hf_config,
        "opt",
        positive_ints=(
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "ffn_dim",
            "vocab_size",
            "max_position_embeddings",
        ),
    )
    d_model, n_heads = hf_config.hidden_size, hf_config.num_attention_heads
    if d_model % n_heads:
        raise ValueError(f"opt hidden_size={d_model} must be divisible by num_attention_heads={n_heads}")
    d_embed = hf_config.word_embed_proj_dim
    if d_embed is not None:
        require_config_fields(hf_config, "opt", positive_ints=("word_embed_proj_dim",))
    fields = dict(
        d_model=d_model,
        n_layers=hf_config.num_hidden_layers,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf_config.ffn_dim,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.max_position_embeddings,
        act_fn=activation(hf_config.activation_function, "opt", "activation_function"),
        d_embed=None if d_embed in (None, d_model) else d_embed,
        biases=bool(hf_config.enable_bias),
        norm_weights=bool(hf_config.layer_norm_elementwise_affine),
        tied_embeddings=bool(hf_config.tie_word_embeddings),
        init_range=float(hf_config.init_std),
        name=getattr(hf_config, "name_or_path", "") or "opt",
    )
    if not hf_config.do_layer_norm_before:
        return OPTPostNormConfig(**fields)
    return OPTConfig(**fields, final_norm=not getattr(hf_config, "_remove_final_layer_norm", False))


def _pre_norm(cfg) -> bool:
    return isinstance(cfg, OPTConfig)


def expected_hf_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face checkpoint of ``cfg`` (``model.decoder.`` prefix removed)."""
    d, d_mlp, d_embed = cfg.d_model, cfg.d_mlp, cfg.d_embed or cfg.d_model
    norm = lambda name: {name + ".weight": (d,), name + ".bias": (d,)} if cfg.norm_weights else {}  # noqa: E731
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (cfg.d_vocab, d_embed),
        "embed_positions.weight": (cfg.n_ctx + POSITION_OFFSET, d),
    }
    if cfg.d_embed is not None:
        shapes.update({"project_in.weight": (d, d_embed), "project_out.weight": (d_embed, d)})
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        linears = {
            "self_attn.q_proj": (d, d),
            "self_attn.k_proj": (d, d),
            "self_attn.v_proj": (d, d),
            "self_attn.out_proj": (d, d),
            "fc1": (d_mlp, d),
            "fc2": (d, d_mlp),
        }
        for name, shape in linears.items():
            shapes[p + name + ".weight"] = shape
            if cfg.biases:
                shapes[p + name + ".bias"] = shape[:1]
        shapes.update({**norm(p + "self_attn_layer_norm"), **norm(p + "final_layer_norm")})
    if _pre_norm(cfg) and cfg.final_norm:
        shapes.update(norm("final_layer_norm"))
    shapes["lm_head.weight"] = (cfg.d_vocab, d_embed)
    return shapes


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg) -> dict[str, Tensor]:
    """Hugging Face OPT state dict -> ours (see the module docstring). Pure: the input is not changed.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    The output shares no memory with the input.
    """
    # OPTForCausalLM: model.decoder.*; OPTModel: decoder.*
    layout = LLAMA_LAYOUT._replace(prefixes=("model.", "decoder."))
    read = CheckedCheckpoint(hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg), layout=layout)

    embed_tokens = read("embed_tokens.weight")
    dtype, device = embed_tokens.dtype, embed_tokens.device
    zeros = lambda *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
    ones = lambda *shape: torch.ones(shape, dtype=dtype, device=device)  # noqa: E731
    lm_head = read("lm_head.weight") if "lm_head.weight" in read else embed_tokens
    ours = {"pos_embed.W_pos": fresh(read("embed_positions.weight")[POSITION_OFFSET:])}
    if cfg.d_embed is None:
        ours["embed.W_E"], ours["unembed.W_U"] = fresh(embed_tokens), linear_to_ours(lm_head)
    else:  # fold the projections (module docstring), in float32 or wider
        wide = torch.promote_types(dtype, torch.float32)
        ours["embed.W_E"] = (
            einops.einsum(
                embed_tokens.to(wide),
                read("project_in.weight").to(wide),
                "d_vocab d_embed, d_model d_embed -> d_vocab d_model",
            )
            .to(dtype)
            .contiguous()
        )
        ours["unembed.W_U"] = (
            einops.einsum(
                read("project_out.weight").to(wide),
                lm_head.to(wide),
                "d_embed d_model, d_vocab d_embed -> d_model d_vocab",
            )
            .to(dtype)
            .contiguous()
        )

    def norm(hf_name: str, ours_name: str) -> None:
        ours[ours_name + ".w"] = fresh(read(hf_name + ".weight")) if cfg.norm_weights else ones(cfg.d_model)
        ours[ours_name + ".b"] = fresh(read(hf_name + ".bias")) if cfg.norm_weights else zeros(cfg.d_model)

    def bias(hf_name: str, width: int) -> Tensor:
        return fresh(read(hf_name + ".bias")) if cfg.biases else zeros(width)

    for layer in range(cfg.n_layers):
        p, q = f"layers.{layer}.", f"blocks.{layer}."
        for letter in "QKV":
            name = p + f"self_attn.{letter.lower()}_proj"
            ours[q + f"attn.W_{letter}"] = heads_in(read(name + ".weight"), cfg.d_head)
            ours[q + f"attn.b_{letter}"] = per_head_bias(bias(name, cfg.d_model), cfg.d_head)
        ours[q + "attn.W_O"] = heads_out(read(p + "self_attn.out_proj.weight"), cfg.d_head)
        ours[q + "attn.b_O"] = bias(p + "self_attn.out_proj", cfg.d_model)
        ours[q + "mlp.W_in"], ours[q + "mlp.b_in"] = linear_to_ours(read(p + "fc1.weight")), bias(p + "fc1", cfg.d_mlp)
        ours[q + "mlp.W_out"], ours[q + "mlp.b_out"] = (
            linear_to_ours(read(p + "fc2.weight")),
            bias(p + "fc2", cfg.d_model),
        )
        norm(p + "self_attn_layer_norm", q + "ln1")
        norm(p + "final_layer_norm", q + "ln2")
    if _pre_norm(cfg) and cfg.final_norm:
        norm("final_layer_norm", "ln_final")
    ours["unembed.b_U"] = zeros(cfg.d_vocab)  # OPT's read-out has no bias
    return ours


load_hf_model = hf_model_loader("OPTForCausalLM", attn_implementation="eager")


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face OPT (``OPTForCausalLM``, ``OPTModel``) and return its value for each of our hooks.

    Read with torch hooks on its modules: ``hook_embed`` (``project_in``'s output where there
    is one, else ``embed_tokens``'), ``hook_pos_embed``, each block's residual stream, its
    norms (``hook_scale`` from each norm's input), q/k/v (the projections' outputs, before
    OPT scales q), the patterns, z (``out_proj``'s input), the attention and MLP outputs and
    activations, the final norm (pre-norm) or each block's normalized output (post-norm), and
    the logits. OPT flattens ``[batch, pos]`` around its MLP; those values are unflattened.
    Not mapped: ``hook_attn_scores`` (Hugging Face masks with the dtype's minimum).
    """
    decoder = hf_model.model.decoder if hasattr(hf_model, "model") else getattr(hf_model, "decoder", hf_model)
    config = decoder.config
    d_head = config.hidden_size // config.num_attention_heads
    unflatten = lambda x: x.reshape(tokens.shape[0], tokens.shape[1], x.shape[-1])  # noqa: E731
    recorder = Recorder()
    recorder.output(decoder.project_in if decoder.project_in is not None else decoder.embed_tokens, "hook_embed")
    recorder.output(decoder.embed_positions, "hook_pos_embed")
    for layer, block in enumerate(decoder.layers):
        q, attn = f"blocks.{layer}.", block.self_attn
        recorder.input(block, q + "hook_resid_pre")
        for letter in "qkv":
            recorder.output(getattr(attn, f"{letter}_proj"), q + f"attn.hook_{letter}", split_heads(d_head=d_head))
        recorder.output(attn, q + "attn.hook_pattern", index=1)
        recorder.input(attn.out_proj, q + "attn.hook_z", split_heads(d_head=d_head))
        recorder.output(attn, q + "hook_attn_out")
        recorder.output(block.fc1, q + "mlp.hook_pre", unflatten)
        recorder.input(block.fc2, q + "mlp.hook_post", unflatten)
        recorder.output(block.fc2, q + "hook_mlp_out", unflatten)
        if config.do_layer_norm_before:  # x + attn(ln1(x)), then + mlp(ln2(.))
            recorder.norm(block.self_attn_layer_norm, q + "ln1.", centred=True)
            recorder.input(block.final_layer_norm, q + "hook_resid_mid", unflatten)
            recorder.norm(block.final_layer_norm, q + "ln2.", centred=True, transform=unflatten)
            recorder.output(block, q + "hook_resid_post")
        else:  # ln1(x + attn(x)), then ln2(. + mlp(.))
            recorder.input(block.self_attn_layer_norm, q + "hook_resid_mid")
            recorder.norm(block.self_attn_layer_norm, q + "ln1.", centred=True)
            recorder.input(block.final_layer_norm, q + "hook_resid_post", unflatten)
            recorder.norm(block.final_layer_norm, q + "ln2.", centred=True, transform=unflatten)
            recorder.output(block, q + "hook_normalized_resid_post")
    if decoder.final_layer_norm is not None:
        recorder.norm(decoder.final_layer_norm, "ln_final.", centred=True)
    return run_reference(hf_model, recorder, {"input_ids": tokens, "use_cache": False, **forward_kwargs})


__all__ = [
    "POSITION_OFFSET",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
]

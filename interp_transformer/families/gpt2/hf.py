"""GPT-2 from Hugging Face: config, pure weight converter, strict model build, reference activations.

Hugging Face's GPT-2 keeps attention as one fused ``c_attn`` of shape
``[d_model, 3 * d_model]`` (``Conv1D`` weights are stored ``[in, out]``), the
heads side by side inside each third. We split it into explicit per-head
``W_Q/W_K/W_V [head_index, d_model, d_head]``; ``c_proj [d_model, d_model]``
becomes ``W_O [head_index, d_head, d_model]``; the MLP's ``c_fc``/``c_proj`` are
already ``W_in [d_model, d_mlp]`` / ``W_out [d_mlp, d_model]``; the LM head
``[d_vocab, d_model]`` (tied to ``wte``, and absent from most checkpoints) becomes
``W_U [d_model, d_vocab]``; GPT-2 has no unembedding bias, so ``b_U = 0``.
"""

import re
from collections.abc import Mapping

import einops
import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.core.strict import (
    check_checkpoint,
    check_layer_count,
    require_config_fields,
    state_dict_shapes,
)
from interp_transformer.families.gpt2.recipe import TransformerConfig
from interp_transformer.families.reference import Recorder, patched, run_reference, split_heads, with_positions

# Hugging Face activation names -> ours. gelu_pytorch_tanh is the same formula as gelu_new.
ACTIVATIONS = {
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
# Causal-mask buffers that old checkpoints (e.g. the hub's "gpt2") store beside the weights.
IGNORED_KEYS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
GPT2_VOCAB_SIZE = 50257  # the vocabulary of OpenAI's GPT-2 tokenizer


def config_from_hf(hf_config) -> TransformerConfig:
    """Our config from a ``transformers.GPT2Config``; ``ValueError`` for GPT-2 variants we do not compute.

    Refused by name: ``scale_attn_by_inverse_layer_idx`` (scores of layer ``L`` divided by
    ``L + 1``: other scores), ``scale_attn_weights=False`` and ``add_cross_attention``.
    Accepted: ``reorder_and_upcast_attn``, which only computes a half-precision model's scores
    in float32; in float32 and float64 the two compute the same numbers, and a bfloat16 model
    of ours (scores in bfloat16) differs from it by half-precision rounding.
    """
    require_config_fields(
        hf_config,
        "GPT-2",
        positive_ints=("n_embd", "n_head", "n_layer", "vocab_size", "n_positions"),
        positive_floats=("layer_norm_epsilon",),
    )
    if hf_config.n_inner is not None:
        require_config_fields(hf_config, "GPT-2", positive_ints=("n_inner",))
    unsupported = {
        "scale_attn_weights": (getattr(hf_config, "scale_attn_weights", True), True),
        "scale_attn_by_inverse_layer_idx": (getattr(hf_config, "scale_attn_by_inverse_layer_idx", False), False),
        "add_cross_attention": (getattr(hf_config, "add_cross_attention", False), False),
    }
    for name, (value, supported) in unsupported.items():
        if bool(value) != supported:
            raise ValueError(f"GPT-2 config has {name}={value!r}; only {name}={supported} is supported")
    activation = hf_config.activation_function
    if activation not in ACTIVATIONS:
        raise ValueError(f"GPT-2 activation_function={activation!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    d_model, n_heads = hf_config.n_embd, hf_config.n_head
    if d_model % n_heads:
        raise ValueError(f"n_embd={d_model} must be divisible by n_head={n_heads}")
    return TransformerConfig(
        act_fn=ACTIVATIONS[activation], name=getattr(hf_config, "name_or_path", "") or "gpt2", **gpt2_fields(hf_config)
    )


def gpt2_fields(hf_config) -> dict:
    """The config fields a GPT-2-style Hugging Face config (GPT-2's, GPT-J's) gives alike: widths, counts, the norm's
    epsilon and the init range; ``n_embd`` divisible by ``n_head`` is checked first by the caller."""
    d_model, n_heads = hf_config.n_embd, hf_config.n_head
    return dict(
        d_model=d_model,
        n_layers=hf_config.n_layer,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf_config.n_inner if hf_config.n_inner is not None else 4 * d_model,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.n_positions,
        layer_norm_eps=float(hf_config.layer_norm_epsilon),
        init_range=float(hf_config.initializer_range),
    )


def expected_hf_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face GPT-2 checkpoint (``transformer.`` prefix removed)."""
    d_model, d_mlp, d_vocab = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    if d_mlp is None:  # a Hugging Face GPT-2 has an MLP in every block
        raise ValueError("a Hugging Face GPT-2 checkpoint has MLPs: the config's d_mlp must be set, got None")
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (d_vocab, d_model), "wpe.weight": (cfg.n_ctx, d_model)}
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        shapes.update(
            {
                p + "ln_1.weight": (d_model,),
                p + "ln_1.bias": (d_model,),
                p + "attn.c_attn.weight": (d_model, 3 * d_model),
                p + "attn.c_attn.bias": (3 * d_model,),
                p + "attn.c_proj.weight": (d_model, d_model),
                p + "attn.c_proj.bias": (d_model,),
                p + "ln_2.weight": (d_model,),
                p + "ln_2.bias": (d_model,),
                p + "mlp.c_fc.weight": (d_model, d_mlp),
                p + "mlp.c_fc.bias": (d_mlp,),
                p + "mlp.c_proj.weight": (d_mlp, d_model),
                p + "mlp.c_proj.bias": (d_model,),
            }
        )
    shapes.update({"ln_f.weight": (d_model,), "ln_f.bias": (d_model,), "lm_head.weight": (d_vocab, d_model)})
    return shapes


def _strip_prefix(name: str) -> str:
    # GPT2LMHeadModel checkpoints prefix the body with "transformer."; GPT2Model ones do not.
    return name[len("transformer.") :] if name.startswith("transformer.") else name


def _fresh(tensor: Tensor) -> Tensor:
    # A contiguous copy: our weights never alias the source's (weight processing edits them in place).
    return tensor.clone(memory_format=torch.contiguous_format)


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: TransformerConfig) -> dict[str, Tensor]:
    """Hugging Face GPT-2 state dict -> ours (DESIGN section 4 names and shapes). Pure: the input is not changed.

    Every name and shape is checked before any tensor is read: missing, unexpected
    or mis-shaped tensors raise one ``CheckpointError`` (a ``ValueError``) listing
    them all. ``lm_head.weight`` may be absent (tied to ``wte``). The output
    tensors are new, contiguous and never share memory with the input; each input
    tensor is read once, so a lazily read input keeps memory near one copy.
    """
    names = {_strip_prefix(name): name for name in hf_state_dict}
    shapes = {_strip_prefix(name): shape for name, shape in state_dict_shapes(hf_state_dict).items()}
    check_layer_count(shapes, r"^h\.(\d+)\.", cfg.n_layers, "GPT-2 checkpoint", "n_layer")
    check_checkpoint(
        shapes, expected_hf_shapes(cfg), what="GPT-2 checkpoint", optional=["lm_head.weight"], ignored=IGNORED_KEYS
    )

    def read(name: str) -> Tensor:
        return hf_state_dict[names[name]]

    n_heads = cfg.n_heads
    ours: dict[str, Tensor] = {}
    ours["embed.W_E"] = _fresh(read("wte.weight"))
    ours["pos_embed.W_pos"] = _fresh(read("wpe.weight"))
    for layer in range(cfg.n_layers):
        p, q = f"h.{layer}.", f"blocks.{layer}."
        ours[q + "ln1.w"] = _fresh(read(p + "ln_1.weight"))
        ours[q + "ln1.b"] = _fresh(read(p + "ln_1.bias"))
        W_QKV = einops.rearrange(
            read(p + "attn.c_attn.weight"),
            "d_model (qkv head_index d_head) -> qkv head_index d_model d_head",
            qkv=3,
            head_index=n_heads,
        )
        b_QKV = einops.rearrange(
            read(p + "attn.c_attn.bias"), "(qkv head_index d_head) -> qkv head_index d_head", qkv=3, head_index=n_heads
        )
        for index, letter in enumerate("QKV"):
            ours[q + f"attn.W_{letter}"] = _fresh(W_QKV[index])
            ours[q + f"attn.b_{letter}"] = _fresh(b_QKV[index])
        del W_QKV, b_QKV
        ours[q + "attn.W_O"] = _fresh(
            einops.rearrange(
                read(p + "attn.c_proj.weight"),
                "(head_index d_head) d_model -> head_index d_head d_model",
                head_index=n_heads,
            )
        )
        ours[q + "attn.b_O"] = _fresh(read(p + "attn.c_proj.bias"))
        ours[q + "ln2.w"] = _fresh(read(p + "ln_2.weight"))
        ours[q + "ln2.b"] = _fresh(read(p + "ln_2.bias"))
        ours[q + "mlp.W_in"] = _fresh(read(p + "mlp.c_fc.weight"))
        ours[q + "mlp.b_in"] = _fresh(read(p + "mlp.c_fc.bias"))
        ours[q + "mlp.W_out"] = _fresh(read(p + "mlp.c_proj.weight"))
        ours[q + "mlp.b_out"] = _fresh(read(p + "mlp.c_proj.bias"))
    ours["ln_final.w"] = _fresh(read("ln_f.weight"))
    ours["ln_final.b"] = _fresh(read("ln_f.bias"))
    # Most GPT-2 checkpoints omit lm_head.weight: it is tied to (equal to) the token embedding.
    lm_head = read("lm_head.weight") if "lm_head.weight" in names else ours["embed.W_E"]
    ours["unembed.W_U"] = _fresh(einops.rearrange(lm_head, "d_vocab d_model -> d_model d_vocab"))
    ours["unembed.b_U"] = torch.zeros(cfg.d_vocab, dtype=lm_head.dtype, device=lm_head.device)  # GPT-2 has none
    return ours


def fallback_tokenizer(hf_config):
    """GPT-2's own tokenizer (built offline) when the source has none and the vocabulary is GPT-2's."""
    if hf_config.vocab_size != GPT2_VOCAB_SIZE:
        return None
    from interp_transformer.text.tokens import offline_gpt2_tokenizer

    return offline_gpt2_tokenizer()


def load_hf_model(directory, *, dtype=torch.float32):
    """The Hugging Face reference model of a GPT-2 directory, with eager attention (patterns visible)."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager").eval()


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face GPT-2 (``GPT2LMHeadModel`` or ``GPT2Model``) and return its value for each of our hooks.

    Values are read with torch forward hooks on HF's modules (so they are HF's own
    tensors, not recomputed): the token and position embeddings (``wte``/``wpe``
    outputs) and their sum, HF's input to block 0 (``blocks.0.hook_resid_pre``),
    each block's residual stream (pre, mid, post), LayerNorm outputs, per-head q/k/v, attention patterns (the model is
    switched to eager attention for the call), z, attention and MLP outputs, MLP
    pre/post activations, the final LayerNorm, and ``"logits"`` when the model has
    an LM head. With an ``attention_mask``, Hugging Face is given the position ids ours reads
    (counted from each row's first real token, ``reference.with_positions``). Not mapped:
    ``hook_attn_scores`` (HF masks with a large negative number, not ``-inf``) and the
    LayerNorm ``hook_scale`` (HF never forms it).
    """
    body = hf_model.transformer if hasattr(hf_model, "transformer") else hf_model
    split = split_heads(head_index=body.config.n_head)
    rec = Recorder()
    rec.output(body.wte, "hook_embed")
    rec.output(body.wpe, "hook_pos_embed", lambda out: out.expand(tokens.shape[0], -1, -1))
    for layer, block in enumerate(body.h):
        q = f"blocks.{layer}."
        rec.input(block, q + "hook_resid_pre")
        rec.output(block.ln_1, q + "ln1.hook_normalized")
        for index, letter in enumerate("qkv"):
            rec.output(
                block.attn.c_attn, q + f"attn.hook_{letter}", lambda out, i=index: split(out.chunk(3, dim=-1)[i])
            )
        rec.output(block.attn, q + "attn.hook_pattern", index=1)
        rec.input(block.attn.c_proj, q + "attn.hook_z", split)
        rec.output(block.attn, q + "hook_attn_out")
        rec.input(block.ln_2, q + "hook_resid_mid")
        rec.output(block.ln_2, q + "ln2.hook_normalized")
        rec.output(block.mlp.c_fc, q + "mlp.hook_pre")
        rec.input(block.mlp.c_proj, q + "mlp.hook_post")
        rec.output(block.mlp, q + "hook_mlp_out")
        rec.output(block, q + "hook_resid_post")
    rec.output(body.ln_f, "ln_final.hook_normalized")
    # reorder_and_upcast_attn only chooses float32 arithmetic for half-precision weights (the math is the same),
    # and Hugging Face refuses it in float64: switch it off where it changes nothing but would fail
    full_precision = body.wte.weight.dtype in (torch.float32, torch.float64)
    upcast = [block.attn for block in body.h if getattr(block.attn, "reorder_and_upcast_attn", False)]
    patches = [patched(attn, "reorder_and_upcast_attn", False) for attn in upcast] if full_precision else []
    inputs = {"input_ids": tokens, "use_cache": False, **with_positions(forward_kwargs)}
    return run_reference(hf_model, rec, inputs, attention="eager", patches=patches)


__all__ = [
    "ACTIVATIONS",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "fallback_tokenizer",
    "hf_reference_activations",
    "load_hf_model",
]

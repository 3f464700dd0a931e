"""BLOOM from Hugging Face: config, pure converter, strict build, reference activations.

Hugging Face's ``BloomForCausalLM`` keeps ``word_embeddings`` and ``word_embeddings_layernorm``
(our ``embed.W_E`` and ``embed.ln``), a fused ``query_key_value`` holding, for each head in
turn, its q, k and v side by side (``[(head_index qkv d_head), d_model]``, as GPT-NeoX),
``dense`` (``W_O``), ``dense_h_to_4h``/``dense_4h_to_h`` (``W_in``/``W_out``), the norms
``input_layernorm``/``post_attention_layernorm``/``ln_f`` (``ln1``/``ln2``/``ln_final``) and a
read-out tied to the embedding, without bias (``b_U = 0``). Positions are ALiBi's, computed,
not stored.

``config_from_hf`` refuses ``apply_residual_connection_post_layernorm=True`` (the residual
stream would be the norm's output, another block formula). ``pretraining_tp > 1`` with
``slow_but_exact=True`` is refused too: Hugging Face's slow path splits ``dense`` and
``dense_4h_to_h`` into slices summed one after another and leaves out their biases, so its
logits are not the checkpoint's model (with ``slow_but_exact=False`` the same sums run in one
product, biases included, as here). BLOOM's config
states no context length (ALiBi has none); ``n_ctx`` is 2048, BLOOM's training length, or
the config's ``seq_length`` where it has one.
"""

from collections.abc import Mapping
from contextlib import AbstractContextManager

import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.core.strict import require_config_fields
from interp_transformer.families.bloom.recipe import BloomConfig
from interp_transformer.families.conversion import (
    GPT2_LAYOUT,
    CheckedCheckpoint,
    convert_layer_norm,
    convert_mlp,
    convert_read_out,
    fresh,
    fused_qkv_activation,
    heads_out,
    hf_model_loader,
    layer_norm_shapes,
    linear_shapes,
    mlp_shapes,
    split_fused_qkv,
)
from interp_transformer.families.reference import (
    Recorder,
    patched,
    run_reference,
    split_heads,
    unsupported_transformers,
)

DEFAULT_N_CTX = 2048  # BLOOM's training context


def config_from_hf(hf_config) -> BloomConfig:
    """Our config from a ``transformers.BloomConfig``; ``ValueError`` naming what is not computed here."""
    require_config_fields(
        hf_config,
        "bloom",
        positive_ints=("hidden_size", "n_layer", "n_head", "vocab_size"),
        positive_floats=("layer_norm_epsilon",),
    )
    if hf_config.apply_residual_connection_post_layernorm:
        raise ValueError(
            "bloom config has apply_residual_connection_post_layernorm=True (the residual stream is each norm's "
            "output); only apply_residual_connection_post_layernorm=False is supported"
        )
    tp, exact = getattr(hf_config, "pretraining_tp", 1), getattr(hf_config, "slow_but_exact", False)
    if exact and isinstance(tp, int) and tp > 1:
        raise ValueError(
            f"bloom config has slow_but_exact=True with pretraining_tp={tp}: Hugging Face's slow "
            "path then leaves out the checkpoint's biases of self_attention.dense and "
            "mlp.dense_4h_to_h (its logits are not the fast path's); only slow_but_exact=False (or "
            "pretraining_tp=1) is supported"
        )
    d_model, n_heads = hf_config.hidden_size, hf_config.n_head
    if d_model % n_heads:
        raise ValueError(f"bloom hidden_size={d_model} must be divisible by n_head={n_heads}")
    n_ctx = getattr(hf_config, "seq_length", None) or DEFAULT_N_CTX
    return BloomConfig(
        d_model=d_model,
        n_layers=hf_config.n_layer,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=4 * d_model,
        d_vocab=hf_config.vocab_size,
        n_ctx=n_ctx,
        tied_embeddings=bool(hf_config.tie_word_embeddings),
        layer_norm_eps=float(hf_config.layer_norm_epsilon),
        init_range=float(hf_config.initializer_range),
        name=getattr(hf_config, "name_or_path", "") or "bloom",
    )


def expected_hf_shapes(cfg: BloomConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a Hugging Face checkpoint of ``cfg`` (``transformer.`` prefix removed)."""
    d, d_mlp = cfg.d_model, cfg.d_mlp
    shapes = {"word_embeddings.weight": (cfg.d_vocab, d), **layer_norm_shapes("word_embeddings_layernorm", d)}
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        shapes.update(
            {
                **layer_norm_shapes(p + "input_layernorm", d),
                **linear_shapes(p + "self_attention.query_key_value", 3 * d, d),
                **linear_shapes(p + "self_attention.dense", d, d),
                **layer_norm_shapes(p + "post_attention_layernorm", d),
                **mlp_shapes(p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h", d, d_mlp),
            }
        )
    shapes.update({**layer_norm_shapes("ln_f", d), "lm_head.weight": (cfg.d_vocab, d)})
    return shapes


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: BloomConfig) -> dict[str, Tensor]:
    """Hugging Face BLOOM state dict -> ours. Pure: the input is not changed, the output shares no memory with it.

    Every name and shape is checked first (``CheckedCheckpoint``: ``lm_head.weight`` may be absent only when tied).
    Each input tensor is read once.
    """
    read = CheckedCheckpoint(hf_state_dict, cfg, lambda names: expected_hf_shapes(cfg), layout=GPT2_LAYOUT)

    ours: dict[str, Tensor] = {"embed.W_E": fresh(read("word_embeddings.weight"))}
    ours.update(convert_layer_norm(read, "word_embeddings_layernorm", "embed.ln"))
    for layer in range(cfg.n_layers):
        p, q = f"h.{layer}.", f"blocks.{layer}."
        ours.update(convert_layer_norm(read, p + "input_layernorm", q + "ln1"))
        attn = p + "self_attention."
        ours.update(
            split_fused_qkv(
                read(attn + "query_key_value.weight"), read(attn + "query_key_value.bias"), cfg.d_head, q + "attn."
            )
        )
        ours[q + "attn.W_O"], ours[q + "attn.b_O"] = (
            heads_out(read(attn + "dense.weight"), cfg.d_head),
            fresh(read(attn + "dense.bias")),
        )
        ours.update(convert_layer_norm(read, p + "post_attention_layernorm", q + "ln2"))
        ours.update(convert_mlp(read, p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h", q + "mlp."))
    ours.update(convert_layer_norm(read, "ln_f", "ln_final"))
    ours.update(convert_read_out(read, ours["embed.W_E"], cfg))  # BLOOM's read-out has no bias
    return ours


load_hf_model = hf_model_loader("BloomForCausalLM")


class _SoftmaxInInputDtype:
    """``torch.nn.functional`` with ``softmax`` computed in its input's dtype (a requested float32 is ignored)."""

    def __getattr__(self, name: str):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def softmax(x: Tensor, dim: int, dtype=None) -> Tensor:
        return torch.nn.functional.softmax(x, dim=dim)


def _float64_bloom(hf_model) -> list[AbstractContextManager]:
    """BLOOM's module computes the ALiBi products and the softmax in float32; for a float64 run, in float64.

    The slopes stay the float32 numbers BLOOM defines (as ours are); only the products and
    the softmax keep float64 precision. Restored afterwards, also on error.
    """
    import transformers.models.bloom.modeling_bloom as bloom

    # no public seam reaches these: check for them, and name the supported versions when they are gone
    slopes, functional = getattr(bloom, "_get_alibi_slopes", None), getattr(bloom, "F", None)
    if slopes is None or functional is None:
        raise ValueError(unsupported_transformers("BLOOM's ALiBi slopes and softmax for a float64 run"))
    return [
        patched(bloom, "_get_alibi_slopes", lambda num_heads, device: slopes(num_heads, device).to(torch.float64)),
        patched(bloom, "F", _SoftmaxInInputDtype()),
    ]


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face BLOOM (``BloomForCausalLM`` or ``BloomModel``) and return its value for each of our hooks.

    Read with torch hooks on its modules: the embedding norm (``embed.ln.*``; its output is
    ``hook_embed``), each block's input and output, the norms (``hook_scale`` from each
    norm's input), q/k/v from ``query_key_value``, the patterns, z (``dense``'s input), the
    attention output (``dense``'s output: BLOOM's attention module returns it already added
    to the residual, which is our ``hook_resid_mid``), the MLP's pre- and post-activation and
    output (``dense_4h_to_h``'s), the final norm and the logits. Not mapped:
    ``hook_attn_scores`` and the ALiBi bias (BLOOM adds ``slope * key_position``, ours
    ``-slope * |query_position - key_position|``: the same patterns, see ``components.alibi``).
    """
    body = hf_model.transformer if hasattr(hf_model, "transformer") else hf_model
    d_head = body.config.hidden_size // body.config.n_head
    recorder = Recorder()
    recorder.norm(body.word_embeddings_layernorm, "embed.ln.", centred=True)
    recorder.output(body.word_embeddings_layernorm, "hook_embed")
    for layer, block in enumerate(body.h):
        q, attn = f"blocks.{layer}.", block.self_attention
        recorder.input(block, q + "hook_resid_pre")
        recorder.norm(block.input_layernorm, q + "ln1.", centred=True)
        for index, letter in enumerate("qkv"):
            recorder.output(attn.query_key_value, q + f"attn.hook_{letter}", fused_qkv_activation(index, d_head))
        recorder.output(attn, q + "attn.hook_pattern", index=1)
        recorder.input(attn.dense, q + "attn.hook_z", split_heads(d_head=d_head))
        recorder.output(attn.dense, q + "hook_attn_out")
        recorder.output(attn, q + "hook_resid_mid")
        recorder.norm(block.post_attention_layernorm, q + "ln2.", centred=True)
        recorder.output(block.mlp.dense_h_to_4h, q + "mlp.hook_pre")
        recorder.input(block.mlp.dense_4h_to_h, q + "mlp.hook_post")
        recorder.output(block.mlp.dense_4h_to_h, q + "hook_mlp_out")
        recorder.output(block, q + "hook_resid_post")
    recorder.norm(body.ln_f, "ln_final.", centred=True)
    inputs = {"input_ids": tokens, "use_cache": False, **forward_kwargs}
    return run_reference(hf_model, recorder, inputs, _float64_bloom, attention=None)


__all__ = [
    "DEFAULT_N_CTX",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
]

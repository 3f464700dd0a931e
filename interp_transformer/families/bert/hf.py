"""Hugging Face BERT -> ``EncoderTransformer``: a strict, pure weight converter and reference activations.

The architecture-module contract of ``interp_transformer.loading``:

* ``config_from_hf(hf_config) -> EncoderConfig`` (the body; the heads come from the weights),
* ``convert_state_dict(hf_state_dict, cfg) -> our state dict`` (pure: no model is built),
* ``config_for_weights(cfg, state_dict) -> EncoderConfig``: the heads the weights hold (``loading.build_model``
  builds the model),
* ``hf_reference_activations(hf_model, tokens, attention_mask, token_type_ids)``: HF's
  activations under our hook names (and ``"logits"`` for an MLM head), for ``verify``,
* ``load_hf_model(directory, *, dtype)``: the matching HF reference model.

``interp_transformer.loading.from_pretrained`` resolves a source (hub name, local
directory, in-memory model) and calls them; ``EncoderTransformer.from_pretrained``
is that call, checked to return an encoder.

Weight map (``nn.Linear`` weights are stored ``[out, in]``; ours are ``[in, out]``, per head)::

    embeddings.word_embeddings.weight [d_vocab d_model]       -> embed.W_E
    embeddings.position_embeddings.weight [n_ctx d_model]     -> pos_embed.W_pos
    embeddings.token_type_embeddings.weight                   -> token_type_embed.W_token_type
    embeddings.LayerNorm                                      -> embed_ln
    encoder.layer.L.attention.self.query/key/value            -> blocks.L.attn.W_Q/W_K/W_V, b_Q/b_K/b_V
    encoder.layer.L.attention.output.dense                    -> blocks.L.attn.W_O, b_O
    encoder.layer.L.attention.output.LayerNorm                -> blocks.L.ln1
    encoder.layer.L.intermediate.dense / output.dense         -> blocks.L.mlp.W_in, b_in / W_out, b_out
    encoder.layer.L.output.LayerNorm                          -> blocks.L.ln2
    pooler.dense                                              -> pooler.W_pool, b_pool
    cls.predictions.transform.dense / transform.LayerNorm     -> mlm_head.W_transform, b_transform / mlm_head.ln
    cls.predictions.decoder.weight (else the tied W_E)        -> mlm_head.unembed.W_U
    cls.predictions.decoder.bias (else cls.predictions.bias)  -> mlm_head.unembed.b_U

Keys may carry the ``bert.`` prefix (``BertForMaskedLM`` and friends). Legacy
``LayerNorm.gamma/beta`` names are read as ``weight/bias``. The buffers
``embeddings.position_ids``/``token_type_ids`` are not weights and are skipped;
so is the next-sentence-prediction head ``cls.seq_relationship.*`` of
``BertForPreTraining`` checkpoints, which this library does not model. Any other
tensor that is missing, unexpected or mis-shaped raises one ``CheckpointError`` (a
``ValueError``) listing them all.
"""

import re
from collections.abc import Mapping

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
from interp_transformer.families.bert.recipe import EncoderConfig
from interp_transformer.families.reference import Recorder, run_reference, split_heads

SUPPORTED_MODEL_TYPES = ("bert",)
VERIFY_PADDED = True  # verify_pretrained compares on a padded batch by default: the mask must match too
# Hugging Face hidden_act -> our act_fn ("gelu" is the exact erf GELU in both)
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
# Buffers that old checkpoints store beside the weights.
IGNORED_KEYS = re.compile(r"embeddings\.(position_ids|token_type_ids)")
# BertForPreTraining's next-sentence head: shape-checked when present, not converted.
SKIPPED_HEAD = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")


def _check_model_type(model_type) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported architecture model_type={model_type!r}: interp_transformer.families.bert.hf loads "
            f"{list(SUPPORTED_MODEL_TYPES)}"
        )


def config_from_hf(hf_config) -> EncoderConfig:
    """Our ``EncoderConfig`` from a Hugging Face ``BertConfig``.

    Raises ``ValueError`` for another architecture (listing the supported ones) and
    for BERT variants that run different math: decoders, cross-attention, relative
    position embeddings, an activation we do not implement.
    """
    _check_model_type(getattr(hf_config, "model_type", None))
    require_config_fields(
        hf_config,
        "BERT",
        positive_ints=(
            *DECODER_SHAPE_FIELDS,
            "type_vocab_size",
        ),
        positive_floats=("layer_norm_eps",),
    )
    if getattr(hf_config, "is_decoder", False) or getattr(hf_config, "add_cross_attention", False):
        raise ValueError(
            "BERT configured as a decoder (is_decoder/add_cross_attention) is not an encoder; not supported"
        )
    position_type = getattr(hf_config, "position_embedding_type", None) or "absolute"
    if position_type != "absolute":
        raise ValueError(f"position_embedding_type must be 'absolute', got {position_type!r}")
    act = hf_config.hidden_act
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {sorted(HF_ACTIVATIONS)}, got {act!r}")
    d_model, n_heads = hf_config.hidden_size, hf_config.num_attention_heads
    if d_model % n_heads:
        raise ValueError(f"hidden_size={d_model} is not divisible by num_attention_heads={n_heads}")
    return EncoderConfig(
        d_model=d_model,
        n_layers=hf_config.num_hidden_layers,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf_config.intermediate_size,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.max_position_embeddings,
        n_token_types=hf_config.type_vocab_size,
        act_fn=HF_ACTIVATIONS[act],
        layer_norm_eps=float(hf_config.layer_norm_eps),
        init_range=float(hf_config.initializer_range),
        name=str(getattr(hf_config, "name_or_path", "") or "bert"),
    )


def _body_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    d, d_mlp = cfg.d_model, cfg.d_mlp
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (cfg.d_vocab, d),
        "embeddings.position_embeddings.weight": (cfg.n_ctx, d),
        "embeddings.token_type_embeddings.weight": (cfg.n_token_types, d),
    }
    linears = {
        "attention.self.query": (d, d),
        "attention.self.key": (d, d),
        "attention.self.value": (d, d),
        "attention.output.dense": (d, d),
        "intermediate.dense": (d_mlp, d),
        "output.dense": (d, d_mlp),
    }
    layer_norms = ["embeddings.LayerNorm"]
    for layer in range(cfg.n_layers):
        prefix = f"encoder.layer.{layer}."
        for name, (out_dim, in_dim) in linears.items():
            shapes[prefix + name + ".weight"] = (out_dim, in_dim)
            shapes[prefix + name + ".bias"] = (out_dim,)
        layer_norms += [prefix + "attention.output.LayerNorm", prefix + "output.LayerNorm"]
    for name in layer_norms:
        shapes[name + ".weight"] = (d,)
        shapes[name + ".bias"] = (d,)
    return shapes


def expected_hf_shapes(
    cfg: EncoderConfig, has_pooler: bool, has_mlm_head: bool
) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """``(name -> shape, optional names)`` of a BERT checkpoint with these heads (``bert.`` prefix removed)."""
    d, d_vocab = cfg.d_model, cfg.d_vocab
    shapes = _body_shapes(cfg)
    shapes.update({"cls.seq_relationship.weight": (2, d), "cls.seq_relationship.bias": (2,)})
    optional = list(SKIPPED_HEAD)
    if has_pooler:
        shapes.update({"pooler.dense.weight": (d, d), "pooler.dense.bias": (d,)})
    if has_mlm_head:
        shapes.update(
            {
                "cls.predictions.transform.dense.weight": (d, d),
                "cls.predictions.transform.dense.bias": (d,),
                "cls.predictions.transform.LayerNorm.weight": (d,),
                "cls.predictions.transform.LayerNorm.bias": (d,),
                "cls.predictions.decoder.weight": (d_vocab, d),
                "cls.predictions.decoder.bias": (d_vocab,),
                "cls.predictions.bias": (d_vocab,),
            }
        )
        # HF saves tied tensors once: no decoder.weight means "tied to the word embeddings",
        # and the decoder's bias is stored as decoder.bias, cls.predictions.bias or both
        optional += ["cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "cls.predictions.bias"]
    return shapes, optional


def _our_name(hf_name: str) -> str:
    """HF key -> the unprefixed BERT name: strip ``bert.``, rename legacy ``gamma``/``beta``."""
    name = hf_name[len("bert.") :] if hf_name.startswith("bert.") else hf_name
    return re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name))


def _fresh(tensor: Tensor) -> Tensor:
    # a contiguous copy: our weights never alias the source's (weight processing edits them in place)
    return tensor.clone(memory_format=torch.contiguous_format)


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: EncoderConfig) -> dict[str, Tensor]:
    """Convert a Hugging Face BERT state dict into ours. Pure: the input is not changed.

    ``cfg`` fixes the body's shapes; the heads are whatever the checkpoint holds
    (``pooler.*`` -> our pooler, ``cls.predictions.*`` -> our MLM head), and
    ``config_for_weights`` sets ``cfg.has_pooler``/``has_mlm_head`` from the result. Every
    name and shape is checked before any tensor is read; each tensor is then read
    once and copied, so the result never shares memory with the input.
    """
    if not isinstance(cfg, EncoderConfig):
        raise TypeError(f"cfg must be an EncoderConfig, got {type(cfg).__name__}")
    names: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for hf_name, shape in state_dict_shapes(hf_state_dict).items():
        name = _our_name(hf_name)
        if name in names:
            raise ValueError(
                f"{names[name]!r} and {hf_name!r} both name {name!r} (with and without the 'bert.' prefix?)"
            )
        names[name], shapes[name] = hf_name, shape
    check_layer_count(shapes, r"^encoder\.layer\.(\d+)\.", cfg.n_layers, "BERT checkpoint", "num_hidden_layers")
    has_pooler = any(name.startswith("pooler.") for name in names)
    has_mlm_head = any(name.startswith("cls.predictions.") for name in names)
    expected, optional = expected_hf_shapes(cfg, has_pooler, has_mlm_head)
    if has_mlm_head and "cls.predictions.bias" not in names and "cls.predictions.decoder.bias" not in names:
        optional.remove("cls.predictions.bias")  # one of the two bias names must be there
    check_checkpoint(shapes, expected, what="BERT checkpoint", optional=optional, ignored=IGNORED_KEYS)

    def read(name: str) -> Tensor:
        return hf_state_dict[names[name]]

    per_head = {"head_index": cfg.n_heads}
    word_embeddings = read("embeddings.word_embeddings.weight")
    ours = {
        "embed.W_E": _fresh(word_embeddings),
        "pos_embed.W_pos": _fresh(read("embeddings.position_embeddings.weight")),
        "token_type_embed.W_token_type": _fresh(read("embeddings.token_type_embeddings.weight")),
        "embed_ln.w": _fresh(read("embeddings.LayerNorm.weight")),
        "embed_ln.b": _fresh(read("embeddings.LayerNorm.bias")),
    }
    for layer in range(cfg.n_layers):
        hf, our = f"encoder.layer.{layer}.", f"blocks.{layer}."
        for hf_name, letter in (("query", "Q"), ("key", "K"), ("value", "V")):
            ours[our + f"attn.W_{letter}"] = _fresh(
                einops.rearrange(
                    read(hf + f"attention.self.{hf_name}.weight"),
                    "(head_index d_head) d_model -> head_index d_model d_head",
                    **per_head,
                )
            )
            ours[our + f"attn.b_{letter}"] = _fresh(
                einops.rearrange(
                    read(hf + f"attention.self.{hf_name}.bias"), "(head_index d_head) -> head_index d_head", **per_head
                )
            )
        ours[our + "attn.W_O"] = _fresh(
            einops.rearrange(
                read(hf + "attention.output.dense.weight"),
                "d_model (head_index d_head) -> head_index d_head d_model",
                **per_head,
            )
        )
        ours[our + "attn.b_O"] = _fresh(read(hf + "attention.output.dense.bias"))
        ours[our + "ln1.w"] = _fresh(read(hf + "attention.output.LayerNorm.weight"))
        ours[our + "ln1.b"] = _fresh(read(hf + "attention.output.LayerNorm.bias"))
        ours[our + "mlp.W_in"] = _fresh(
            einops.rearrange(read(hf + "intermediate.dense.weight"), "d_mlp d_model -> d_model d_mlp")
        )
        ours[our + "mlp.b_in"] = _fresh(read(hf + "intermediate.dense.bias"))
        ours[our + "mlp.W_out"] = _fresh(
            einops.rearrange(read(hf + "output.dense.weight"), "d_model d_mlp -> d_mlp d_model")
        )
        ours[our + "mlp.b_out"] = _fresh(read(hf + "output.dense.bias"))
        ours[our + "ln2.w"] = _fresh(read(hf + "output.LayerNorm.weight"))
        ours[our + "ln2.b"] = _fresh(read(hf + "output.LayerNorm.bias"))
    transpose = "d_model_out d_model_in -> d_model_in d_model_out"
    if has_pooler:
        ours["pooler.W_pool"] = _fresh(einops.rearrange(read("pooler.dense.weight"), transpose))
        ours["pooler.b_pool"] = _fresh(read("pooler.dense.bias"))
    if has_mlm_head:
        ours["mlm_head.W_transform"] = _fresh(
            einops.rearrange(read("cls.predictions.transform.dense.weight"), transpose)
        )
        ours["mlm_head.b_transform"] = _fresh(read("cls.predictions.transform.dense.bias"))
        ours["mlm_head.ln.w"] = _fresh(read("cls.predictions.transform.LayerNorm.weight"))
        ours["mlm_head.ln.b"] = _fresh(read("cls.predictions.transform.LayerNorm.bias"))
        decoder = (
            read("cls.predictions.decoder.weight") if "cls.predictions.decoder.weight" in names else word_embeddings
        )
        ours["mlm_head.unembed.W_U"] = _fresh(einops.rearrange(decoder, "d_vocab d_model -> d_model d_vocab"))
        # HF's forward adds decoder.bias; older checkpoints store the same tensor as cls.predictions.bias
        bias_name = (
            "cls.predictions.decoder.bias" if "cls.predictions.decoder.bias" in names else "cls.predictions.bias"
        )
        ours["mlm_head.unembed.b_U"] = _fresh(read(bias_name))
    return ours


def config_for_weights(cfg: EncoderConfig, state_dict: Mapping[str, Tensor]) -> EncoderConfig:
    """``cfg`` with the heads ``state_dict`` holds: ``has_pooler`` and ``has_mlm_head`` follow its keys.

    ``loading.build_model`` calls it before building the ``EncoderTransformer`` (eval mode) on the
    meta device and loading it strictly (``strict.load_strict``): a state dict that does not fit
    raises ``CheckpointError`` listing every difference.
    """
    return cfg.replace(has_pooler="pooler.W_pool" in state_dict, has_mlm_head="mlm_head.unembed.W_U" in state_dict)


def load_hf_model(directory, *, dtype: torch.dtype = torch.float32):
    """The Hugging Face reference model of a BERT directory, eager attention (patterns visible).

    ``BertForMaskedLM`` when the checkpoint's config names it (so the MLM head is
    verified too), else ``BertModel``.
    """
    import transformers

    config = transformers.BertConfig.from_pretrained(str(directory))
    model_class = (
        transformers.BertForMaskedLM if "BertForMaskedLM" in (config.architectures or []) else transformers.BertModel
    )
    return model_class.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager").eval()


def hf_reference_activations(
    hf_model, tokens: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
) -> dict[str, Tensor]:
    """Hugging Face's activations under our hook names, read with torch forward hooks.

    Works on ``BertModel`` and ``BertFor*`` models (through ``.bert``); runs in eval mode
    with eager attention (switched temporarily if needed) to get the attention weights.
    Covers every hook of ``EncoderTransformer`` except ``attn.hook_attn_scores`` (HF adds a
    large negative number to padding keys, not ``-inf``); LayerNorm ``hook_scale`` is
    computed from HF's own LayerNorm input. Models with an MLM head (``.cls``) also give
    the head's hooks and ``"logits"``, the output our forward returns for such a model.
    """
    base = getattr(hf_model, "bert", hf_model)
    if not (hasattr(base, "embeddings") and hasattr(base, "encoder")):
        raise TypeError(f"hf_model must be a Hugging Face BertModel or BertFor* model, got {type(hf_model).__name__}")
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise TypeError(f"tokens must be an integer tensor [batch, pos], got {tokens!r:.80}")
    split = split_heads(head_index=hf_model.config.num_attention_heads)
    rec = Recorder()

    def layer_norm(module, prefix: str, *output_names: str) -> None:
        rec.norm(module, prefix + ".", centred=True)
        for name in output_names:
            rec.output(module, name)

    embeddings = base.embeddings
    rec.output(embeddings.word_embeddings, "hook_embed")
    # HF embeds positions once, [1, pos, d_model]; our hook holds them per batch row
    rec.output(embeddings.position_embeddings, "hook_pos_embed", lambda t: t.expand(tokens.shape[0], -1, -1))
    rec.output(embeddings.token_type_embeddings, "hook_token_type_embed")
    layer_norm(embeddings.LayerNorm, "embed_ln", "blocks.0.hook_resid_pre")
    for layer, hf_layer in enumerate(base.encoder.layer):
        b = f"blocks.{layer}."
        self_attn = hf_layer.attention.self
        rec.output(self_attn.query, b + "attn.hook_q", split)
        rec.output(self_attn.key, b + "attn.hook_k", split)
        rec.output(self_attn.value, b + "attn.hook_v", split)
        rec.output(self_attn, b + "attn.hook_z", split)
        rec.output(self_attn, b + "attn.hook_pattern", index=1)
        rec.output(hf_layer.attention.output.dense, b + "hook_attn_out")
        rec.input(hf_layer.attention.output.LayerNorm, b + "hook_resid_mid")
        layer_norm(hf_layer.attention.output.LayerNorm, b + "ln1")
        rec.output(hf_layer.intermediate.dense, b + "mlp.hook_pre")
        rec.output(hf_layer.intermediate, b + "mlp.hook_post")
        rec.output(hf_layer.output.dense, b + "hook_mlp_out")
        following = [f"blocks.{layer + 1}.hook_resid_pre"] if layer + 1 < len(base.encoder.layer) else []
        rec.input(hf_layer.output.LayerNorm, b + "hook_resid_post")
        layer_norm(hf_layer.output.LayerNorm, b + "ln2", b + "hook_normalized_resid_post", *following)
    has_mlm_head = hasattr(hf_model, "cls") and hasattr(hf_model.cls, "predictions")
    if has_mlm_head:
        transform = hf_model.cls.predictions.transform
        rec.output(transform.dense, "mlm_head.hook_pre")
        rec.input(transform.LayerNorm, "mlm_head.hook_post")
        layer_norm(transform.LayerNorm, "mlm_head.ln")
    inputs = {"input_ids": tokens, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
    return run_reference(hf_model, rec, inputs, attention="eager", logits=has_mlm_head)


__all__ = [
    "HF_ACTIVATIONS",
    "SUPPORTED_MODEL_TYPES",
    "config_for_weights",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
]

"""Hugging Face BART -> ``EncoderDecoderTransformer``: config, strict pure converter, reference activations.

Weight map (``model.`` prefix stripped; ``encoder`` shown, the decoder alike)::

    shared.weight [d_vocab d_model]                    -> embed.W_E   (encoder/decoder.embed_tokens: checked equal)
    encoder.embed_positions.weight [n_ctx + 2, d_model] -> encoder.pos_embed.W_pos (read at positions + 2)
    encoder.layernorm_embedding                        -> encoder.embed_ln
    encoder.layers.L.self_attn.{q,k,v,out}_proj        -> encoder.blocks.L.attn.W_Q/W_K/W_V/W_O, b_*
    encoder.layers.L.self_attn_layer_norm              -> encoder.blocks.L.ln1
    encoder.layers.L.fc1 / fc2                         -> encoder.blocks.L.mlp.W_in, b_in / W_out, b_out
    encoder.layers.L.final_layer_norm                  -> encoder.blocks.L.ln2 (decoder: ln3)
    decoder.layers.L.encoder_attn.{q,k,v,out}_proj     -> decoder.blocks.L.cross_attn.W_Q ...
    decoder.layers.L.encoder_attn_layer_norm           -> decoder.blocks.L.ln2
    lm_head.weight (else the tied shared.weight)       -> unembed.W_U (transposed)
    final_logits_bias [1, d_vocab] (else zeros)         -> unembed.b_U

``BartModel`` checkpoints (no LM head) load too: the read-out is then the tied embedding.
The same module names hold for Marian (``loading.marian``), which reuses this converter's
pieces. Anything missing, unexpected or mis-shaped raises one ``CheckpointError``.
"""

from collections.abc import Callable, Mapping

import einops
import torch
from torch import Tensor

from interp_transformer.core.strict import (
    CheckpointError,
    check_checkpoint,
    state_dict_shapes,
)
from interp_transformer.families.bart.recipe import POSITION_OFFSET, BartConfig
from interp_transformer.families.encoder_decoder_conversion import (
    attention_shapes,
    attention_weights,
    fresh,
    mlp_in,
    mlp_out,
    special_token_ids,
    strip_prefix,
)
from interp_transformer.families.reference import Recorder, run_reference, split_heads

SUPPORTED_MODEL_TYPES = ("bart",)
VERIFY_PADDED = True  # verify on a padded batch by default: the source mask must match too
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
PROJECTIONS = {"Q": "q_proj", "K": "k_proj", "V": "v_proj", "O": "out_proj"}
PREFIXES = ("model.",)
TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")  # tied to shared.weight: checked equal to it


def check_model_type(hf_config, supported: tuple[str, ...]) -> None:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in supported:
        raise ValueError(f"unsupported architecture model_type={model_type!r}: this converter loads {list(supported)}")


def common_config_fields(hf_config) -> dict:
    """The fields BART and Marian configs share, checked: one head count, one MLP width, known activation, special
    ids."""
    for encoder_key, decoder_key in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if getattr(hf_config, encoder_key) != getattr(hf_config, decoder_key):
            raise ValueError(
                f"{encoder_key}={getattr(hf_config, encoder_key)} differs from {decoder_key}="
                f"{getattr(hf_config, decoder_key)}: stacks of different widths are not supported"
            )
    act = hf_config.activation_function
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"activation_function must be one of {sorted(HF_ACTIVATIONS)}, got {act!r}")
    d_model, n_heads = hf_config.d_model, hf_config.encoder_attention_heads
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by encoder_attention_heads={n_heads}")
    special = special_token_ids(hf_config)
    return dict(
        d_model=d_model,
        n_layers=hf_config.encoder_layers,
        n_decoder_layers=hf_config.decoder_layers,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf_config.encoder_ffn_dim,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.max_position_embeddings,
        act_fn=HF_ACTIVATIONS[act],
        init_range=float(hf_config.init_std),
        scale_embedding=bool(hf_config.scale_embedding),
        name=str(getattr(hf_config, "name_or_path", "") or hf_config.model_type),
        **special,
    )


def config_from_hf(hf_config) -> BartConfig:
    """Our ``BartConfig`` from a Hugging Face ``BartConfig``; ``ValueError`` for variants we do not compute."""
    check_model_type(hf_config, SUPPORTED_MODEL_TYPES)
    return BartConfig(**common_config_fields(hf_config))


def body_shapes(cfg, positions: int, embed_ln: bool) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the encoder's and decoder's tensors in a BART-family checkpoint (prefix stripped)."""
    d, d_mlp = cfg.d_model, cfg.d_mlp
    shapes: dict[str, tuple[int, ...]] = {"shared.weight": (cfg.d_vocab, d)}
    for stack, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        shapes[f"{stack}.embed_tokens.weight"] = (cfg.d_vocab, d)
        shapes[f"{stack}.embed_positions.weight"] = (positions, d)
        norms = [f"{stack}.layernorm_embedding"] if embed_ln else []
        for layer in range(n_layers):
            p = f"{stack}.layers.{layer}."
            shapes.update(attention_shapes(p + "self_attn.", PROJECTIONS, d, bias=True))
            if stack == "decoder":
                shapes.update(attention_shapes(p + "encoder_attn.", PROJECTIONS, d, bias=True))
                norms.append(p + "encoder_attn_layer_norm")
            shapes.update(
                {
                    p + "fc1.weight": (d_mlp, d),
                    p + "fc1.bias": (d_mlp,),
                    p + "fc2.weight": (d, d_mlp),
                    p + "fc2.bias": (d,),
                }
            )
            norms += [p + "self_attn_layer_norm", p + "final_layer_norm"]
        for norm in norms:
            shapes.update({norm + ".weight": (d,), norm + ".bias": (d,)})
    shapes.update({"lm_head.weight": (cfg.d_vocab, d), "final_logits_bias": (1, cfg.d_vocab)})
    return shapes


def convert_body(
    hf_state_dict: Mapping[str, Tensor],
    cfg,
    *,
    what: str,
    positions: int,
    embed_ln: bool,
    optional: tuple[str, ...] = (),
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Check every name and shape, then convert; ``(ours, names)`` with ``names`` the stripped -> original key map."""
    names: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for hf_name, shape in state_dict_shapes(hf_state_dict).items():
        name = strip_prefix(hf_name, PREFIXES)
        if name in names:
            raise ValueError(
                f"{names[name]!r} and {hf_name!r} both name {name!r} (with and without the 'model.' prefix?)"
            )
        names[name], shapes[name] = hf_name, shape
    check_checkpoint(
        shapes,
        body_shapes(cfg, positions, embed_ln),
        what=what,
        optional=TIED + ("lm_head.weight", "final_logits_bias") + optional,
    )

    def read(name: str) -> Tensor:
        return hf_state_dict[names[name]]

    ours = {"embed.W_E": fresh(read("shared.weight"))}
    check_tied(read, [name for name in TIED if name in names], "shared.weight", what)
    for stack, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        if embed_ln:
            ours[f"{stack}.embed_ln.w"] = fresh(read(f"{stack}.layernorm_embedding.weight"))
            ours[f"{stack}.embed_ln.b"] = fresh(read(f"{stack}.layernorm_embedding.bias"))
        norms = (
            {"self_attn_layer_norm": "ln1", "final_layer_norm": "ln2"}
            if stack == "encoder"
            else {"self_attn_layer_norm": "ln1", "encoder_attn_layer_norm": "ln2", "final_layer_norm": "ln3"}
        )
        for layer in range(n_layers):
            hf, q = f"{stack}.layers.{layer}.", f"{stack}.blocks.{layer}."
            ours.update(attention_weights(read, hf + "self_attn.", q + "attn.", cfg.n_heads, PROJECTIONS, bias=True))
            if stack == "decoder":
                ours.update(
                    attention_weights(
                        read, hf + "encoder_attn.", q + "cross_attn.", cfg.n_heads, PROJECTIONS, bias=True
                    )
                )
            for hf_norm, our_norm in norms.items():
                ours[q + our_norm + ".w"] = fresh(read(hf + hf_norm + ".weight"))
                ours[q + our_norm + ".b"] = fresh(read(hf + hf_norm + ".bias"))
            ours[q + "mlp.W_in"], ours[q + "mlp.b_in"] = mlp_in(read(hf + "fc1.weight")), fresh(read(hf + "fc1.bias"))
            ours[q + "mlp.W_out"], ours[q + "mlp.b_out"] = (
                mlp_out(read(hf + "fc2.weight")),
                fresh(read(hf + "fc2.bias")),
            )
    lm_head = read("lm_head.weight") if "lm_head.weight" in names else ours["embed.W_E"]
    ours["unembed.W_U"] = fresh(einops.rearrange(lm_head, "d_vocab d_model -> d_model d_vocab"))
    W_E = ours["embed.W_E"]
    bias = read("final_logits_bias") if "final_logits_bias" in names else torch.zeros(1, cfg.d_vocab, dtype=W_E.dtype)
    ours["unembed.b_U"] = fresh(bias[0])
    return ours, names


def check_tied(read: Callable[[str], Tensor], names: list[str], source: str, what: str) -> None:
    """``CheckpointError`` unless each of ``names`` holds exactly the tensor ``source`` holds.

    The encoder and decoder token embeddings are tied to ``shared.weight`` in every checkpoint
    this model reads (one ``embed``); a checkpoint saved with ``tie_word_embeddings=False``
    holds three different tables, which Hugging Face uses and one embedding cannot express.
    """
    shared = read(source)
    for name in names:
        tensor = read(name)
        if not torch.equal(tensor, shared):
            gap = (tensor.double() - shared.double()).abs().max().item()
            raise CheckpointError(
                f"{what}: {name} differs from {source} (max |difference| {gap:.3g}); separate "
                "encoder, decoder and shared token embeddings (tie_word_embeddings=False) are not "
                "supported: one token embedding serves both stacks"
            )


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: BartConfig) -> dict[str, Tensor]:
    """Hugging Face BART state dict -> ours (see the module docstring). Pure: the input is not changed."""
    if not isinstance(cfg, BartConfig):
        raise TypeError(f"cfg must be a BartConfig, got {type(cfg).__name__}")
    ours, names = convert_body(
        hf_state_dict, cfg, what="BART checkpoint", positions=cfg.n_ctx + POSITION_OFFSET, embed_ln=True
    )
    for stack in ("encoder", "decoder"):
        ours[f"{stack}.pos_embed.W_pos"] = fresh(hf_state_dict[names[f"{stack}.embed_positions.weight"]])
    return ours


def load_hf_model(directory, *, dtype=torch.float32):
    """The Hugging Face reference of a BART directory: ``BartForConditionalGeneration``, eager attention."""
    from transformers import BartForConditionalGeneration

    return BartForConditionalGeneration.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager").eval()


def record_bart_family(recorder: Recorder, body, n_heads: int, batch: int, embed_scale: float | None) -> None:
    """Hooks on a BART-family body (BART, Marian) recording each of our hooks' values.

    ``embed_scale``: the factor the stacks multiply ``embed_tokens``'s output by (Marian),
    or None when the embedding module applies it itself (BART).
    """
    split = split_heads(head_index=n_heads)
    per_row = lambda t: t.expand(batch, -1, -1)  # noqa: E731  positions are computed once for every row

    def layer_norm(module, prefix: str, *names: str) -> None:
        recorder.norm(module, prefix + ".", centred=True)
        for name in names:
            recorder.output(module, name)

    def attention(module, prefix: str, out_name: str) -> None:
        for letter in "qkv":
            recorder.output(getattr(module, f"{letter}_proj"), prefix + f".hook_{letter}", split)
        recorder.output(module, prefix + ".hook_pattern", index=1)
        recorder.input(module.out_proj, prefix + ".hook_z", split)
        recorder.output(module, out_name)

    for stack, hf_stack in (("encoder", body.encoder), ("decoder", body.decoder)):

        def scale(t: Tensor) -> Tensor:
            return t if embed_scale is None else t * embed_scale

        recorder.output(hf_stack.embed_tokens, f"{stack}.hook_embed", scale)
        recorder.output(hf_stack.embed_positions, f"{stack}.hook_pos_embed", per_row)
        if hasattr(hf_stack, "layernorm_embedding"):
            layer_norm(hf_stack.layernorm_embedding, f"{stack}.embed_ln")
        for layer, hf_layer in enumerate(hf_stack.layers):
            b = f"{stack}.blocks.{layer}."
            recorder.input(hf_layer, b + "hook_resid_pre")
            attention(hf_layer.self_attn, b + "attn", b + "hook_attn_out")
            recorder.input(hf_layer.self_attn_layer_norm, b + "hook_resid_mid")
            layer_norm(hf_layer.self_attn_layer_norm, b + "ln1")
            if stack == "decoder":
                attention(hf_layer.encoder_attn, b + "cross_attn", b + "hook_cross_attn_out")
                recorder.input(hf_layer.encoder_attn_layer_norm, b + "hook_resid_mid_cross")
                layer_norm(hf_layer.encoder_attn_layer_norm, b + "ln2")
            recorder.output(hf_layer.fc1, b + "mlp.hook_pre")
            recorder.input(hf_layer.fc2, b + "mlp.hook_post")
            recorder.output(hf_layer.fc2, b + "hook_mlp_out")
            recorder.input(hf_layer.final_layer_norm, b + "hook_resid_post")
            layer_norm(
                hf_layer.final_layer_norm,
                b + ("ln2" if stack == "encoder" else "ln3"),
                b + "hook_normalized_resid_post",
            )


def run_seq2seq(hf_model, recorder: Recorder, tokens: Tensor, attention_mask, decoder_input) -> dict[str, Tensor]:
    """Run ``hf_model`` with ``recorder``'s hooks; our decoder default (the start token alone) when no decoder input.

    Hugging Face's eager attention of these models computes in the input's dtype: a float64 run keeps it.
    """
    if decoder_input is None:
        decoder_input = torch.full((tokens.shape[0], 1), hf_model.config.decoder_start_token_id, dtype=torch.long)
    inputs = dict(input_ids=tokens, attention_mask=attention_mask, decoder_input_ids=decoder_input, use_cache=False)
    return run_reference(hf_model, recorder, inputs, attention="eager")


def hf_reference_activations(
    hf_model, tokens: Tensor, attention_mask: Tensor | None = None, decoder_input: Tensor | None = None
) -> dict[str, Tensor]:
    """Hugging Face BART's value for each of our hooks, read with torch hooks on its modules, and ``"logits"``.

    Every hook but the attention scores (Hugging Face masks with the dtype's minimum, not
    ``-inf``); LayerNorm scales are computed from each LayerNorm's input.
    """
    body = getattr(hf_model, "model", hf_model)
    recorder = Recorder()
    record_bart_family(recorder, body, hf_model.config.encoder_attention_heads, tokens.shape[0], embed_scale=None)
    return run_seq2seq(hf_model, recorder, tokens, attention_mask, decoder_input)


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "hf_reference_activations",
    "load_hf_model",
]

"""Where the gallery's references keep what our parts and hooks hold: ``sources`` and ``hooks`` of each design.

A ``*_sources(reference)`` function maps each of our parts (``"blocks.0.attn"``) to the module of
the reference holding its weights (``load_from_modules`` reads it); a ``*_hooks(layer)`` function maps
our hooks to the submodule whose output (or ``":input"``) holds the same value.
"""

import torch
from torch import nn

from . import gallery_references as ref
from .own_model_references import AnnotatedConfig, AnnotatedLM


# --- where our parts find their weights --------------------------------------------------------------------------
def torch_layer(prefix: str, layer: nn.Module) -> dict:
    """An ``nn.TransformerEncoderLayer`` (or decoder layer) as our block's parts."""
    parts = {"attn": layer.self_attn, "ln1": layer.norm1, "ln2": layer.norm2, "mlp": (layer.linear1, layer.linear2)}
    if hasattr(layer, "multihead_attn"):
        parts.update(cross_attn=layer.multihead_attn, ln3=layer.norm3)
    return {f"{prefix}.{name}": source for name, source in parts.items()}


def nano_sources(theirs, post: bool = False) -> dict:
    h = theirs.h if post else theirs.transformer.h
    found = {
        "embed": theirs.wte if post else theirs.transformer.wte,
        "pos_embed": theirs.wpe if post else theirs.transformer.wpe,
        "unembed": theirs.lm_head,
    }
    if not post:
        found["ln_final"] = theirs.transformer.ln_f
    for layer, block in enumerate(h):
        found.update(
            {
                f"blocks.{layer}.ln1": block.ln_1,
                f"blocks.{layer}.attn": (block.attn.c_attn, block.attn.c_proj),
                f"blocks.{layer}.ln2": block.ln_2,
                f"blocks.{layer}.mlp": (block.mlp.c_fc, block.mlp.c_proj),
            }
        )
    return found


def torch_stack_sources(theirs, layers, final=None) -> dict:
    found = {
        "embed": theirs.embed,
        "pos_embed": theirs.pos,
        "unembed": theirs.head if hasattr(theirs, "head") else theirs.unembed,
    }
    if final is not None:
        found["ln_final"] = final
    for layer, module in enumerate(layers):
        found.update(torch_layer(f"blocks.{layer}", module))
    return found


def scratch_sources(theirs) -> dict:
    found = {"embed": theirs.embed, "ln_final": theirs.norm, "unembed": theirs.head}
    if theirs.pos is not None:
        found["pos_embed"] = theirs.pos
    for layer, module in enumerate(theirs.layers):
        a, mlp = module.attn, module.mlp
        found.update(
            {
                f"blocks.{layer}.ln1": module.norm1,
                f"blocks.{layer}.attn": (a.q, a.k, a.v, a.o),
                f"blocks.{layer}.ln2": module.norm2,
            }
        )
        if isinstance(mlp, ref.RouterMoE):
            found[f"blocks.{layer}.mlp"] = mlp.router
            found.update({f"blocks.{layer}.mlp.experts.{e}": expert for e, expert in enumerate(mlp.experts)})
        else:
            found[f"blocks.{layer}.mlp"] = (mlp.gate, mlp.up, mlp.down) if isinstance(mlp, ref.SwiGLU) else mlp
        if isinstance(a.score_bias, ref.ClippedRelativeBias):
            found[f"blocks.{layer}.attn.score_bias"] = a.score_bias.table
    return found


def seq2seq_sources(theirs) -> dict:
    found = {
        "embed": theirs.src_embed,
        "unembed": theirs.out,
        "encoder.ln_final": theirs.transformer.encoder.norm,
        "decoder.ln_final": theirs.transformer.decoder.norm,
    }
    if theirs.tgt_embed is not theirs.src_embed:
        found["decoder_embed"] = theirs.tgt_embed
    if theirs.pos is not None:  # one table: named once, both stacks read it
        found["encoder.pos_embed"] = theirs.pos
    for stack in ("encoder", "decoder"):
        for layer, module in enumerate(getattr(theirs.transformer, stack).layers):
            found.update(torch_layer(f"{stack}.blocks.{layer}", module))
    return found


def t5_sources(theirs) -> dict:
    found = {
        "embed": theirs.embed,
        "unembed": theirs.head,
        "encoder.rel_pos_bias": theirs.encoder_bias.table,
        "decoder.rel_pos_bias": theirs.decoder_bias.table,
        "encoder.ln_final": theirs.encoder_norm,
        "decoder.ln_final": theirs.decoder_norm,
    }
    for stack in ("encoder", "decoder"):
        for layer, module in enumerate(getattr(theirs, stack)):
            a = module.attn
            parts = {"ln1": module.norm1, "attn": (a.q, a.k, a.v, a.o), "ln2": module.norm2, "mlp": module.mlp}
            if stack == "decoder":
                c = module.cross
                parts.update(cross_attn=(c.q, c.k, c.v, c.o), ln3=module.norm3)
            found.update({f"{stack}.blocks.{layer}.{name}": source for name, source in parts.items()})
    return found


def bert_sources(theirs) -> dict:
    found = {
        "embed": theirs.word,
        "pos_embed": theirs.position,
        "token_type_embed": theirs.segment,
        "embed_ln": theirs.embed_norm,
        "mlm_head": theirs.dense,
        "mlm_head.ln": theirs.head_norm,
        "mlm_head.unembed": theirs.decoder,
    }
    for layer, module in enumerate(theirs.layers):
        found.update(torch_layer(f"blocks.{layer}", module))
    return found


def arena_sources(theirs) -> dict:
    found = {
        "embed": theirs.W_E,
        "pos_embed": theirs.W_pos,
        "ln_final": theirs.ln_final,
        "unembed.W_U": theirs.W_U,
        "unembed.b_U": theirs.b_U,
    }
    for layer, block in enumerate(theirs.blocks):
        found.update({f"blocks.{layer}.{part}": getattr(block, part) for part in ("ln1", "attn", "ln2", "mlp")})
    return found


def annotated_reference() -> nn.Module:
    theirs = AnnotatedLM(AnnotatedConfig(vocab=23, d_model=16, d_ff=32, h=4, N=2, max_len=12))
    with torch.no_grad():  # its table as stored checkpoints hold it (computed in float64, kept in float32)
        theirs.embed[1].pe.copy_(ref.sinusoid_table(12, 16, interleaved=True)[None])
    return theirs


def annotated_sources(theirs) -> dict:
    found = {"embed": theirs.embed[0].lut, "ln_final": theirs.norm, "unembed": theirs.generator.proj}
    for layer, module in enumerate(theirs.layers):
        found.update(
            {
                f"blocks.{layer}.ln1": module.sublayer[0].norm,
                f"blocks.{layer}.attn": module.self_attn.linears,
                f"blocks.{layer}.ln2": module.sublayer[1].norm,
                f"blocks.{layer}.mlp": (module.feed_forward.w_1, module.feed_forward.w_2),
            }
        )
    return found


# --- where our hooks' values lie ---------------------------------------------------------------------------------
def torch_layer_hooks(ours: str, theirs: str, post: bool, cross: bool = False) -> dict:
    found = {
        f"{ours}.hook_attn_out": f"{theirs}.self_attn",
        f"{ours}.ln1.hook_normalized": f"{theirs}.norm1",
        f"{ours}.ln2.hook_normalized": f"{theirs}.norm2",
        f"{ours}.mlp.hook_post": f"{theirs}.linear2:input",
        f"{ours}.hook_mlp_out": f"{theirs}.linear2",
        f"{ours}.hook_resid_pre": f"{theirs}:input",
    }
    if cross:
        found.update(
            {
                f"{ours}.hook_cross_attn_out": f"{theirs}.multihead_attn",
                f"{ours}.ln3.hook_normalized": f"{theirs}.norm3",
            }
        )
    found[f"{ours}.hook_normalized_resid_post" if post else f"{ours}.hook_resid_post"] = theirs
    return found


def scratch_hooks(layer: int, extra: dict | None = None) -> dict:
    ours, theirs = f"blocks.{layer}", f"layers.{layer}"
    found = {
        f"{ours}.hook_resid_pre": f"{theirs}:input",
        f"{ours}.ln1.hook_normalized": f"{theirs}.norm1",
        f"{ours}.hook_attn_out": f"{theirs}.attn",
        f"{ours}.ln2.hook_normalized": f"{theirs}.norm2",
        f"{ours}.hook_mlp_out": f"{theirs}.mlp",
        f"{ours}.hook_resid_post": theirs,
    }
    return {**found, **{f"{ours}.{k}": f"{theirs}.{v}" for k, v in (extra or {}).items()}}


def t5_hooks(layer: int) -> dict:
    found = {}
    for stack in ("encoder", "decoder"):
        ours, theirs = f"{stack}.blocks.{layer}", f"{stack}.{layer}"
        found.update(
            {
                f"{ours}.hook_resid_pre": f"{theirs}:input",
                f"{ours}.ln1.hook_normalized": f"{theirs}.norm1",
                f"{ours}.hook_attn_out": f"{theirs}.attn",
                f"{ours}.ln2.hook_normalized": f"{theirs}.norm2",
                f"{ours}.hook_mlp_out": f"{theirs}.mlp",
                f"{ours}.hook_resid_post": theirs,
            }
        )
    found.update({f"decoder.blocks.{layer}.hook_cross_attn_out": f"decoder.{layer}.cross"})
    found[f"decoder.blocks.{layer}.ln3.hook_normalized"] = f"decoder.{layer}.norm3"
    return found


def nano_hooks(layer: int, post: bool = False) -> dict:
    theirs = f"h.{layer}" if post else f"transformer.h.{layer}"
    ours = f"blocks.{layer}"
    found = {
        f"{ours}.hook_resid_pre": f"{theirs}:input",
        f"{ours}.ln1.hook_normalized": f"{theirs}.ln_1",
        f"{ours}.hook_attn_out": f"{theirs}.attn",
        f"{ours}.ln2.hook_normalized": f"{theirs}.ln_2",
        f"{ours}.mlp.hook_post": f"{theirs}.mlp.c_proj:input",
        f"{ours}.hook_mlp_out": f"{theirs}.mlp",
    }
    found[f"{ours}.hook_normalized_resid_post" if post else f"{ours}.hook_resid_post"] = theirs
    return found

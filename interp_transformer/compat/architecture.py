"""The architecture a ``HookedTransformerConfig`` builds: TransformerLens' decoder, picked from our parts.

Registered in the architecture registry like every other architecture, so
``DemoTransformer(HookedTransformerConfig(...))`` builds it and every tool reads its
capabilities and hook names; ``HookedTransformer`` (``interp_transformer.compat``) is the
``DemoTransformer`` subclass with TransformerLens' forward and methods.

=============================  ==============================================================
config                         part
=============================  ==============================================================
``normalization_type``         ``"LN"``: ``LayerNorm``; ``"LNPre"``: ``LayerNormPre``;
                               ``"RMS"``: ``RMSNorm``; ``"RMSPre"``: ``RMSNormPre``;
                               ``None``: ``NoNorm`` (the identity); ``final_rms``: an RMS final norm
``positional_embedding_type``  ``"standard"``: ``PosEmbed`` added to the residual stream;
                               ``"shortformer"``: ``PosEmbed`` added to the query and key
                               inputs only (``PreNormBlock(shortformer=True)``); ``"rotary"``:
                               ``Rotary`` inside attention (``rotary_dim``, ``rotary_base``,
                               ``rotary_adjacent_pairs``); ``"alibi"``: ``ALiBi`` as the
                               attention's score bias (``blocks.L.attn.score_bias.hook_bias``)
``n_key_value_heads``          grouped-query attention; ``use_qk_norm``: RMSNorm on q and k
``use_local_attn``,            block ``L`` attends to the last ``window_size`` keys only
``window_size``,               (``SlidingWindowMask``) where ``attn_types[L] == "local"``,
``attn_types``,                rotating with ``rotary_base_local`` there if it is given
``rotary_base_local``          (Gemma 2 and 3)
``use_normalization_``         ``PreNormBlock`` with norms after attention and the MLP too,
``before_and_after``           ``ln1_post`` and ``ln2_post`` (RMSNorm, or LayerNorm for ``"LN"``
                               and ``"LNPre"``; never folded), before ``hook_attn_out`` and
                               ``hook_mlp_out``
``attn_scores_soft_cap``,      ``cap * tanh(x / cap)`` on the attention scores (before the
``output_logits_soft_cap``     mask) and on the logits, where > 0 (``Attention``'s and ``Unembed``'s ``softcap``)
``gated_mlp``                  ``GatedMLP``
``attn_only``                  blocks without MLP
``parallel_attn_mlp``          ``ParallelBlock`` (GPT-NeoX): attention and MLP both read
                               ``resid_pre``; no ``hook_resid_mid``
``attention_dir``              ``CausalMask`` + ``PaddingMask``, or ``PaddingMask`` alone
``use_attn_result``            ``Attention(result_hook=True)`` (adds ``hook_result``)
``use_split_qkv_input``,       ``PreNormBlock`` with ``hook_q_input``/``k_input``/``v_input``,
``use_attn_in``,               ``hook_attn_in``, ``hook_mlp_in``
``use_hook_mlp_in``
``attn_scale``,                the attention's scale ``1 / attn_scale`` (1 without
``use_attn_scale``             ``use_attn_scale``), divided by ``layer + 1`` with
                               ``scale_attn_by_inverse_layer_idx``
``d_vocab_out``                the unembedding's width (``Unembed(in_out_hooks=True)``: ``unembed.hook_in``,
                               ``unembed.hook_out``, as in TransformerLens 3)
=============================  ==============================================================
"""

from types import SimpleNamespace
from typing import Any

from interp_transformer.compat.config import HookedTransformerConfig
from interp_transformer.compat.errors import CompatValueError
from interp_transformer.compat.parts import PositionalEmbedding
from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families import Architecture, DecoderParts, register
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames
from interp_transformer.parts import (
    MLP,
    Attention,
    CausalMask,
    Embed,
    GatedMLP,
    LayerNorm,
    LayerNormPre,
    NoNorm,
    PaddingMask,
    ParallelBlock,
    PreNormBlock,
    RMSNorm,
    RMSNormPre,
    Rotary,
    SlidingWindowMask,
    Unembed,
)
from interp_transformer.parts.activations import ACTIVATIONS
from interp_transformer.parts.alibi import ALiBi

# hook points that only the opt-in parts add (TransformerLens' use_split_qkv_input, use_attn_in, use_hook_mlp_in)
TOGGLE_HOOKS = {
    "q_input": "blocks.{layer}.hook_q_input",
    "k_input": "blocks.{layer}.hook_k_input",
    "v_input": "blocks.{layer}.hook_v_input",
    "attn_in": "blocks.{layer}.hook_attn_in",
    "mlp_in": "blocks.{layer}.hook_mlp_in",
}

# (field, value it must keep, what it would need)
UNSUPPORTED = (
    ("post_embedding_ln", False, "a norm after the embeddings"),
    ("num_experts", None, "a mixture-of-experts MLP"),
    ("ungroup_grouped_query_attention", False, "keys and values repeated per query head in the hooks"),
    ("load_in_4bit", False, "4-bit weights"),
    ("n_devices", 1, "layers spread over several devices"),
)
NORMS = {"LN": LayerNorm, "LNPre": LayerNormPre, "RMS": RMSNorm, "RMSPre": RMSNormPre}


def check_supported(cfg: HookedTransformerConfig) -> None:
    """``ValueError`` naming every field of ``cfg`` that asks for math this library does not compute (yet)."""
    problems = [
        f"{field}={getattr(cfg, field)!r} ({needs})"
        for field, keep, needs in UNSUPPORTED
        if getattr(cfg, field) != keep
    ]
    if cfg.parallel_attn_mlp and (cfg.attn_only or any(block_flags(cfg).values())):
        problems.append(
            "parallel_attn_mlp=True with attn_only, shortformer positions or the hook toggles (a parallel block "
            "has the plain block's hooks only)"
        )
    if cfg.final_rms and cfg.normalization_type is None:
        problems.append("final_rms=True with normalization_type=None (final_rms names the kind of the final norm)")
    problems.extend(_local_attention_problems(cfg))
    if cfg.use_normalization_before_and_after and (cfg.attn_only or cfg.parallel_attn_mlp):
        problems.append(
            "use_normalization_before_and_after=True with attn_only or parallel_attn_mlp (norms after the "
            "sublayers exist here for a block with attention then an MLP)"
        )
    if cfg.n_key_value_heads is not None and (cfg.n_key_value_heads <= 0 or cfg.n_heads % cfg.n_key_value_heads):
        problems.append(f"n_key_value_heads={cfg.n_key_value_heads} (must divide n_heads={cfg.n_heads})")
    rotary_dim = cfg.rotary_dim  # set by the config for rotary positions
    if (
        cfg.positional_embedding_type == "rotary"
        and rotary_dim is not None
        and (rotary_dim % 2 or rotary_dim > cfg.d_head)
    ):
        problems.append(f"rotary_dim={cfg.rotary_dim} (an even number of dimensions, at most d_head={cfg.d_head})")
    if not cfg.attn_only and cfg.act_fn not in ACTIVATIONS:
        problems.append(
            f"act_fn={cfg.act_fn!r} (an MLP with this activation; solu_ln and gelu_ln also need the MLP's own "
            f"LayerNorm; supported: {sorted(ACTIVATIONS)})"
        )
    if cfg.d_vocab <= 0:
        problems.append(f"d_vocab={cfg.d_vocab} (give d_vocab, or a tokenizer to take it from)")
    if problems:
        raise CompatValueError(
            "this HookedTransformerConfig asks for what interp_transformer does not compute: " + "; ".join(problems)
        )


def _local_attention_problems(cfg: HookedTransformerConfig) -> list[str]:
    """What is wrong with ``cfg``'s local attention fields, in words (empty when it has none, or they are right)."""
    if not cfg.use_local_attn:
        return []
    problems = []
    if cfg.attention_dir != "causal":
        problems.append("use_local_attn=True with attention_dir='bidirectional' (local windows look back only)")
    window = cfg.window_size
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        problems.append(f"window_size={window!r} (local attention needs a positive int)")
    types = list(cfg.attn_types or [])
    unknown = sorted({str(kind) for kind in types} - {"global", "local"})
    if len(types) < cfg.n_layers or unknown:
        problems.append(
            f"attn_types={cfg.attn_types!r} (one of 'global' or 'local' for each of the n_layers={cfg.n_layers} blocks)"
        )
    return problems


def _is_local(cfg: HookedTransformerConfig, layer: int) -> bool:
    # attn_types is set whenever use_local_attn is (the config refuses it otherwise)
    return cfg.use_local_attn and cfg.attn_types is not None and cfg.attn_types[layer] == "local"


def _norm(cfg: HookedTransformerConfig, final: bool = False):
    kind = cfg.normalization_type
    # TransformerLens' SoLU models: LayerNorm blocks, an RMSNorm final norm
    if final and cfg.final_rms and kind is not None:
        kind = {"LN": "RMS", "LNPre": "RMSPre"}.get(kind, kind)
    return NORMS[kind](cfg.d_model, cfg.eps) if kind is not None else NoNorm()


def _post_norm(cfg: HookedTransformerConfig):
    """A norm after a sublayer: never folded, so the kind with its weights (``RMSPre`` -> ``RMSNorm``)."""
    kind = cfg.normalization_type
    return NORMS[kind.removesuffix("Pre")](cfg.d_model, cfg.eps) if kind is not None else NoNorm()


def _attention(cfg: HookedTransformerConfig, layer: int):
    local = _is_local(cfg, layer)
    # window_size is set whenever local attention is (the config refuses it otherwise)
    first = SlidingWindowMask(cfg.window_size) if local and cfg.window_size is not None else CausalMask()
    masks = (first, PaddingMask()) if cfg.attention_dir == "causal" else (PaddingMask(),)
    scale = 1.0 / cfg.attn_scale if cfg.use_attn_scale else 1.0
    if cfg.scale_attn_by_inverse_layer_idx:
        scale = scale / (layer + 1)
    parts: dict[str, Any] = {}  # the optional parts, each a module or (softcap) a number
    if cfg.positional_embedding_type == "rotary":
        base = cfg.rotary_base_local if local and cfg.rotary_base_local is not None else cfg.rotary_base
        parts["rotary"] = Rotary(
            cfg.d_head, rotary_dim=cfg.rotary_dim, base=base, interleaved=cfg.rotary_adjacent_pairs
        )
    if cfg.positional_embedding_type == "alibi":
        parts["score_bias"] = ALiBi(cfg.n_heads)
    if cfg.use_qk_norm:
        parts.update(q_norm=RMSNorm(cfg.d_head, cfg.eps), k_norm=RMSNorm(cfg.d_head, cfg.eps))
    if cfg.attn_scores_soft_cap > 0:
        parts["softcap"] = cfg.attn_scores_soft_cap
    return Attention(
        cfg,
        masks,
        scale=scale,
        n_key_value_heads=cfg.n_key_value_heads,
        split_inputs=True,
        result_hook=bool(cfg.use_attn_result),
        **parts,
    )


def block_flags(cfg: HookedTransformerConfig) -> dict:
    """The input hooks and positions ``cfg`` asks of a ``PreNormBlock`` (``attn_in=``, ...)."""
    return dict(
        attn_in=cfg.use_attn_in,
        split_qkv_input=cfg.use_split_qkv_input,
        mlp_in=cfg.use_hook_mlp_in and not cfg.attn_only,
        shortformer=cfg.positional_embedding_type == "shortformer",
    )


def build_block(cfg: HookedTransformerConfig, layer: int):
    """One block: a ``PreNormBlock`` with the input hooks, positions and post norms ``cfg`` asks for, or a
    ``ParallelBlock``."""
    ln1, attn = _norm(cfg), _attention(cfg, layer)
    ln2, mlp = (None, None) if cfg.attn_only else (_norm(cfg), GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg))
    flags = block_flags(cfg)
    post = dict(ln1_post=_post_norm(cfg), ln2_post=_post_norm(cfg)) if cfg.use_normalization_before_and_after else {}
    if cfg.parallel_attn_mlp:
        return ParallelBlock(ln1, attn, ln2, mlp)  # type: ignore[arg-type]  # attn_only: no MLP, as before
    return PreNormBlock(ln1, attn, ln2, mlp, **flags, **post)


def build(cfg: HookedTransformerConfig) -> DecoderParts:
    """TransformerLens' decoder from our parts (see the module docstring)."""
    check_supported(cfg)
    return DecoderParts(
        embed=Embed(cfg),
        pos_embed=PositionalEmbedding(cfg) if cfg.positional_embedding_type in ("standard", "shortformer") else None,
        blocks=[build_block(cfg, layer) for layer in range(cfg.n_layers)],
        ln_final=_norm(cfg, final=True),
        unembed=_unembed(cfg),
    )


def _unembed(cfg: HookedTransformerConfig):
    shape = SimpleNamespace(d_model=cfg.d_model, d_vocab=cfg.d_vocab_out)
    softcap = cfg.output_logits_soft_cap if cfg.output_logits_soft_cap > 0 else None
    return Unembed(shape, softcap, in_out_hooks=True)


def capabilities(cfg: HookedTransformerConfig) -> Capabilities:
    # without a norm (normalization_type=None) the final "norm" is the identity: logits stay linear in the residual
    return Capabilities(
        causal=cfg.attention_dir == "causal",
        norm_placement="pre",
        final_norm="ln_final",
        read_out="unembed",
        next_token_logits=cfg.attention_dir == "causal",
    )


def hook_names(cfg: HookedTransformerConfig) -> HookNames:
    """The hook-name table of a model built from ``cfg``: the blocks', the toggles', and what ``cfg`` puts at the
    top."""
    global_keys = {"embed": "hook_embed"}
    if cfg.positional_embedding_type in ("standard", "shortformer"):
        global_keys["pos_embed"] = "hook_pos_embed"
    if cfg.normalization_type is not None:
        global_keys.update(scale="ln_final.hook_scale", normalized="ln_final.hook_normalized")
    writers = ("embed", "pos_embed") if cfg.positional_embedding_type == "standard" else ("embed",)
    layer_keys = {**BLOCK_HOOKS, **TOGGLE_HOOKS}
    if cfg.positional_embedding_type == "alibi":
        layer_keys["alibi"] = "blocks.{layer}.attn.score_bias.hook_bias"
    if cfg.positional_embedding_type == "rotary":
        layer_keys.update(rot_q="blocks.{layer}.attn.hook_rot_q", rot_k="blocks.{layer}.attn.hook_rot_k")
    if cfg.gated_mlp:
        layer_keys["pre_linear"] = "blocks.{layer}.mlp.hook_pre_linear"
    if cfg.attn_scores_soft_cap > 0:
        layer_keys["attn_scores_uncapped"] = "blocks.{layer}.attn.hook_attn_scores_uncapped"
    if cfg.output_logits_soft_cap > 0:
        global_keys["logits_uncapped"] = "unembed.hook_logits_uncapped"
    sublayers = ("ln1", "ln2", "ln1_post", "ln2_post") if cfg.use_normalization_before_and_after else ("ln1", "ln2")
    return HookNames(layer_keys=layer_keys, global_keys=global_keys, sublayers=sublayers, input_writers=writers)


ARCHITECTURE = register(
    Architecture(
        name="transformerlens",
        config_class=HookedTransformerConfig,
        build=build,
        capabilities=capabilities,
        hook_names=hook_names,
    )
)

__all__ = ["ARCHITECTURE", "TOGGLE_HOOKS", "block_flags", "build", "build_block", "check_supported"]

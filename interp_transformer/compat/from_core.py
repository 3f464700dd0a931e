"""A ``HookedTransformer`` from a model of this library: its ``HookedTransformerConfig`` and its weights.

``config_from_core(core.cfg, ...)`` says, in TransformerLens' fields, the decoder a loaded
model's config describes: GPT-2, Llama, GPT-NeoX (Pythia), pre-norm OPT and Gemma 1, 2, 3
(the fields TransformerLens' own Gemma configs set: ``normalization_type="RMS"``,
``final_rms``, rotary positions with ``rotary_base_local``, ``use_normalization_before_and_after``,
``use_qk_norm``, ``use_local_attn`` with ``window_size`` and ``attn_types``, the soft-caps,
``attn_scale = sqrt(query_pre_attn_scalar)``). What a ``HookedTransformerConfig`` cannot say
is refused by name (``CompatValueError``): rope scaling, Llama's sliding windows, OLMo's
norms after the sublayers only, mixtures of experts, ...

``state_dict_from_core(core, model)`` reads ``model``'s weights from ``core``'s parts, each
parameter the same-named attribute of the same-named part, so a part that stores its
weights differently answers for itself: Gemma's norms give their gain ``w = 1 + w_offset``,
Gemma's scaled embedding gives what each token writes, ``W_E * sqrt(d_model)``, rounded as the
checkpoint runs it (``writes()``). These are the weights TransformerLens' Gemma holds.
"""

import math

from torch import Tensor, nn

from interp_transformer.compat.config import HookedTransformerConfig
from interp_transformer.compat.errors import CompatValueError

# why a HookedTransformerConfig cannot describe a family's models (the config class's name -> the reason)
NOT_DESCRIBED = {
    "Olmo2Config": "its blocks normalize the outputs of attention and the MLP only, with no norm before them "
    "(TransformerLens' blocks always normalize their inputs)",
    "MoEConfig": "its MLPs are mixtures of experts",
    "GptOssConfig": "its MLPs are mixtures of experts and its attention has sinks",
    "OPTPostNormConfig": "its blocks normalize after each sublayer (post-norm)",
}
# the Hugging Face class each Gemma generation loads as (TransformerLens' original_architecture)
GEMMA_ARCHITECTURES = {1: "GemmaForCausalLM", 2: "Gemma2ForCausalLM", 3: "Gemma3ForCausalLM"}


def config_from_core(core_cfg, name: str, default_prepend_bos: bool | None) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of a loaded model's config (see the module docstring)."""
    from interp_transformer.families.gemma.recipe import GemmaConfig
    from interp_transformer.families.gpt2.recipe import TransformerConfig
    from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
    from interp_transformer.families.llama.recipe import LlamaConfig
    from interp_transformer.families.opt.recipe import OPTConfig

    common = dict(
        d_model=core_cfg.d_model,
        d_head=core_cfg.d_head,
        n_layers=core_cfg.n_layers,
        n_ctx=core_cfg.n_ctx,
        n_heads=core_cfg.n_heads,
        d_vocab=core_cfg.d_vocab,
        act_fn=core_cfg.act_fn,
        model_name=name,
        default_prepend_bos=True if default_prepend_bos is None else default_prepend_bos,
        init_weights=False,
    )
    if type(core_cfg) is TransformerConfig:  # a subclass (an adapter) holds parts this config cannot say
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp if core_cfg.d_mlp is not None else 4 * core_cfg.d_model,
            attn_only=core_cfg.d_mlp is None,
            eps=core_cfg.layer_norm_eps,
            normalization_type="LN",
            positional_embedding_type="standard",
            original_architecture="GPT2LMHeadModel",
            tokenizer_name=name if name == "distilgpt2" or name.startswith("gpt2") else None,
        )
    if type(core_cfg) is LlamaConfig:  # a subclass (SmolLM3's NoPE and sliding layers) says more than this config can
        if core_cfg.sliding_window is not None or core_cfg.rope_scaling is not None:
            raise CompatValueError(
                "HookedTransformer has no sliding-window attention or rope scaling for Llama models (TransformerLens' "
                "config cannot say them): load this checkpoint with interp_transformer.from_pretrained"
            )
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp,
            eps=core_cfg.rms_norm_eps,
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_base=core_cfg.rotary_base,
            rotary_dim=core_cfg.d_head,
            n_key_value_heads=core_cfg.n_key_value_heads if core_cfg.n_key_value_heads != core_cfg.n_heads else None,
            gated_mlp=True,
            use_qk_norm=core_cfg.qk_norm,
            original_architecture="LlamaForCausalLM",
        )
    if type(core_cfg) is GemmaConfig:
        return gemma_config(core_cfg, common)
    if isinstance(core_cfg, GPTNeoXConfig):
        if core_cfg.rope_scaling is not None:
            raise CompatValueError(
                "HookedTransformer has no rope scaling (TransformerLens' config cannot say it): load this "
                "checkpoint with interp_transformer.from_pretrained"
            )
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp,
            eps=core_cfg.layer_norm_eps,
            normalization_type="LN",
            positional_embedding_type="rotary",
            rotary_dim=core_cfg.rotary_dim,
            rotary_base=core_cfg.rotary_base,
            parallel_attn_mlp=core_cfg.parallel_residual,
            original_architecture="GPTNeoXForCausalLM",
        )
    if isinstance(core_cfg, OPTConfig) and core_cfg.final_norm:
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp,
            eps=core_cfg.layer_norm_eps,
            normalization_type="LN",
            positional_embedding_type="standard",
            original_architecture="OPTForCausalLM",
        )
    kind = type(core_cfg).__name__
    reason = f" (no HookedTransformerConfig says its parts: {NOT_DESCRIBED[kind]})" if kind in NOT_DESCRIBED else ""
    raise CompatValueError(
        "HookedTransformer holds the decoders a HookedTransformerConfig describes (GPT-2, Llama, GPT-NeoX, pre-norm "
        f"OPT and Gemma 1/2/3 families); this checkpoint is a {kind} model: load it with "
        f"interp_transformer.from_pretrained{reason}"
    )


def gemma_config(core_cfg, common: dict) -> HookedTransformerConfig:
    """TransformerLens' config of a Gemma 1, 2 or 3 model (``architectures.gemma.GemmaConfig``)."""
    if core_cfg.rope_scaling is not None:
        raise CompatValueError(
            f"HookedTransformer has no rope scaling (rope_scaling={core_cfg.rope_scaling!r}; TransformerLens' config "
            "cannot say it): load this checkpoint with interp_transformer.from_pretrained"
        )
    local = core_cfg.sliding_window is not None
    scalar = core_cfg.d_head if core_cfg.query_pre_attn_scalar is None else core_cfg.query_pre_attn_scalar
    generation = 3 if core_cfg.qk_norm else 2 if core_cfg.post_norms else 1
    return HookedTransformerConfig(
        **common,
        d_mlp=core_cfg.d_mlp,
        eps=core_cfg.rms_norm_eps,
        normalization_type="RMS",
        final_rms=True,
        positional_embedding_type="rotary",
        rotary_dim=core_cfg.d_head,
        rotary_base=core_cfg.rotary_base,
        rotary_base_local=core_cfg.rotary_base_local,
        rotary_adjacent_pairs=False,
        n_key_value_heads=core_cfg.n_key_value_heads,
        gated_mlp=True,
        use_qk_norm=core_cfg.qk_norm,
        use_normalization_before_and_after=core_cfg.post_norms,
        use_attn_scale=True,
        attn_scale=math.sqrt(scalar),
        attn_scores_soft_cap=-1.0 if core_cfg.attn_softcap is None else core_cfg.attn_softcap,
        output_logits_soft_cap=-1.0 if core_cfg.final_softcap is None else core_cfg.final_softcap,
        use_local_attn=local,
        window_size=core_cfg.sliding_window if local else None,
        attn_types=["local" if core_cfg.is_sliding(layer) else "global" for layer in range(core_cfg.n_layers)]
        if local
        else None,
        initializer_range=core_cfg.init_range,
        original_architecture=GEMMA_ARCHITECTURES[generation],
    )


def state_dict_from_core(core: nn.Module, model: nn.Module, copy: bool) -> dict[str, Tensor]:
    """``model``'s weights read from ``core``'s parts (see the module docstring); ``copy``: share no memory with core.

    Strict both ways: each part of ``core`` holding parameters must have a counterpart in
    ``model`` holding as many, and each of ``model``'s parameters must be an attribute of
    its counterpart (``CompatValueError`` naming what is not), so no weight is dropped.
    """
    ours, theirs = _parameter_counts(model), _parameter_counts(core)
    differ = sorted(
        path or "(the model itself)" for path in set(ours) | set(theirs) if ours.get(path) != theirs.get(path)
    )
    if differ:
        raise CompatValueError(
            f"the HookedTransformer would not hold every weight of this {type(core.cfg).__name__} model: these parts "
            f"hold different numbers of parameters in the two ({differ})"
        )
    weights = {}
    for name in model.state_dict():
        path, _, attribute = name.rpartition(".")
        part = core.get_submodule(path)
        if attribute == "W_E" and (writes := getattr(part, "writes", None)) is not None:
            value = writes()  # what each token writes to the residual stream (Gemma: W_E * sqrt(d_model))
        elif isinstance(getattr(part, attribute, None), Tensor):
            value = getattr(part, attribute)
        else:
            raise CompatValueError(f"{type(part).__name__} at {path or 'the model'} has no weight {attribute!r}")
        weights[name] = value.detach().clone() if copy else value.detach()
    return weights


def _parameter_counts(model: nn.Module) -> dict[str, int]:
    """Each part holding parameters itself -> how many (its submodules' not counted)."""
    counts = {}
    for path, module in model.named_modules():
        count = len(list(module.parameters(recurse=False)))
        if count:
            counts[path] = count
    return counts


__all__ = ["NOT_DESCRIBED", "config_from_core", "gemma_config", "state_dict_from_core"]

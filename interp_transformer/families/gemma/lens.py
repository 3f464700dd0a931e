"""Gemma's TransformerLens mapping: the ``HookedTransformerConfig`` fields of a Gemma 1, 2 or 3 config beyond the common
ones (``compat.from_core``), the fields TransformerLens' own Gemma configs set: ``normalization_type="RMS"``,
``final_rms``, rotary positions with ``rotary_base_local``, ``use_normalization_before_and_after``, ``use_qk_norm``,
``use_local_attn`` with ``window_size`` and ``attn_types``, the soft-caps, ``attn_scale = sqrt(query_pre_attn_scalar)``.
"""

import math

from interp_transformer.core.errors import CompatValueError

# the Hugging Face class each Gemma generation loads as (TransformerLens' original_architecture)
GEMMA_ARCHITECTURES = {1: "GemmaForCausalLM", 2: "Gemma2ForCausalLM", 3: "Gemma3ForCausalLM"}


def hooked_config(core_cfg, common: dict) -> dict:
    """TransformerLens' fields of a Gemma 1, 2 or 3 model (``families.gemma.recipe.GemmaConfig``)."""
    if core_cfg.rope_scaling is not None:
        raise CompatValueError(
            f"HookedTransformer has no rope scaling (rope_scaling={core_cfg.rope_scaling!r}; TransformerLens' config "
            "cannot say it): load this checkpoint with interp_transformer.from_pretrained"
        )
    local = core_cfg.sliding_window is not None
    scalar = core_cfg.d_head if core_cfg.query_pre_attn_scalar is None else core_cfg.query_pre_attn_scalar
    generation = 3 if core_cfg.qk_norm else 2 if core_cfg.post_norms else 1
    return dict(
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


__all__ = ["GEMMA_ARCHITECTURES", "hooked_config"]

"""Llama's TransformerLens mapping: the ``HookedTransformerConfig`` fields of a ``LlamaConfig`` beyond the common ones
(``compat.from_core``); sliding windows and rope scaling are refused by name.
"""

from interp_transformer.core.errors import CompatValueError


def hooked_config(core_cfg, common: dict) -> dict:
    """TransformerLens' fields of a Llama config: RMSNorm, rotary, grouped-query heads, gated MLP, q/k norms."""
    if core_cfg.sliding_window is not None or core_cfg.rope_scaling is not None:
        raise CompatValueError(
            "HookedTransformer has no sliding-window attention or rope scaling for Llama models (TransformerLens' "
            "config cannot say them): load this checkpoint with interp_transformer.from_pretrained"
        )
    return dict(
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


__all__ = ["hooked_config"]

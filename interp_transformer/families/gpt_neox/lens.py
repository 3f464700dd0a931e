"""GPT-NeoX's (Pythia's) TransformerLens mapping: the ``HookedTransformerConfig`` fields of a ``GPTNeoXConfig`` beyond
the common ones (``compat.from_core``); rope scaling is refused by name.
"""

from interp_transformer.core.errors import CompatValueError


def hooked_config(core_cfg, common: dict) -> dict:
    """TransformerLens' fields of a GPT-NeoX config: LayerNorm, partial rotary, parallel attention and MLP."""
    if core_cfg.rope_scaling is not None:
        raise CompatValueError(
            "HookedTransformer has no rope scaling (TransformerLens' config cannot say it): load this "
            "checkpoint with interp_transformer.from_pretrained"
        )
    return dict(
        d_mlp=core_cfg.d_mlp,
        eps=core_cfg.layer_norm_eps,
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=core_cfg.rotary_dim,
        rotary_base=core_cfg.rotary_base,
        parallel_attn_mlp=core_cfg.parallel_residual,
        original_architecture="GPTNeoXForCausalLM",
    )


__all__ = ["hooked_config"]

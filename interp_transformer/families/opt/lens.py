"""OPT's TransformerLens mapping: the ``HookedTransformerConfig`` fields of a pre-norm ``OPTConfig`` beyond the common
ones (``compat.from_core``); the post-norm OPT-350m is refused by its register line.
"""


def hooked_config(core_cfg, common: dict) -> dict | None:
    """TransformerLens' fields of a pre-norm OPT config (LayerNorm, learned positions); None without a final norm."""
    if not core_cfg.final_norm:
        return None
    return dict(
        d_mlp=core_cfg.d_mlp,
        eps=core_cfg.layer_norm_eps,
        normalization_type="LN",
        positional_embedding_type="standard",
        original_architecture="OPTForCausalLM",
    )


__all__ = ["hooked_config"]

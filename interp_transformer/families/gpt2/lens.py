"""GPT-2's TransformerLens mapping: the ``HookedTransformerConfig`` fields of a ``TransformerConfig`` beyond the common
ones (``compat.from_core``).
"""


def hooked_config(core_cfg, common: dict) -> dict:
    """TransformerLens' fields of a GPT-2 config: LayerNorm, learned positions, ``attn_only`` when there is no MLP."""
    name = common["model_name"]
    return dict(
        d_mlp=core_cfg.d_mlp if core_cfg.d_mlp is not None else 4 * core_cfg.d_model,
        attn_only=core_cfg.d_mlp is None,
        eps=core_cfg.layer_norm_eps,
        normalization_type="LN",
        positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel",
        tokenizer_name=name if name == "distilgpt2" or name.startswith("gpt2") else None,
    )


__all__ = ["hooked_config"]

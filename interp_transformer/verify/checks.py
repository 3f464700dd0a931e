"""What verification compares: the hooks a processing step changes, the real positions of a padded batch, and
inputs both models can take (one vocabulary), checked before either model runs. Used by ``verify``."""

from torch import Tensor

from interp_transformer.models.processing import CENTERED_BY_CENTER_WRITING_WEIGHTS

# Hooks whose values a processing step changes on purpose: the hook's last name component, or its last two
# (fold_ln resets the residual-stream norms ln1, ln2 and ln_final, not an attention's q/k norms).
CHANGED_BY_PROCESSING = {
    "fold_ln": {"ln1.hook_normalized", "ln2.hook_normalized", "ln_final.hook_normalized"},
    "center_writing_weights": set(CENTERED_BY_CENTER_WRITING_WEIGHTS),
    "fold_value_biases": {"hook_v", "hook_z"},
    "center_unembed": set(),  # logits shift by a constant per position: log-probs are compared instead
}
QUERY_AXIS_HOOKS = ("hook_pattern", "hook_attn_scores")  # [batch, head_index, query_pos, key_pos]


def skipped_hooks(names: list[str], processing: list[str]) -> set[str]:
    unknown = [step for step in processing if step not in CHANGED_BY_PROCESSING]
    if unknown:  # a step we know nothing about may change anything: keep only the output
        return {name for name in names if name != "logits"}
    changed = set().union(*(CHANGED_BY_PROCESSING[step] for step in processing)) if processing else set()
    return {
        name for name in names if name.rsplit(".", 1)[-1] in changed or ".".join(name.rsplit(".", 2)[-2:]) in changed
    }


def real_part(name: str, value: Tensor, is_real: Tensor | None) -> Tensor:
    """``value`` at real positions only: ``[n_real, ...]`` (query rows for attention patterns)."""
    if is_real is None:
        return value
    axis = 2 if name.rsplit(".", 1)[-1] in QUERY_AXIS_HOOKS else 1
    if value.ndim <= axis or value.shape[0] != is_real.shape[0] or value.shape[axis] != is_real.shape[1]:
        return value  # not indexed by position (none of today's hooks): compare it whole
    return value.movedim(axis, 1)[is_real.to(value.device)]


def hf_vocabulary_size(hf_model) -> int | None:
    """Rows of the Hugging Face model's input embedding (``get_input_embeddings()``), else ``config.vocab_size``."""
    get_embeddings = getattr(hf_model, "get_input_embeddings", None)
    try:
        weight = getattr(get_embeddings(), "weight", None) if callable(get_embeddings) else None
    except (NotImplementedError, AttributeError):
        weight = None
    if isinstance(weight, Tensor) and weight.ndim == 2:
        return int(weight.shape[0])
    size = getattr(getattr(hf_model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def check_vocabularies(model, hf_model, tokens: Tensor) -> None:
    """``ValueError`` unless both models have one vocabulary size and every token id lies in it.

    Checked before either model runs: an id past the Hugging Face embedding would otherwise raise
    ``IndexError`` inside it.
    """
    ours = getattr(getattr(model, "cfg", None), "d_vocab", None)
    theirs = hf_vocabulary_size(hf_model)
    if isinstance(ours, int) and theirs is not None and ours != theirs:
        raise ValueError(
            f"the Hugging Face model's vocabulary has {theirs} tokens, the model's has {ours} "
            "(cfg.d_vocab): they are not the same model; verify a model against the checkpoint it was converted from"
        )
    if tokens.is_meta or not tokens.numel():
        return
    low, high = int(tokens.min()), int(tokens.max())
    vocabularies = (("the model's vocabulary (cfg.d_vocab)", ours), ("the Hugging Face model's vocabulary", theirs))
    for what, size in vocabularies:
        if isinstance(size, int) and (low < 0 or high >= size):
            raise ValueError(
                f"tokens hold the id {low if low < 0 else high}, outside {what} of {size} tokens: "
                f"token ids must lie in [0, {size})"
            )


__all__ = [
    "CHANGED_BY_PROCESSING",
    "QUERY_AXIS_HOOKS",
    "check_vocabularies",
    "hf_vocabulary_size",
    "real_part",
    "skipped_hooks",
]

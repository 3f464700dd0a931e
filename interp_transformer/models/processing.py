"""Weight processing: explicit, opt-in rewrites of the weights that leave the model's output unchanged.

A loaded model holds Hugging Face-faithful weights. These functions rewrite
them into forms that are easier to read, without changing what the model
computes. Each works in place, returns the model, and appends its name to
``model.processing`` (once: calling it again does nothing), so caches and
verification reports can say which steps were applied.

Which weights read a norm and which write to the residual stream is what the parts
declare (``block.norm_readers()``, ``part.input_weights()``, ``part.output_weights()``);
the algebra of each norm is the norm's own (``fold_into``, ``removes_mean``). Processing
rests on pre-norm algebra, so a post-norm model (``capabilities.norm_placement``) is refused.

``fold_ln``
    Folds each norm's ``w`` and ``b`` into the part that reads it: for
    ``ln1`` into ``W_Q/W_K/W_V`` and ``b_Q/b_K/b_V``, for ``ln2`` into ``W_in``
    and ``b_in``, for ``ln_final`` into ``W_U`` and ``b_U``:
    ``W' = diag(w) W``, ``b' = b_next + b W``. The norm keeps its ``w``/``b``
    parameters, set to 1 and 0. Since ``hook_normalized`` is taken after ``w`` and
    ``b``, after folding it holds the pure normalization ``(x - mean(x)) / scale``.
    With ``center_weights`` (default: when every norm subtracts the mean) the folded
    reading weights also have their mean over ``d_model`` removed, which changes
    nothing: they only ever read vectors of zero mean. An RMSNorm has no ``b`` and
    folds ``w`` alone (into a gated MLP's ``W_gate`` too, which has no bias: a norm
    with a non-zero bias cannot be folded there and is refused); it does not subtract
    the mean, so ``center_weights=True`` is refused.
``center_writing_weights``
    Removes the mean over ``d_model`` from every weight that writes to the
    residual stream (``W_E``, ``W_pos``, ``W_O``, ``b_O``, ``W_out``, ``b_out``). Every
    reader of the residual stream starts with a LayerNorm, which removes that mean
    anyway, so nothing downstream changes; afterwards every ``hook_resid_*``
    (and ``hook_embed``, ``hook_pos_embed``, ``hook_attn_out``, ``hook_mlp_out``)
    has zero mean over ``d_model``, except the mean of a writer with no weight to
    centre (``output_weights()`` empty: BLOOM's normalized embedding, fixed sinusoidal
    positions), which stays in the stream and is removed by every norm reading it. Refused where a norm keeps the mean
    (RMSNorm):
    there the mean reaches the readers; ``process_weights`` skips it by default.
``center_unembed``
    Removes the mean over ``d_vocab`` from ``W_U`` and ``b_U``. Logits shift by the
    same amount for every token at a position, so log-probs (and softmax) are
    unchanged; logits themselves are not. Refused where the logits are soft-capped
    (``model.logit_softcap``, Gemma 2): ``cap * tanh(x / cap)`` does not pass a
    shift through, so the log-probs would change; ``process_weights`` skips it there.
``fold_value_biases``
    Moves ``b_V`` into ``b_O``: ``b_O' = b_O + sum_h b_V[h] W_O[h]``, ``b_V' = 0``.
    Exact because each row of an attention pattern sums to 1, so every head's
    ``z`` carries exactly ``b_V``. ``hook_v`` and ``hook_z`` change, ``hook_attn_out``
    does not. Apply ``fold_ln`` first (``fold_ln`` writes into ``b_V``). Refused where an
    attention's rows sum to less than 1 (gpt-oss's sinks, ``attn.pattern_rows_sum_to_one()``):
    there ``z`` carries a share of ``b_V`` that depends on the query; ``process_weights``
    skips it there.

Example:

>>> from interp_transformer import DemoTransformer, TransformerConfig
>>> cfg = TransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=11, n_ctx=8)
>>> model = DemoTransformer(cfg, seed=0)
>>> process_weights(model).processing
['fold_ln', 'center_writing_weights', 'center_unembed', 'fold_value_biases']
"""

import einops
import torch

STEPS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
# The hooks (the last part of their names) on the residual stream, or writing to it, whose values
# center_writing_weights changes: each loses its mean over d_model
CENTERED_BY_CENTER_WRITING_WEIGHTS = frozenset(
    {
        "hook_embed",
        "hook_pos_embed",
        "hook_resid_pre",
        "hook_resid_mid",
        "hook_resid_post",
        "hook_attn_out",
        "hook_mlp_out",
    }
)


def _pending(model, step: str) -> bool:
    """True if ``step`` must run now; False when it was already applied. Refuses models it cannot process exactly."""
    # asked of the model, not of its class: importing the base class here would close an import cycle
    # (base -> sae.splice -> sae.processing -> processing)
    if not isinstance(getattr(model, "processing", None), list) or not hasattr(model, "capabilities"):
        raise TypeError(
            f"expected a hooked model (a DemoTransformer, with a .processing list), received {type(model).__name__}"
        )
    if not model.capabilities.additive_residual:
        raise ValueError(
            f"{step}: {model.capabilities.why_not_additive()}, so the rewrite would change what it computes"
        )
    return step not in model.processing


def _norm_readers(model) -> list:
    """``(norm, part)`` for every norm of the model and the part reading its output, final norm last."""
    pairs = [pair for block in model.blocks for pair in block.norm_readers()]
    if model.final_norm is not None and model.read_out is not None:
        pairs.append((model.final_norm, model.read_out))
    return pairs


def fold_ln(model, center_weights=None):
    """Fold every norm's ``w``/``b`` into the next part's weights (see module docstring)."""
    if not _pending(model, "fold_ln"):
        return model
    if "fold_value_biases" in model.processing:
        raise ValueError("fold_ln must come before fold_value_biases: folding ln1 writes into b_V again")
    readers = _norm_readers(model)
    keeping_mean = _norms_keeping_the_mean(readers)
    if center_weights and keeping_mean:
        raise ValueError(
            f"fold_ln(center_weights=True): this model's norms ({keeping_mean}) do not subtract the mean, so centring "
            "the weights that read them would change the output; pass center_weights=False"
        )
    _check_biases_have_somewhere_to_go(readers)
    center = not keeping_mean if center_weights is None else bool(center_weights)
    with torch.no_grad():
        for norm, part in readers:
            for W, b_next in part.input_weights():
                # a reader without a bias (a gated MLP's gate) gets a throwaway one: the check above made sure
                # the norm adds nothing to it
                norm.fold_into(W, b_next if b_next is not None else W.new_zeros(W.shape[:-2] + W.shape[-1:]), center)
        for norm, _ in readers:
            norm.reset()
    model.processing.append("fold_ln")
    return model


def _norms_keeping_the_mean(readers) -> str:
    """The class names of the norms that do not subtract the mean (``"RMSNorm"``), or ``""`` when all do."""
    return ", ".join(sorted({type(norm).__name__ for norm, _ in readers if not norm.removes_mean}))


def _check_biases_have_somewhere_to_go(readers) -> None:
    """Refuse, before anything changes, to fold a norm's bias into weights that have no bias to take ``b W``."""
    for norm, part in readers:
        for W, b_next in part.input_weights():
            if b_next is None and bool(norm.bias_term(W.transpose(-1, -2)).any()):
                raise ValueError(
                    f"fold_ln: {type(part).__name__} has weights without a bias (shape {tuple(W.shape)}) reading a "
                    f"{type(norm).__name__} whose bias is not zero, so b W has nowhere to go; only a norm without a "
                    "bias (RMSNorm) or with a zero bias can be folded into it"
                )


def center_writing_weights(model):
    """Remove the mean over ``d_model`` from every weight writing to the residual stream."""
    if not _pending(model, "center_writing_weights"):
        return model
    keeping_mean = _norms_keeping_the_mean(_norm_readers(model))
    if keeping_mean:
        raise ValueError(
            f"center_writing_weights: this model's norms ({keeping_mean}) do not subtract the mean, so the mean of "
            "the residual stream reaches their readers and removing it would change the output"
        )
    writers = [model.embed] + ([model.pos_embed] if model.pos_embed is not None else [])
    writers += [writer.part for block in model.blocks for writer in block.writers()]
    with torch.no_grad():
        for weight in (w for part in writers for w in part.output_weights()):  # d_model is the last axis of each
            weight.sub_(weight.mean(dim=-1, keepdim=True))
    model.processing.append("center_writing_weights")
    return model


def center_unembed(model):
    """Remove the mean over ``d_vocab`` from ``W_U`` and ``b_U`` (log-probs unchanged)."""
    if not _pending(model, "center_unembed"):
        return model
    if model.logit_softcap is not None:
        raise ValueError(
            f"center_unembed: the logits are soft-capped (cap={model.logit_softcap}), and "
            "the cap does not "
            "pass a shift of every logit through, so centring W_U would change the log-probs"
        )
    with torch.no_grad():
        model.unembed.W_U.sub_(model.unembed.W_U.mean(dim=-1, keepdim=True))
        model.unembed.b_U.sub_(model.unembed.b_U.mean())
    model.processing.append("center_unembed")
    return model


def fold_value_biases(model):
    """Move each head's value bias into the attention output bias: ``b_O += sum_h b_V[h] W_O[h]``, ``b_V = 0``.

    With grouped-query attention ``b_V[h]`` is the bias of query head ``h``'s key/value
    head (``attn.b_V`` gives it per query head), and the stored per-key/value-head bias is
    what becomes zero.
    """
    if not _pending(model, "fold_value_biases"):
        return model
    sinking = [layer for layer, block in enumerate(model.blocks) if not block.attn.pattern_rows_sum_to_one()]
    if sinking:
        raise ValueError(
            f"fold_value_biases would change the output: the attention of blocks {sinking} gives part of each "
            "query's attention to a sink, so its pattern rows sum to less than 1 and the share of b_V in z depends "
            "on the query; keep b_V (process_weights skips this step for such a model)"
        )
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            attn.b_O.add_(einops.einsum(attn.b_V, attn.W_O, "head_index d_head, head_index d_head d_model -> d_model"))
            attn.stored("b_V").zero_()
    model.processing.append("fold_value_biases")
    return model


STEP_FUNCTIONS = {
    "fold_ln": fold_ln,
    "center_writing_weights": center_writing_weights,
    "center_unembed": center_unembed,
    "fold_value_biases": fold_value_biases,
}


def process_weights(
    model,
    *,
    fold_ln: bool = True,
    center_writing_weights: bool | None = None,
    center_unembed: bool | None = None,
    fold_value_biases: bool | None = None,
):
    """Apply the chosen steps in the order that keeps each exact (``fold_ln`` first).

    ``center_writing_weights=None`` (default) centres where it is exact: when every norm
    subtracts the mean (LayerNorm), not in an RMSNorm model; ``True`` asks for it and is
    refused where it would change the output. ``center_unembed=None`` (default) likewise
    centres the read-out unless the logits are soft-capped, and ``fold_value_biases=None``
    folds the value biases unless an attention's pattern rows sum to less than 1 (sinks).
    """
    if center_writing_weights is None:  # where it is exact (and not yet done)
        center_writing_weights = _pending(model, "center_writing_weights") and not _norms_keeping_the_mean(
            _norm_readers(model)
        )
    if center_unembed is None:
        center_unembed = model.logit_softcap is None
    if fold_value_biases is None:
        fold_value_biases = all(block.attn.pattern_rows_sum_to_one() for block in model.blocks)
    wanted = {
        "fold_ln": fold_ln,
        "center_writing_weights": center_writing_weights,
        "center_unembed": center_unembed,
        "fold_value_biases": fold_value_biases,
    }
    for name in STEPS:
        if wanted[name]:
            STEP_FUNCTIONS[name](model)
    return model


__all__ = [
    "CENTERED_BY_CENTER_WRITING_WEIGHTS",
    "STEPS",
    "center_unembed",
    "center_writing_weights",
    "fold_ln",
    "fold_value_biases",
    "process_weights",
]

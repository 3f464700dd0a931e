"""Weight processing: explicit, opt-in rewrites of the weights that leave the model's output unchanged.

A loaded model holds Hugging Face-faithful weights. These functions rewrite
them into forms that are easier to read, without changing what the model
computes. Each works in place, returns the model, and appends its name to
``model.processing`` (once: calling it again does nothing), so caches and
verification reports can say which steps were applied.

``fold_ln``
    Folds each LayerNorm's ``w`` and ``b`` into the layer that reads it: for
    ``ln1`` into ``W_Q/W_K/W_V`` and ``b_Q/b_K/b_V``, for ``ln2`` into ``W_in``
    and ``b_in``, for ``ln_final`` into ``W_U`` and ``b_U``:
    ``W' = diag(w) W``, ``b' = b_next + b W``. The LayerNorm keeps its ``w``/``b``
    parameters, set to 1 and 0. Since ``hook_normalized`` is taken after ``w`` and
    ``b``, after folding it holds the pure normalization ``(x - mean(x)) / scale``.
    With ``center_weights`` (default) the folded reading weights also have their
    mean over ``d_model`` removed, which changes nothing: they only ever read
    vectors of zero mean.
``center_writing_weights``
    Removes the mean over ``d_model`` from every weight that writes to the
    residual stream (``W_E``, ``W_pos``, ``W_O``, ``b_O``, ``W_out``, ``b_out``). Every
    reader of the residual stream starts with a LayerNorm, which removes that mean
    anyway, so nothing downstream changes; afterwards every ``hook_resid_*``
    (and ``hook_embed``, ``hook_pos_embed``, ``hook_attn_out``, ``hook_mlp_out``)
    has zero mean over ``d_model``.
``center_unembed``
    Removes the mean over ``d_vocab`` from ``W_U`` and ``b_U``. Logits shift by the
    same amount for every token at a position, so log-probs (and softmax) are
    unchanged; logits themselves are not.
``fold_value_biases``
    Moves ``b_V`` into ``b_O``: ``b_O' = b_O + sum_h b_V[h] W_O[h]``, ``b_V' = 0``.
    Exact because each row of an attention pattern sums to 1, so every head's
    ``z`` carries exactly ``b_V``. ``hook_v`` and ``hook_z`` change, ``hook_attn_out``
    does not. Apply ``fold_ln`` first (``fold_ln`` writes into ``b_V``).

Example:

>>> from interp_transformer import DemoTransformer, TransformerConfig
>>> model = DemoTransformer(TransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=11, n_ctx=8), seed=0)
>>> process_weights(model).processing
['fold_ln', 'center_writing_weights', 'center_unembed', 'fold_value_biases']
"""

import einops
import torch

def _pending(model, step: str) -> bool:
    """True if ``step`` must run now; False when it was already applied."""
    if not hasattr(model, "processing"):
        raise TypeError(f"expected a DemoTransformer (with a .processing list), received {type(model).__name__}")
    return step not in model.processing


def _fold_into(w: torch.Tensor, b: torch.Tensor, W: torch.Tensor, b_next: torch.Tensor, pattern: str, center: bool) -> None:
    """In place: ``W <- diag(w) W`` (optionally centred over d_model), ``b_next <- b_next + b W``."""
    b_next.add_(einops.einsum(b, W, pattern))
    W.mul_(einops.rearrange(w, "d_model -> d_model 1") if W.ndim == 2 else einops.rearrange(w, "d_model -> 1 d_model 1"))
    if center:
        W.sub_(W.mean(dim=-2, keepdim=True))


def fold_ln(model, center_weights: bool = True):
    """Fold every LayerNorm's ``w``/``b`` into the next layer's weights (see module docstring)."""
    if not _pending(model, "fold_ln"):
        return model
    if "fold_value_biases" in model.processing:
        raise ValueError("fold_ln must come before fold_value_biases: folding ln1 writes into b_V again")
    with torch.no_grad():
        for block in model.blocks:
            ln, attn = block.ln1, block.attn
            for W, b_next in ((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V)):
                _fold_into(ln.w, ln.b, W, b_next, "d_model, head_index d_model d_head -> head_index d_head", center_weights)
            _reset(ln)
            if hasattr(block, "mlp"):
                _fold_into(block.ln2.w, block.ln2.b, block.mlp.W_in, block.mlp.b_in, "d_model, d_model d_mlp -> d_mlp", center_weights)
                _reset(block.ln2)
        unembed = model.unembed
        _fold_into(model.ln_final.w, model.ln_final.b, unembed.W_U, unembed.b_U, "d_model, d_model d_vocab -> d_vocab", center_weights)
        _reset(model.ln_final)
    model.processing.append("fold_ln")
    return model


def _reset(ln) -> None:
    ln.w.fill_(1.0)
    ln.b.zero_()


def center_writing_weights(model):
    """Remove the mean over ``d_model`` from every weight writing to the residual stream."""
    if not _pending(model, "center_writing_weights"):
        return model
    with torch.no_grad():
        writers = [model.embed.W_E, model.pos_embed.W_pos]
        for block in model.blocks:
            writers += [block.attn.W_O, block.attn.b_O]
            if hasattr(block, "mlp"):
                writers += [block.mlp.W_out, block.mlp.b_out]
        for weight in writers:  # d_model is the last axis of each
            weight.sub_(weight.mean(dim=-1, keepdim=True))
    model.processing.append("center_writing_weights")
    return model


def center_unembed(model):
    """Remove the mean over ``d_vocab`` from ``W_U`` and ``b_U`` (log-probs unchanged)."""
    if not _pending(model, "center_unembed"):
        return model
    with torch.no_grad():
        model.unembed.W_U.sub_(model.unembed.W_U.mean(dim=-1, keepdim=True))
        model.unembed.b_U.sub_(model.unembed.b_U.mean())
    model.processing.append("center_unembed")
    return model


def fold_value_biases(model):
    """Move each head's value bias into the attention output bias: ``b_O += sum_h b_V[h] W_O[h]``, ``b_V = 0``."""
    if not _pending(model, "fold_value_biases"):
        return model
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            attn.b_O.add_(einops.einsum(attn.b_V, attn.W_O, "head_index d_head, head_index d_head d_model -> d_model"))
            attn.b_V.zero_()
    model.processing.append("fold_value_biases")
    return model


def process_weights(
    model,
    *,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
):
    """Apply the chosen steps in the order that keeps each exact (``fold_ln`` first)."""
    steps = [
        (fold_ln, _fold_ln),
        (center_writing_weights, _center_writing_weights),
        (center_unembed, _center_unembed),
        (fold_value_biases, _fold_value_biases),
    ]
    for wanted, step in steps:
        if wanted:
            step(model)
    return model


_fold_ln, _center_writing_weights, _center_unembed, _fold_value_biases = fold_ln, center_writing_weights, center_unembed, fold_value_biases

__all__ = ["center_unembed", "center_writing_weights", "fold_ln", "fold_value_biases", "process_weights"]

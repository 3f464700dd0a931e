"""TransformerLens' input hooks and shortformer positions: what a ``PreNormBlock`` built with them does.

The flags only add hook points whose values equal what the block computes (DESIGN section 3):

- ``attn_in``: ``hook_attn_in`` ``[batch, pos, head_index, d_model]``, the residual stream each
  head's attention reads;
- ``split_qkv_input``: ``hook_q_input``, ``hook_k_input``, ``hook_v_input``, the same residual
  stream as three hook points, so a query, a key or a value input can be patched alone (with
  ``attn_in`` too, these are what the heads read);
- ``mlp_in``: ``hook_mlp_in`` ``[batch, pos, d_model]``, the MLP's input (a copy of ``resid_mid``,
  so a hook editing it in place changes the MLP's input only; the block adds it itself);
- ``shortformer``: the layout's ``pos_embed`` is added to the normalized query and key inputs
  only; the residual stream and the values never hold positions.

Exactness: when no hook changed an input hook point's value (the hooked tensor is the one handed
in, not modified in place) and none observes its gradient, the block takes the plain path
``attn(ln1(resid_pre))``, so every other activation is the core's, bit for bit. When a hook did
change it, the change flows on: per-head inputs are normalized (``ln1.normalize``, whose hooks do
not fire: there is no single normalized stream then) and projected head by head.
"""

import einops
from torch import Tensor

from interp_transformer.core.errors import CompatValueError
from interp_transformer.parts.split_inputs import untouched

INPUT_HOOKS = {"attn_in": ("hook_attn_in",), "split_qkv_input": ("hook_q_input", "hook_k_input", "hook_v_input")}
_PER_HEAD = INPUT_HOOKS["attn_in"] + INPUT_HOOKS["split_qkv_input"]


def attend_with_input_hooks(block, resid_pre: Tensor, layout, kv_cache) -> Tensor:
    """``block.attn``'s output for ``resid_pre``, through the block's input hooks and shortformer positions."""
    pos = _positions(block, layout)
    ln1 = block._modules.get("ln1")
    per_head = _per_head_inputs(block, resid_pre)
    if per_head is None:  # the shared path: one normalized stream
        normalized = resid_pre if ln1 is None else ln1(resid_pre)
        if pos is None:
            return block.attn(normalized, layout, kv_cache)
        return block.attn.forward_inputs(normalized + pos, normalized + pos, normalized, layout, kv_cache)
    q_in, k_in, v_in = (x if ln1 is None else ln1.normalize(x) for x in per_head)
    if pos is not None:
        q_in, k_in = q_in + pos[:, :, None], k_in + pos[:, :, None]
    return block.attn.forward_inputs(q_in, k_in, v_in, layout, kv_cache)


def _positions(block, layout) -> Tensor | None:
    if not block.shortformer:
        return None
    pos_embed = getattr(layout, "pos_embed", None)
    if pos_embed is None:
        raise CompatValueError(
            "a shortformer block adds the positional embedding to its query and key inputs, and reads it "
            "from the forward pass's layout: run the model with HookedTransformer, whose forward provides it "
            "(a DemoTransformer adds positions to the residual stream instead)"
        )
    return pos_embed


def _per_head_inputs(block, resid_pre: Tensor) -> tuple | None:
    """The hooked per-head inputs ``(q_in, k_in, v_in)``, or None when no hook changed them (the shared path)."""
    hooks = [block._modules[name] for name in _PER_HEAD if name in block._modules]
    if not any(hook.has_hooks() for hook in hooks):
        return None
    all_untouched = True
    hooked = {}
    kv_hooks = (block._modules.get("hook_k_input"), block._modules.get("hook_v_input"))
    for hook in hooks:
        heads = block.attn.n_key_value_heads if hook in kv_hooks else block.attn.n_heads
        repeated = einops.repeat(resid_pre, "batch pos d_model -> batch pos head_index d_model", head_index=heads)
        repeated = repeated.contiguous()  # its own memory: a hook may edit one head's copy in place
        version = repeated._version
        hooked[hook] = hook(repeated)
        all_untouched = all_untouched and untouched(hooked[hook], repeated, version, hook)
    if all_untouched:
        return None
    if "hook_q_input" in block._modules:
        return hooked[block.hook_q_input], hooked[block.hook_k_input], hooked[block.hook_v_input]
    if block.attn.n_key_value_heads != block.attn.n_heads:
        raise CompatValueError(
            "an edit of hook_attn_in (one input per query head) cannot feed grouped keys and values: edit "
            "hook_k_input/hook_v_input instead (set_use_split_qkv_input)"
        )
    return (hooked[block.hook_attn_in],) * 3


__all__ = ["INPUT_HOOKS", "attend_with_input_hooks"]

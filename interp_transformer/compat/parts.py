"""The parts TransformerLens-compatible models add to ours: split inputs, per-head results, shortformer positions.

Each is a subclass or a block built from the same parameters as the core parts, and each
only *adds* hook points whose values equal what the core computes (DESIGN section 3). TransformerLens'
attention (split inputs, ``hook_result``) and read-out (``unembed.hook_in``/``hook_out``) are options
of the core's ``Attention`` and ``Unembed`` (``parts.split_inputs``, ``Unembed(in_out_hooks=True)``):

=========================  ==============================================================
``HookedBlock``            a pre-norm block with TransformerLens' optional input hooks:
                           ``hook_attn_in``, ``hook_q_input``/``k_input``/``v_input``
                           (the residual stream repeated per head) and ``hook_mlp_in``;
                           and shortformer positions (added to the query and key inputs
                           only, read from a ``ShortformerLayout``); optionally with norms
                           after attention and the MLP too (``ln1_post``, ``ln2_post``).
=========================  ==============================================================

Exactness: when no hook changed an added hook point's value (the hooked tensor is the
one handed in, not modified in place) and none observes its gradient, the block or
attention takes the core's own path, so every other activation is the core's, bit for
bit. When a hook did change it, the change flows on: per-head inputs are normalized
(``ln1.normalize``, whose hooks do not fire: there is no single normalized stream then)
and projected head by head; per-head results are summed, ``attn_out = sum_h result_h + b_O``.
"""

from dataclasses import dataclass

import einops
from torch import Tensor, nn

from interp_transformer.compat.errors import CompatValueError
from interp_transformer.compat.utils_tensors import get_offset_position_ids
from interp_transformer.hooks import HookPoint
from interp_transformer.parts import Attention, PosEmbed, TokenLayout
from interp_transformer.parts.split_inputs import untouched as _untouched
from interp_transformer.parts.writers import Step, StreamBlock, Writer


@dataclass(frozen=True)
class ShortformerLayout(TokenLayout):
    """A ``TokenLayout`` carrying the positional embedding ``[batch, pos, d_model]`` that shortformer blocks add
    to their query and key inputs (the residual stream never holds it)."""

    pos_embed: Tensor | None = None


class PositionalEmbedding(PosEmbed):
    """``PosEmbed`` that also takes TransformerLens' call ``pos_embed(tokens, offset, attention_mask=mask)``.

    With ``attention_mask`` (``[batch, offset + pos]``, 1 real, 0 padding; the cached
    positions' entries first) each real token's position counts from its row's first real
    token and padding gets zeros, as in TransformerLens. In the model's own forward the
    positions come from the layout (padding then repeats its last real position, which no
    real token reads).
    """

    def forward(
        self,
        tokens: Tensor,
        offset: int = 0,
        positions: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        if attention_mask is None:
            return super().forward(tokens, offset, positions)
        if positions is not None:
            raise CompatValueError("pass positions or attention_mask, not both")
        if attention_mask.shape != (tokens.shape[0], offset + tokens.shape[1]):
            raise CompatValueError(
                "attention_mask must be [batch, offset + pos] = "
                f"{[tokens.shape[0], offset + tokens.shape[1]]}, "
                f"got {list(attention_mask.shape)}"
            )
        mask = attention_mask.to(self.W_pos.device)
        positions = get_offset_position_ids(offset, mask)
        return self.W_pos[positions] * mask[:, offset:, None].to(self.W_pos.dtype)


class HookedBlock(StreamBlock):
    """A pre-norm block with TransformerLens' optional hooks on its inputs, and optional shortformer positions.

    ``resid_mid = resid_pre + attn(ln1(.))``, ``resid_post = resid_mid + mlp(ln2(resid_mid))``
    (no MLP: ``resid_post = resid_pre + attn_out``), exactly ``TransformerBlock``'s formula; given
    ``ln1_post`` and ``ln2_post``, ``PrePostNormBlock``'s (``attn_out = ln1_post(attn(ln1(.)))``,
    ``mlp_out = ln2_post(mlp(ln2(.)))``, TransformerLens' ``use_normalization_before_and_after``).
    The flags only add hook points (see the module docstring):

    - ``attn_in``: ``hook_attn_in`` ``[batch, pos, head_index, d_model]``, the residual stream
      each head's attention reads;
    - ``split_qkv_input``: ``hook_q_input``, ``hook_k_input``, ``hook_v_input``, the same
      residual stream as three hook points, so a query, a key or a value input can be
      patched alone (with ``attn_in`` too, these are what the heads read);
    - ``mlp_in``: ``hook_mlp_in`` ``[batch, pos, d_model]``, the MLP's input (a copy of
      ``resid_mid``, so a hook editing it in place changes the MLP's input only);
    - ``shortformer``: the layout's ``pos_embed`` is added to the normalized query and key
      inputs only; the residual stream and the values never hold positions.
    """

    def __init__(
        self,
        ln1: nn.Module,
        attn: Attention,
        ln2: nn.Module | None = None,
        mlp: nn.Module | None = None,
        *,
        attn_in: bool = False,
        split_qkv_input: bool = False,
        mlp_in: bool = False,
        shortformer: bool = False,
        ln1_post: nn.Module | None = None,
        ln2_post: nn.Module | None = None,
    ):
        super().__init__()
        if (ln2 is None) != (mlp is None):
            raise CompatValueError("ln2 and mlp come together: pass both, or neither for an attention-only block")
        if mlp_in and mlp is None:
            raise CompatValueError("hook_mlp_in needs an MLP: this block is attention-only")
        if (ln1_post is None) != (ln2_post is None) or (ln1_post is not None and mlp is None):
            raise CompatValueError(
                "ln1_post and ln2_post come together, and need an MLP (a block with norms before and after both "
                "sublayers)"
            )
        self.shortformer = shortformer
        self.hook_resid_pre = HookPoint()
        if attn_in:
            self.hook_attn_in = HookPoint()
        if split_qkv_input:
            self.hook_q_input = HookPoint()
            self.hook_k_input = HookPoint()
            self.hook_v_input = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        if ln1_post is not None:
            self.ln1_post = ln1_post
        self.hook_attn_out = HookPoint()
        if mlp is not None:
            self.hook_resid_mid = HookPoint()
            if mlp_in:
                self.hook_mlp_in = HookPoint()
            self.ln2 = ln2
            self.mlp = mlp
            if ln2_post is not None:
                self.ln2_post = ln2_post
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    @classmethod
    def from_block(cls, block: nn.Module, **flags) -> "HookedBlock":
        """A ``HookedBlock`` of ``block``'s parts and hook points (the same objects), with the hooks ``flags`` ask
        for."""
        mlp = getattr(block, "mlp", None)
        flags.setdefault("shortformer", getattr(block, "shortformer", False))
        post = {name: getattr(block, name, None) for name in ("ln1_post", "ln2_post")}
        new = cls(block.ln1, block.attn, getattr(block, "ln2", None), mlp, **flags, **post)
        for name, module in block.named_children():
            if isinstance(module, HookPoint) and hasattr(new, name):
                setattr(new, name, module)  # keep the hooks already attached there
        return new

    def flags(self) -> dict:
        """The hook flags this block was built with."""
        return dict(
            attn_in=hasattr(self, "hook_attn_in"),
            split_qkv_input=hasattr(self, "hook_q_input"),
            mlp_in=hasattr(self, "hook_mlp_in"),
            shortformer=self.shortformer,
        )

    def norm_readers(self) -> list:
        """``(norm, part)``: each norm and the part that reads its output (what ``fold_ln`` folds into)."""
        return [(self.ln1, self.attn)] + ([(self.ln2, self.mlp)] if hasattr(self, "mlp") else [])

    def stream(self) -> list[Step]:
        """The residual stream's steps: what is added to it, in forward order (through the post norms, if any)."""
        post = {name: getattr(self, name, None) for name in ("ln1_post", "ln2_post")}
        mlp = (
            [Writer("mlp", self.mlp, self.hook_mlp_out.name, output_norm=post["ln2_post"])]
            if hasattr(self, "mlp")
            else []
        )
        return [Writer("attn", self.attn, self.hook_attn_out.name, output_norm=post["ln1_post"])] + mlp

    def forward(self, resid_pre: Tensor, layout: TokenLayout | None = None, kv_cache=None) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self._post_norm("ln1_post", self._attention(resid_pre, layout, kv_cache)))
        if not hasattr(self, "mlp"):
            return self.hook_resid_post(resid_pre + attn_out)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_in = self.hook_mlp_in(resid_mid.clone()) if hasattr(self, "hook_mlp_in") else resid_mid
        mlp_out = self.hook_mlp_out(self._post_norm("ln2_post", self.mlp(self.ln2(mlp_in))))
        return self.hook_resid_post(resid_mid + mlp_out)

    def _post_norm(self, name: str, out: Tensor) -> Tensor:
        """``out`` through the post norm ``name`` (Gemma 2's ``ln1_post``/``ln2_post``), or as it is without one."""
        norm = getattr(self, name, None)
        return out if norm is None else norm(out)

    def _positions(self, layout: TokenLayout | None) -> Tensor | None:
        if not self.shortformer:
            return None
        pos_embed = getattr(layout, "pos_embed", None)
        if pos_embed is None:
            raise CompatValueError(
                "a shortformer block adds the positional embedding to its query and key inputs, and reads it "
                "from the forward pass's layout: run the model with HookedTransformer, whose forward provides it "
                "(a DemoTransformer adds positions to the residual stream instead)"
            )
        return pos_embed

    def _attention(self, resid_pre: Tensor, layout: TokenLayout | None, kv_cache) -> Tensor:
        pos = self._positions(layout)
        per_head = self._per_head_inputs(resid_pre)
        if per_head is None:  # the shared path: one normalized stream, as in TransformerBlock
            normalized = self.ln1(resid_pre)
            if pos is None:
                return self.attn(normalized, layout, kv_cache)
            return self.attn.forward_inputs(normalized + pos, normalized + pos, normalized, layout, kv_cache)
        q_in, k_in, v_in = (self.ln1.normalize(x) for x in per_head)
        if pos is not None:
            q_in, k_in = q_in + pos[:, :, None], k_in + pos[:, :, None]
        return self.attn.forward_inputs(q_in, k_in, v_in, layout, kv_cache)

    def _per_head_inputs(self, resid_pre: Tensor) -> tuple | None:
        """The hooked per-head inputs ``(q_in, k_in, v_in)``, or None when no hook changed them (the shared path)."""
        hooks = [
            getattr(self, name)
            for name in ("hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input")
            if hasattr(self, name)
        ]
        if not any(hook.has_hooks() for hook in hooks):
            return None
        untouched = True
        hooked = {}
        kv_hooks = (getattr(self, "hook_k_input", None), getattr(self, "hook_v_input", None))
        for hook in hooks:
            heads = self.attn.n_key_value_heads if hook in kv_hooks else self.attn.n_heads
            repeated = einops.repeat(resid_pre, "batch pos d_model -> batch pos head_index d_model", head_index=heads)
            repeated = repeated.contiguous()  # its own memory: a hook may edit one head's copy in place
            version = repeated._version
            hooked[hook] = hook(repeated)
            untouched = untouched and _untouched(hooked[hook], repeated, version, hook)
        if untouched:
            return None
        if hasattr(self, "hook_q_input"):
            return hooked[self.hook_q_input], hooked[self.hook_k_input], hooked[self.hook_v_input]
        if self.attn.n_key_value_heads != self.attn.n_heads:
            raise CompatValueError(
                "an edit of hook_attn_in (one input per query head) cannot feed grouped keys and values: edit "
                "hook_k_input/hook_v_input instead (set_use_split_qkv_input)"
            )
        return (hooked[self.hook_attn_in],) * 3


__all__ = [
    "HookedBlock",
    "PositionalEmbedding",
    "ShortformerLayout",
]

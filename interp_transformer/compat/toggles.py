"""TransformerLens' toggles: ``set_use_attn_result``, ``set_use_split_qkv_input``, ``set_use_attn_in``,
``set_use_hook_mlp_in``.

Each swaps parts in place and renames the hooks (``model.setup()``); none changes a value
the model computes (``interp_transformer.compat.parts``). Turning one on puts in parts that
share every parameter, hook point and hook already attached (``attn.set_result_hook``, in place;
``PreNormBlock.with_input_hooks``); turning it off takes the added hook points away again, with
the hooks on them. The config field of the same name follows (``model.cfg.use_attn_result``).

Adding a hook to a point a toggle has not created raises ``KeyError`` naming the closest
hook points (TransformerLens: ``AssertionError``).
"""

from typing import TYPE_CHECKING, Any

from interp_transformer.compat.architecture import block_flags
from interp_transformer.compat.errors import CompatValueError
from interp_transformer.parts import PreNormBlock


class ToggleMethods:
    """The ``set_use_*`` methods of ``HookedTransformer``."""

    if TYPE_CHECKING:  # a mixin of the model class: it reads that class's attributes and calls its forward

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Hook each head's write to the residual stream at ``blocks.L.attn.hook_result`` ``[batch, pos, head_index,
        d_model]``."""
        self.cfg.use_attn_result = bool(use_attn_result)
        for block in self.blocks:
            block.attn.set_result_hook(bool(use_attn_result))
        self.setup()

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Hook the residual stream each head's query, key and value read: ``blocks.L.hook_q_input`` (``k``, ``v``)."""
        self.cfg.use_split_qkv_input = bool(use_split_qkv_input)
        self._rebuild_blocks()

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Hook the residual stream each head reads, ``blocks.L.hook_attn_in`` ``[batch, pos, head_index, d_model]``."""
        self.cfg.use_attn_in = bool(use_attn_in)
        self._rebuild_blocks()

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Hook the MLP's input, ``blocks.L.hook_mlp_in`` ``[batch, pos, d_model]``."""
        if use_hook_mlp_in and self.cfg.attn_only:
            raise CompatValueError("set_use_hook_mlp_in: this model is attention-only, its blocks have no MLP")
        self.cfg.use_hook_mlp_in = bool(use_hook_mlp_in)
        self._rebuild_blocks()

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        """Grouped-query attention is not in this version: only ``False`` is accepted."""
        if ungroup_grouped_query_attention:
            raise CompatValueError("this model has no grouped-query attention to ungroup")
        self.cfg.ungroup_grouped_query_attention = False

    def _rebuild_blocks(self) -> None:
        """Give every block the hook points the config's toggles ask for (the same parts and hooks otherwise)."""
        flags = block_flags(self.cfg)
        for layer, block in enumerate(self.blocks):
            if isinstance(block, PreNormBlock):
                if block.input_hooks() != flags:
                    self.blocks[layer] = block.with_input_hooks(**flags)
            elif any(flags.values()):
                raise CompatValueError(
                    f"the input hooks {sorted(name for name, on in flags.items() if on)} are options of a pre-norm "
                    f"block; block {layer} is a {type(block).__name__}"
                )
        self.setup()


__all__ = ["ToggleMethods"]

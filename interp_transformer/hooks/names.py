"""Short hook names: one explicit table per architecture, never a regular expression.

``HookNames`` maps a short name and a layer to the full name of a hook point:
``("pattern", 0) -> "blocks.0.attn.hook_pattern"``, ``("normalized", 0, "ln1") ->
"blocks.0.ln1.hook_normalized"``, ``"scale" -> "ln_final.hook_scale"``. Each architecture
module (``interp_transformer.families``) declares its table; a model answers
``model.hook_names`` and ``model.act_name(...)``, the cache resolves ``cache["pattern", 0]``
through it, and ``analysis`` asks it instead of spelling hook paths.

>>> DECODER_HOOK_NAMES.full_name("pattern", 0)
'blocks.0.attn.hook_pattern'
>>> DECODER_HOOK_NAMES.full_name("resid_post", -1, n_layers=12)
'blocks.11.hook_resid_post'
>>> get_act_name("scale")
'ln_final.hook_scale'
"""

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

# TransformerLens spellings that name the same activations
ALIASES: dict[str, str] = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "mlp_pre": "pre",
    "mlp_post": "post",
    "key": "k",
    "query": "q",
    "value": "v",
}
# TransformerLens' layer_type spellings of the sub-module a hook sits in ("" = the block itself)
SUB_ALIASES: dict[str, str] = {
    "a": "attn",
    "attention": "attn",
    "attn": "attn",
    "m": "mlp",
    "mlp": "mlp",
    "b": "",
    "block": "",
    "blocks": "",
}

# short name -> full name template; {layer} is a block index, {sub} a norm of the block (ln1, ln2)
BLOCK_HOOKS: dict[str, str] = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "q": "blocks.{layer}.attn.hook_q",
    "k": "blocks.{layer}.attn.hook_k",
    "v": "blocks.{layer}.attn.hook_v",
    "z": "blocks.{layer}.attn.hook_z",
    # z_h W_O[h] per head: hooked only by opt-in parts, computed by the cache
    "result": "blocks.{layer}.attn.hook_result",
    "attn_scores": "blocks.{layer}.attn.hook_attn_scores",
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "pre": "blocks.{layer}.mlp.hook_pre",
    "post": "blocks.{layer}.mlp.hook_post",
    "scale": "blocks.{layer}.{sub}.hook_scale",
    "normalized": "blocks.{layer}.{sub}.hook_normalized",
}


@dataclass(frozen=True)
class HookNames:
    """The hook-name table of one architecture.

    ``layer_keys``: short name -> template with ``{layer}`` (and ``{sub}`` for a block's
    norms, one of ``sublayers``). ``global_keys``: short names without a layer.
    ``input_writers``: the short names of the hooks whose sum (in this order) is the
    residual stream entering block 0 (``embed``, ``pos_embed``). ``final_residual``:
    template (``{last}`` = the last block) of the hook holding the final residual
    stream, the one the final norm or the output reads. ``unavailable``: short names
    this architecture lacks, with the advice to give instead (``{last}`` filled in).
    """

    layer_keys: Mapping[str, str] = field(default_factory=lambda: dict(BLOCK_HOOKS))
    global_keys: Mapping[str, str] = field(default_factory=dict)
    sublayers: tuple[str, ...] = ("ln1", "ln2")
    input_writers: tuple[str, ...] = ("embed", "pos_embed")
    final_residual: str = "blocks.{last}.hook_resid_post"
    unavailable: Mapping[str, str] = field(default_factory=dict)

    def full_name(
        self, name: str, layer: int | None = None, sub: str | None = None, n_layers: int | None = None
    ) -> str:
        """Full hook name of a short key; ``KeyError`` naming the valid keys for anything else.

        A negative ``layer`` counts from the end and needs ``n_layers``.
        """
        if not isinstance(name, str):
            raise KeyError(f"short names are str, got {name!r}")
        name = ALIASES.get(name, name)
        if layer is None:
            if name in self.global_keys:
                return self.global_keys[name]
            if name in self.unavailable:
                last = n_layers - 1 if n_layers is not None else "L"
                raise KeyError(self.unavailable[name].format(last=last, key=name))
            raise KeyError(
                f"{name!r} needs a layer, e.g. ({name!r}, 0); short names without a layer: {sorted(self.global_keys)}"
            )
        if name not in self.layer_keys:
            close = difflib.get_close_matches(name, list(self.layer_keys) + list(ALIASES), n=3)
            raise KeyError(f"unknown short name {name!r}; closest: {close}; all: {sorted(self.layer_keys)}")
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise KeyError(f"layer must be an int, got {layer!r}")
        if n_layers is not None:
            if not -n_layers <= layer < n_layers:
                raise KeyError(f"layer {layer} out of range for a model with {n_layers} layers")
            layer %= n_layers
        elif layer < 0:
            raise KeyError(f"layer {layer} counts from the end: give n_layers too")
        template = self.layer_keys[name]
        if "{sub}" in template:
            if sub not in self.sublayers:
                options = " or ".join(repr(s) for s in self.sublayers)
                raise KeyError(f"{name!r} needs the norm: ({name!r}, {layer}, {options}); got {sub!r}")
        elif sub is not None and not _names_its_part(template, sub):
            raise KeyError(f"{name!r} takes no sub-layer, got {sub!r}")
        return template.format(layer=layer, sub=sub)

    def final_residual_name(self, n_layers: int) -> str:
        """The hook holding the final residual stream of a model with ``n_layers`` blocks."""
        return self.final_residual.format(last=n_layers - 1)


def _names_its_part(template: str, sub: str) -> bool:
    """True when ``sub`` is TransformerLens' layer_type for the part the hook sits in (``"a"`` for ``attn.hook_k``)."""
    part = template.split(".")[2] if template.count(".") == 3 else ""
    return SUB_ALIASES.get(sub) == part


def split_compact_name(name: str) -> tuple[str, int, str | None] | None:
    """TransformerLens' compact spelling ``"k6a"`` -> ``("k", 6, "a")``, ``"scale4ln1"`` -> ``("scale", 4, "ln1")``.

    The name is read as letters, then the layer's digits, then an optional sub-layer;
    anything else (a full hook name, a name without digits) gives None.

    >>> split_compact_name("scale4ln1"), split_compact_name("pre5"), split_compact_name("hook_embed")
    (('scale', 4, 'ln1'), ('pre', 5, None), None)
    """
    if not isinstance(name, str) or "." in name:
        return None
    start = next((i for i, char in enumerate(name) if char.isdigit()), None)
    if not start or not all(char.isalpha() or char == "_" for char in name[:start]):
        return None
    end = next((i for i in range(start, len(name)) if not name[i].isdigit()), len(name))
    return name[:start], int(name[start:end]), (name[end:] or None)


DECODER_HOOK_NAMES = HookNames(
    global_keys={
        "embed": "hook_embed",
        "pos_embed": "hook_pos_embed",
        "scale": "ln_final.hook_scale",
        "normalized": "ln_final.hook_normalized",
    }
)


def get_act_name(name: str, layer: int | None = None, sub: str | None = None, n_layers: int | None = None) -> str:
    """Full hook name of a short key in a GPT-2-style decoder: ``get_act_name("pattern", 0) ==
    "blocks.0.attn.hook_pattern"``.

    Other architectures have their own table: ask the model, ``model.act_name(name, layer, sub)``.
    """
    return DECODER_HOOK_NAMES.full_name(name, layer, sub, n_layers)


__all__ = [
    "ALIASES",
    "BLOCK_HOOKS",
    "DECODER_HOOK_NAMES",
    "SUB_ALIASES",
    "HookNames",
    "get_act_name",
    "split_compact_name",
]

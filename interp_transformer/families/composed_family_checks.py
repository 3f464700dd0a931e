"""The checks of ``DecoderSpec``'s fields for the parts the shipped families use (``architectures.composed``).

Each field alone (its type and range) and each combination no part makes, refused with a message naming the field,
the rule and the value: ``parallel_residual`` and ``post_norms`` are pre-norm blocks (``ParallelBlock``,
``PreNormBlock`` with post norms) and not both; norms on the sublayers' outputs (``post_norms``,
``placement="output"``) need a norm; a sliding window is causal and read by some layer; ``rotary_base_local`` is
the base of layers that slide. The rotary fields are checked with the positions (``composed_parts.check_positions``);
what needs an MLP, with ``d_mlp`` (``DecoderSpec.__post_init__``).
"""

from interp_transformer.families import composed_parts as parts
from interp_transformer.families.validation import check_positive_int, check_positive_number


def check_family_parts(spec) -> None:
    """The fields of the families' parts, each alone and together: ``ValueError`` naming the field, the rule and the
    value (the rotary ones are checked with the positions, ``composed_parts.check_positions``)."""
    if spec.n_key_value_heads is not None:
        check_positive_int("n_key_value_heads", spec.n_key_value_heads)
        if spec.n_heads % spec.n_key_value_heads:
            raise ValueError(
                f"n_heads={spec.n_heads} must be a multiple of n_key_value_heads={spec.n_key_value_heads}: each "
                "key/value head serves a whole group of query heads"
            )
    if spec.qk_norm is not None:
        parts.check_choice("qk_norm", spec.qk_norm, parts.QK_NORMS)
    for field in ("attn_softcap", "final_softcap"):
        if getattr(spec, field) is not None:
            check_positive_number(field, getattr(spec, field))
    check_layer_types(spec)
    if spec.parallel_residual and (spec.placement != "pre" or spec.post_norms):
        raise ValueError(
            "parallel_residual=True is a pre-norm block whose attention and MLP read the same input (ParallelBlock), "
            f"with no norm on their outputs: it needs placement='pre' and post_norms=False, got placement="
            f"{spec.placement!r}, post_norms={spec.post_norms!r}"
        )
    if spec.post_norms and spec.placement != "pre":
        raise ValueError(
            "post_norms=True adds a norm on each sublayer's output to a pre-norm block (ln1_post, ln2_post): it needs "
            f"placement='pre', got placement={spec.placement!r}"
            + (" (placement='output' blocks have only those norms already)" if spec.placement == "output" else "")
        )
    for field, value in (("post_norms", spec.post_norms), ("placement", spec.placement == "output")):
        if value and spec.norm == "none":
            shown = f"{field}={getattr(spec, field)!r}"
            raise ValueError(f"{shown} normalizes each sublayer's output: it needs a norm, got norm='none'")


def check_layer_types(spec) -> None:
    """``sliding_window`` a positive int read by some layer, ``layer_types`` one of ``LAYER_TYPES`` per block, a
    window for the sliding layers, and a causal model (a window is the latest keys)."""
    if spec.sliding_window is not None:
        check_positive_int("sliding_window", spec.sliding_window)
    if spec.layer_types is not None:
        if not isinstance(spec.layer_types, tuple) or len(spec.layer_types) != spec.n_layers:
            raise ValueError(
                f"layer_types must be a tuple of n_layers={spec.n_layers} names from {parts.LAYER_TYPES}, got "
                f"{spec.layer_types!r}"
            )
        for layer_type in spec.layer_types:
            parts.check_choice("layer_types", layer_type, parts.LAYER_TYPES)
        sliding = "sliding_attention" in spec.layer_types
        if sliding and spec.sliding_window is None:
            raise ValueError(
                "layer_types has sliding_attention layers: give their sliding_window (a positive int), got None"
            )
        if not sliding and spec.sliding_window is not None:
            raise ValueError(
                f"sliding_window={spec.sliding_window} is read only by sliding_attention layers, and layer_types has "
                "none: leave it None, or name the sliding layers"
            )
    if spec.sliding_window is not None and not spec.causal:
        raise ValueError(
            f"sliding_window={spec.sliding_window} keeps each query's latest keys (a causal window): it needs "
            "causal=True, got causal=False"
        )
    if spec.rotary_base_local is not None:
        check_positive_number("rotary_base_local", spec.rotary_base_local, above=1.0)
        if not any(spec.is_sliding(layer) for layer in range(spec.n_layers)):
            raise ValueError(
                f"rotary_base_local={spec.rotary_base_local!r} is the sliding layers' rotary base, and no layer "
                "slides: give sliding_window (and layer_types), or leave it None"
            )


__all__ = ["check_family_parts", "check_layer_types"]

"""A ``HookedTransformer`` from a model of this library: its ``HookedTransformerConfig`` and its weights.

``config_from_core(core.cfg, ...)`` says, in TransformerLens' fields, the decoder a loaded
model's config describes: GPT-2, Llama, GPT-NeoX (Pythia), pre-norm OPT and Gemma 1, 2, 3
(the fields TransformerLens' own Gemma configs set: ``normalization_type="RMS"``,
``final_rms``, rotary positions with ``rotary_base_local``, ``use_normalization_before_and_after``,
``use_qk_norm``, ``use_local_attn`` with ``window_size`` and ``attn_types``, the soft-caps,
``attn_scale = sqrt(query_pre_attn_scalar)``). What a ``HookedTransformerConfig`` cannot say
is refused by name (``CompatValueError``): rope scaling, Llama's sliding windows, OLMo's
norms after the sublayers only, mixtures of experts, ...

``state_dict_from_core(core, model)`` reads ``model``'s weights from ``core``'s parts, each
parameter the same-named attribute of the same-named part, so a part that stores its
weights differently answers for itself: Gemma's norms give their gain ``w = 1 + w_offset``,
Gemma's scaled embedding gives what each token writes, ``W_E * sqrt(d_model)``, rounded as the
checkpoint runs it (``writes()``). These are the weights TransformerLens' Gemma holds.
"""

from torch import Tensor, nn

from interp_transformer.compat.config import HookedTransformerConfig
from interp_transformer.compat.errors import CompatValueError
from interp_transformer.families import lens_of


def config_from_core(core_cfg, name: str, default_prepend_bos: bool | None) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of a loaded model's config (see the module docstring).

    The fields beyond the common ones are the family's TransformerLens mapping, handed in by its
    ``register(...)`` line (``families/<name>/lens.py``); a family without one says why on that line.
    """
    common = dict(
        d_model=core_cfg.d_model,
        d_head=core_cfg.d_head,
        n_layers=core_cfg.n_layers,
        n_ctx=core_cfg.n_ctx,
        n_heads=core_cfg.n_heads,
        d_vocab=core_cfg.d_vocab,
        act_fn=core_cfg.act_fn,
        model_name=name,
        default_prepend_bos=True if default_prepend_bos is None else default_prepend_bos,
        init_weights=False,
    )
    # the architecture of exactly this config class: a subclass (GPT-2 with adapters, SmolLM3's NoPE and sliding
    # layers) holds parts its parent's mapping cannot say
    architecture = lens_of(core_cfg)
    lens = None if architecture is None else architecture.lens
    fields = lens(core_cfg, common) if callable(lens) else None
    if fields is not None:
        return HookedTransformerConfig(**common, **fields)
    kind = type(core_cfg).__name__
    reason = f" (no HookedTransformerConfig says its parts: {lens})" if isinstance(lens, str) else ""
    raise CompatValueError(
        "HookedTransformer holds the decoders a HookedTransformerConfig describes (GPT-2, Llama, GPT-NeoX, pre-norm "
        f"OPT and Gemma 1/2/3 families); this checkpoint is a {kind} model: load it with "
        f"interp_transformer.from_pretrained{reason}"
    )


def state_dict_from_core(core: nn.Module, model: nn.Module, copy: bool) -> dict[str, Tensor]:
    """``model``'s weights read from ``core``'s parts (see the module docstring); ``copy``: share no memory with core.

    Strict both ways: each part of ``core`` holding parameters must have a counterpart in
    ``model`` holding as many, and each of ``model``'s parameters must be an attribute of
    its counterpart (``CompatValueError`` naming what is not), so no weight is dropped.
    """
    ours, theirs = _parameter_counts(model), _parameter_counts(core)
    differ = sorted(
        path or "(the model itself)" for path in set(ours) | set(theirs) if ours.get(path) != theirs.get(path)
    )
    if differ:
        raise CompatValueError(
            f"the HookedTransformer would not hold every weight of this {type(core.cfg).__name__} model: these parts "
            f"hold different numbers of parameters in the two ({differ})"
        )
    weights = {}
    for name in model.state_dict():
        path, _, attribute = name.rpartition(".")
        part = core.get_submodule(path)
        if attribute == "W_E" and (writes := getattr(part, "writes", None)) is not None:
            value = writes()  # what each token writes to the residual stream (Gemma: W_E * sqrt(d_model))
        elif isinstance(getattr(part, attribute, None), Tensor):
            value = getattr(part, attribute)
        else:
            raise CompatValueError(f"{type(part).__name__} at {path or 'the model'} has no weight {attribute!r}")
        weights[name] = value.detach().clone() if copy else value.detach()
    return weights


def _parameter_counts(model: nn.Module) -> dict[str, int]:
    """Each part holding parameters itself -> how many (its submodules' not counted)."""
    counts = {}
    for path, module in model.named_modules():
        count = len(list(module.parameters(recurse=False)))
        if count:
            counts[path] = count
    return counts


__all__ = ["config_from_core", "state_dict_from_core"]

"""Is a model processed the way an SAE expects? An SAE is valid only in the basis it was trained in.

SAELens loads the model an SAE trains on with
``HookedTransformer.from_pretrained_no_processing(**model_from_pretrained_kwargs)``:
no weight processing, except the steps those kwargs switch on (older releases
were trained on processed models, and their configs say e.g.
``{"center_writing_weights": true}``). Our model records the steps applied to
it in ``model.processing`` (see ``interp_transformer.models.processing``).

Each step changes the values of some hook points and leaves the others
exactly as they were (``interp_transformer.models.processing`` proves the logits
unchanged; its docstring says which activations move):

==========================  ===========================================================
step                        hook points whose values it changes
==========================  ===========================================================
``fold_ln``                 ``*.hook_normalized`` (it becomes the pure normalization)
``center_writing_weights``  the residual stream and what writes to it: ``hook_embed``,
                            ``hook_pos_embed``, ``hook_resid_*``, ``hook_attn_out``,
                            ``hook_mlp_out``, ``hook_result``
``center_unembed``          none (only the logits)
``fold_value_biases``       ``attn.hook_v``, ``attn.hook_z``, ``hook_result``
==========================  ===========================================================

So an SAE reading ``blocks.8.hook_resid_pre`` cares about
``center_writing_weights`` and nothing else.

One hook differs in meaning: TransformerLens takes ``hook_normalized`` before
the LayerNorm's ``w`` and ``b`` (the pure normalization ``(x - mean) / scale``),
ours after them. The two agree once ``fold_ln`` has set ``w = 1``, ``b = 0``, and
only then; so an SAE that reads or writes a ``hook_normalized`` needs
``fold_ln`` on our model whatever its kwargs say (in TransformerLens that hook
has the same value with or without ``fold_ln``). ``check_processing`` refuses a model
on which a step that changes one of the SAE's hooks differs from what the SAE
expects: a missing step can be applied (by the caller, or here with
``apply=True``), a step applied that the SAE did not expect cannot be undone.
"""

from collections.abc import Callable

from interp_transformer.models import processing as steps

# Hook-name leaves (the last dotted part) whose values each processing step changes.
CHANGES: dict[str, frozenset[str]] = {
    "fold_ln": frozenset({"hook_normalized"}),
    "center_writing_weights": steps.CENTERED_BY_CENTER_WRITING_WEIGHTS | {"hook_result"},
    "center_unembed": frozenset(),
    "fold_value_biases": frozenset({"hook_v", "hook_z", "hook_result"}),
    # TransformerLens can refactor W_Q W_K^T and W_V W_O; interp_transformer has no such step.
    "refactor_factored_attn_matrices": frozenset(
        {"hook_q", "hook_k", "hook_v", "hook_z", "hook_result", "hook_rot_q", "hook_rot_k"}
    ),
}
# The steps we can apply, in the order that keeps each exact.
APPLY: dict[str, Callable] = {
    "fold_ln": steps.fold_ln,
    "center_writing_weights": steps.center_writing_weights,
    "center_unembed": steps.center_unembed,
    "fold_value_biases": steps.fold_value_biases,
}


class ProcessingMismatch(ValueError):
    """The model's weight processing differs from the SAE's in a way that changes the SAE's hooks."""


def expected_steps(sae) -> list[str]:
    """The steps our model needs for its hooks to hold what the SAE was trained on (module docstring).

    Those the SAE's ``model_from_pretrained_kwargs`` switch on, plus ``fold_ln`` for an
    SAE at a ``hook_normalized``.
    """
    kwargs = sae.cfg.model_from_pretrained_kwargs
    hook_names = [name for name in (sae.hook_name, sae.hook_name_out) if name is not None]
    return [step for step in CHANGES if kwargs.get(step) is True or (step == "fold_ln" and _relevant(step, hook_names))]


def _relevant(step: str, hook_names: list[str]) -> list[str]:
    return [name for name in hook_names if name.rsplit(".", 1)[-1] in CHANGES[step]]


def check_processing(model, sae, apply: bool = False) -> list[str]:
    """Raise ``ProcessingMismatch`` unless ``model`` is processed as ``sae`` expects (module docstring).

    With ``apply=True`` a missing step is applied to ``model`` (in place, for good:
    each step leaves the logits unchanged) instead of refused. Returns the steps applied.
    """
    hook_names = [name for name in (sae.hook_name, sae.hook_name_out) if name is not None]
    expected = expected_steps(sae)
    applied = getattr(model, "processing", None)
    kwargs = sae.cfg.model_from_pretrained_kwargs
    where = f"the SAE at {sae.hook_name!r} (model_from_pretrained_kwargs={kwargs})"
    if applied is None:
        needed = [step for step in expected if _relevant(step, hook_names)]
        if needed:
            raise ProcessingMismatch(
                f"{where} expects {needed}, but {type(model).__name__} records no weight processing"
            )
        return []
    extra = [step for step in applied if step in CHANGES and step not in expected and _relevant(step, hook_names)]
    if extra:
        raise ProcessingMismatch(
            f"{where} was trained on a model without {extra}, which changes {_relevant(extra[0], hook_names)}; "
            f"this model has processing {applied}, and a step cannot be undone: load the model again and apply "
            f"only {[s for s in applied if s not in extra]}"
        )
    missing = [step for step in expected if step not in applied and _relevant(step, hook_names)]
    unsupported = [step for step in missing if step not in APPLY]
    if unsupported:
        raise ProcessingMismatch(f"{where} expects {unsupported}, which interp_transformer does not implement")
    if missing and not apply:
        calls = "; ".join(f"interp_transformer.models.processing.{step}(model)" for step in missing)
        raise ProcessingMismatch(
            f"{where} needs {missing} applied to this model: without it {_relevant(missing[0], hook_names)} do not "
            f"hold the values the SAE was trained on. This model has processing {applied}. Apply it first "
            f"({calls}), or pass apply_processing=True"
        )
    for step in APPLY:
        if step in missing:
            APPLY[step](model)
    return [step for step in APPLY if step in missing]


__all__ = ["CHANGES", "ProcessingMismatch", "check_processing", "expected_steps"]

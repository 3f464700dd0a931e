"""Verification: does our model compute what the Hugging Face model (or any reference module) computes, hook by hook?

``verify_against_hf(model, hf_model, tokens)`` runs both models on the same
tokens, takes Hugging Face's value for every hook the architecture module can map
(``hf_reference_activations``: embeddings, each block's residual stream,
LayerNorm outputs, q/k/v, attention patterns, z, attention and MLP outputs, the
final LayerNorm, logits) and our value from ``run_with_cache``, and reports per
hook the max and mean absolute difference. A hook is within tolerance when

    max |ours - hf| <= atol + rtol * max |hf|

(defaults by dtype: float32 ``atol=1e-4, rtol=1e-5``; float64 ``1e-9, 1e-10``;
bfloat16/float16 ``1e-2, 1e-2``). The logits row comes from a plain forward, the
path users run (fused attention when nothing is hooked).

Why these float32 numbers: activations of real checkpoints are not O(1). In
all-MiniLM-L6-v2 the MLP outputs and the residual stream before ``ln2`` reach ~200, and
two correct float32 implementations that sum in different orders differ there by up to
~5e-5 on real tokens (measured in ``docs/encoders.md``), so a flat ``1e-5`` would call
rounding a bug. ``rtol * max|hf|`` scales the tolerance with each hook's magnitude, and
the float64 re-run, which must agree to ``1e-9``, is what separates rounding from a bug.

Padding. Models take an attention mask (pass texts, the model's ``to_tokens_and_mask``
result, or ``attention_mask=`` in ``forward_kwargs``). Outputs at padding positions are
meaningless by definition, so only real positions are compared: every hook indexed
``[batch, pos, ...]`` at the positions the mask marks real, and attention patterns
``[batch, head_index, query_pos, key_pos]`` on real query rows (their padding keys
included: both models must give them exactly 0 weight).

When some hook is beyond tolerance and ``float64_recheck`` is on, both models are
copied to float64 and compared again: if float64 agrees, the differences were
floating-point noise, not a bug. ``report.ok`` is True when every hook is within
tolerance, or when the float64 re-run is.

Supported versions. The references are tested with the ``transformers`` releases in
``loading.versions.SUPPORTED_TRANSFORMERS`` (the range ``pyproject.toml`` states); outside
it, ``verify_against_hf`` warns, naming the range, and still runs.

``verify_against_module(model, reference, tokens, hook_map)`` does the same against
any ``nn.Module`` (a model you wrote yourself): ``hook_map`` says which of its
submodules' outputs (or inputs) hold each of our hooks' values.

Weight processing (``interp_transformer.models.processing``) changes some activations
on purpose; hooks a recorded step changes are skipped and listed in
``report.skipped``, and after ``center_unembed`` log-probs are compared instead
of logits.
"""

import copy
import difflib
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from interp_transformer.families.versions import warn_if_untested_transformers
from interp_transformer.loading import architecture_module, load_with_source, resolve_dtype
from interp_transformer.verify.checks import check_vocabularies, real_part, skipped_hooks
from interp_transformer.verify.report import VerifyReport, VerifyRow

DEFAULT_TOLERANCES = {  # dtype -> (atol, rtol)
    torch.float64: (1e-9, 1e-10),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (1e-2, 1e-2),
}
DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog. Verification comes before interpretation."
# a model whose converter asks for it (VERIFY_PADDED, e.g. BERT) is verified on a padded batch by
# default: the mask is part of what must match
DEFAULT_PADDED_PROMPTS = (
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "Verification comes before interpretation, and padding must never change a real token.",
)
DEFAULT_ENCODER_PROMPTS = DEFAULT_PADDED_PROMPTS


ReferenceFn = Callable[..., dict]  # (reference_model, tokens, **forward_kwargs) -> {hook name or "logits": tensor}


def _hf_reference(hf_model, tokens: Tensor, **forward_kwargs) -> dict:
    """Hugging Face's activations under our hook names, from the architecture's converter module."""
    return architecture_module(hf_model.config.model_type).hf_reference_activations(hf_model, tokens, **forward_kwargs)


def _compare(
    model, reference_model, reference_fn: ReferenceFn, tokens: Tensor, atol, rtol, forward_kwargs
) -> VerifyReport:
    dtype = next(model.parameters()).dtype
    default_atol, default_rtol = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES[torch.float32])
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    reference = reference_fn(reference_model, tokens, **forward_kwargs)
    processing = list(getattr(model, "processing", []))
    skipped = skipped_hooks(list(reference), processing)
    hook_names = [name for name in model.hook_dict if name in reference and name not in skipped]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=hook_names, **forward_kwargs) if hook_names else (None, {})
        ours = {name: cache[name] for name in hook_names}
        if "logits" in reference:
            ours["logits"] = model(tokens, **forward_kwargs)  # no hooks: the fused path users run
    if "logits" in reference and "center_unembed" in processing:
        reference["log_probs"] = reference.pop("logits").double().log_softmax(-1)
        ours["log_probs"] = ours.pop("logits").double().log_softmax(-1)
    mask = forward_kwargs.get("attention_mask")
    is_real = None if mask is None or bool(mask.bool().all()) else mask.bool().cpu()
    rows = []
    for name, value in ours.items():
        ref = reference[name].detach().to("cpu", torch.float64)
        if ref.shape != value.shape and ref.ndim < value.ndim and _broadcasts(ref.shape, value.shape):
            ref = ref.expand(value.shape)  # the same for every row (e.g. positional embeddings)
        if ref.shape != value.shape:
            raise ValueError(
                f"{name}: our activation has shape {tuple(value.shape)}, the reference's {tuple(ref.shape)}"
            )
        ref = real_part(name, ref, is_real)
        diff = (real_part(name, value.detach().to("cpu", torch.float64), is_real) - ref).abs()
        # Masked attention entries are 0 in both; nan only if something is badly wrong.
        max_diff = float(diff.max()) if diff.numel() else 0.0
        max_diff = float("inf") if diff.isnan().any() else max_diff
        tolerance = atol + rtol * float(ref.abs().max())
        rows.append(VerifyRow(name, max_diff, float(diff.mean()), tolerance, max_diff <= tolerance))
    real_positions = None if is_real is None else int(is_real.sum())
    return VerifyReport(
        rows,
        dtype,
        atol,
        rtol,
        tuple(tokens.shape),
        sorted(skipped, key=list(reference).index),
        processing,
        real_positions=real_positions,
    )


def _broadcasts(shape: torch.Size, to: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(shape, to) == to
    except RuntimeError:
        return False


def _float64_copy(module):
    """A float64 copy of ``module``; its float32 weights are converted once, never copied first."""
    memo = {id(p): torch.nn.Parameter(p.detach().to(torch.float64), p.requires_grad) for p in module.parameters()}
    memo.update({id(b): b.to(torch.float64) if b.is_floating_point() else b.clone() for b in module.buffers()})
    tokenizer = getattr(module, "tokenizer", None)
    if tokenizer is not None:
        memo[id(tokenizer)] = tokenizer  # share, don't copy, the tokenizer
    return copy.deepcopy(module, memo).to(torch.float64)


def _is_encoded(value) -> bool:
    """A tokenizer result that carries the forward's other arguments: a NamedTuple whose first field is ``tokens``."""
    return isinstance(value, tuple) and getattr(value, "_fields", ("",))[0] == "tokens"


def verify_against_hf(
    model,
    hf_model,
    tokens,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    float64_recheck: bool | str = True,
    **forward_kwargs,
) -> VerifyReport:
    """Compare ``model`` with ``hf_model`` on ``tokens`` hook by hook; see the module docstring.

    ``tokens``: ``[batch, pos]`` ids, text (a str or a list, tokenized by the model's
    ``to_tokens_and_mask``: a list is padded and brings its attention mask), or such a
    tokenizer result (``TokensAndMask``, an encoder's ``EncoderTokens`` with segment ids).
    ``atol`` / ``rtol`` default by the model's dtype. ``float64_recheck``: True re-runs both models in float64 (on
    copies) when
    something is beyond tolerance; ``"always"`` re-runs even when all is within
    tolerance; False never. ``forward_kwargs`` go to both forwards (e.g.
    ``attention_mask`` and ``token_type_ids`` for an encoder); with a mask, padding
    positions are left out of the comparison. Neither model is changed.
    """
    if not isinstance(getattr(getattr(hf_model, "config", None), "model_type", None), str):
        raise TypeError(
            f"hf_model must be a Hugging Face transformers model (with .config.model_type), received "
            f"{type(hf_model).__name__}"
        )
    warn_if_untested_transformers()
    if not hasattr(model, "hook_dict") or not hasattr(model, "run_with_cache"):
        raise TypeError(
            f"model must be one of ours (a DemoTransformer or EncoderTransformer), received {type(model).__name__}"
        )
    if isinstance(tokens, (str, list)):
        tokens = model.to_tokens_and_mask(tokens)
    if _is_encoded(tokens):  # (tokens, attention_mask, ...): the model's forward arguments, by name
        extra = dict(tokens._asdict())
        tokens = extra.pop("tokens")
        given = sorted(set(forward_kwargs) & set(extra))
        if given:
            raise ValueError(
                f"tokens carries its own mask and the forward's other arguments {sorted(extra)}: "
                f"do not also pass {given}"
            )
        forward_kwargs.update(extra)
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.ndim != 2:
        raise TypeError(
            f"tokens must be an integer tensor [batch, pos], text, or the model's to_tokens_and_mask(...), "
            f"received {tokens!r:.80}"
        )
    check_vocabularies(model, hf_model, tokens)
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    forward_kwargs = {
        name: value.to(device) if isinstance(value, Tensor) else value for name, value in forward_kwargs.items()
    }
    return _report_with_recheck(model, hf_model, _hf_reference, tokens, atol, rtol, float64_recheck, forward_kwargs)


def _report_with_recheck(
    model, reference_model, reference_fn, tokens, atol, rtol, float64_recheck, forward_kwargs
) -> VerifyReport:
    if float64_recheck not in (True, False, "always"):
        raise ValueError(f"float64_recheck must be True, False or 'always', received {float64_recheck!r}")
    report = _compare(model, reference_model, reference_fn, tokens, atol, rtol, forward_kwargs)
    needs_recheck = float64_recheck == "always" or (float64_recheck and not report.within_tolerance)
    if needs_recheck and report.dtype != torch.float64:
        report.float64 = _compare(
            _float64_copy(model), _float64_copy(reference_model), reference_fn, tokens, None, None, forward_kwargs
        )
    return report


def _input_recorder(captured: dict, name: str) -> Callable:
    """A forward pre-hook storing the module's first positional input under ``name``."""
    return lambda mod, args: captured.__setitem__(name, args[0].detach())


def _output_recorder(captured: dict, name: str) -> Callable:
    """A forward hook storing the module's output (the first element of a tuple output) under ``name``."""
    return lambda mod, args, out: captured.__setitem__(name, (out[0] if isinstance(out, tuple) else out).detach())


def capture_activations(
    module: nn.Module, hook_map: Mapping[str, str], run: Callable[[], object]
) -> tuple[dict, object]:
    """Call ``run()`` with torch hooks on ``module``'s submodules; return ``({name: tensor}, run's result)``.

    ``hook_map`` maps a name (ours, e.g. ``"blocks.0.hook_attn_out"``) to where the value
    is in ``module``: ``"path.to.submodule"`` (its output; the first element of a tuple
    output) or ``"path.to.submodule:input"`` (its first positional input). Every hook is
    removed afterwards, also when ``run`` raises. An unknown path raises ``KeyError``
    naming the closest submodule names.
    """
    submodules = dict(module.named_modules())
    captured: dict[str, Tensor] = {}
    handles: list = []
    try:
        for name, where in hook_map.items():
            path, _, side = where.partition(":")
            if path not in submodules:
                close = difflib.get_close_matches(path, submodules, n=3)
                raise KeyError(
                    f"{where!r} (for {name!r}) names no submodule of {type(module).__name__}; closest: {close}"
                )
            if side not in ("", "input"):
                raise ValueError(f"{where!r}: the part after ':' must be 'input', got {side!r}")
            if side == "input":
                handles.append(submodules[path].register_forward_pre_hook(_input_recorder(captured, name)))
            else:
                handles.append(submodules[path].register_forward_hook(_output_recorder(captured, name)))
        with torch.no_grad():
            result = run()
    finally:
        for handle in handles:
            handle.remove()
    return captured, result


def verify_against_module(
    model,
    reference: nn.Module,
    tokens: Tensor,
    hook_map: Mapping[str, str],
    *,
    logits: bool = True,
    atol: float | None = None,
    rtol: float | None = None,
    float64_recheck: bool | str = True,
    reference_kwargs: Mapping | None = None,
    **forward_kwargs,
) -> VerifyReport:
    """Compare ``model`` hook by hook with any ``nn.Module`` that computes the same thing (your own model, say).

    ``reference(tokens, **reference_kwargs)`` must return the logits (or a tuple whose first element
    is them) when ``logits`` is True; ``hook_map`` says where each of our hooks' values lies in it
    (see ``capture_activations``). ``forward_kwargs`` go to our model only (an ``attention_mask``, an
    encoder-decoder's ``decoder_input``), ``reference_kwargs`` to the reference only (its own names for
    them). The report reads like ``verify_against_hf``'s, float64 re-run included (on copies of both).
    """
    if not isinstance(reference, nn.Module):
        raise TypeError(f"reference must be a torch nn.Module, received {type(reference).__name__}")
    unknown = [name for name in hook_map if name not in model.hook_dict]
    if unknown:
        raise KeyError(f"hook_map names hooks the model does not have: {unknown}")

    def reference_fn(reference_model, tokens, **kwargs):
        acts, output = capture_activations(
            reference_model, hook_map, lambda: reference_model(tokens, **(reference_kwargs or {}))
        )
        if logits:
            acts["logits"] = (output[0] if isinstance(output, tuple) else output).detach()
        return acts

    device = next(model.parameters()).device
    return _report_with_recheck(
        model, reference.eval(), reference_fn, tokens.to(device), atol, rtol, float64_recheck, forward_kwargs
    )


def verify_pretrained(
    source,
    prompt: None | str | list[str] = None,
    *,
    dtype: torch.dtype | str = torch.float32,
    atol: float | None = None,
    rtol: float | None = None,
    float64_recheck: bool | str = True,
    **load_kwargs,
) -> VerifyReport:
    """Load ``source`` both as our model and as the Hugging Face model, and verify one against the other.

    ``prompt`` (a text or a list of texts) is tokenized with the model's tokenizer:
    a fixed sentence by default, or ``DEFAULT_PADDED_PROMPTS``, a padded batch of
    sentences of different lengths, where the architecture's converter asks for it
    (``VERIFY_PADDED``; BERT), so that the padding mask is verified too;
    seeded random tokens when the model has no tokenizer. ``load_kwargs`` go to
    ``from_pretrained`` (e.g. ``local_files_only=True``).
    """
    dtype = resolve_dtype(dtype)
    model, resolved = load_with_source(source, dtype=dtype, **load_kwargs)
    if resolved.hf_model is not None:
        hf_model = resolved.hf_model
    elif resolved.reference is not None:
        hf_model = resolved.reference(dtype)
    else:
        module = architecture_module(resolved.model_type)
        if hasattr(module, "load_hf_model"):
            hf_model = module.load_hf_model(resolved.directory, dtype=dtype)
        else:
            from transformers import AutoModel

            hf_model = AutoModel.from_pretrained(
                str(resolved.directory), dtype=dtype, attn_implementation="eager"
            ).eval()
    if model.tokenizer is not None:
        default = (
            list(DEFAULT_PADDED_PROMPTS)
            if getattr(architecture_module(resolved.model_type), "VERIFY_PADDED", False)
            else DEFAULT_PROMPT
        )
        tokens = model.to_tokens_and_mask(default if prompt is None else prompt)
    elif prompt is not None:
        raise ValueError(f"{resolved.description} has no tokenizer, so the prompt cannot be tokenized; omit the prompt")
    else:
        padding = {
            getattr(model.cfg, "pad_token_id", None),
            getattr(getattr(hf_model, "config", None), "pad_token_id", None),
        }
        tokens = random_ids(model.cfg.d_vocab, min(16, model.cfg.n_ctx), avoid=padding - {None})
    return verify_against_hf(model, hf_model, tokens, atol=atol, rtol=rtol, float64_recheck=float64_recheck)


def random_ids(d_vocab: int, length: int, avoid: set | frozenset = frozenset(), seed: int = 0) -> torch.Tensor:
    """``[1, length]`` seeded random token ids in ``[0, d_vocab)``, none of them in ``avoid`` (a padding id would be
    masked)."""
    skipped = sorted(token for token in avoid if 0 <= token < d_vocab)
    ids = torch.randint(0, d_vocab - len(skipped), (1, length), generator=torch.Generator().manual_seed(seed))
    for token in skipped:  # ascending: each id at or past a skipped one moves up by one
        ids = ids + (ids >= token).long()
    return ids


def run_verify(
    source: str, prompt: None | str | list[str] = None, dtype: torch.dtype | str = torch.float32
) -> VerifyReport:
    """Entry point for ``interp-transformer verify SOURCE``: ``verify_pretrained`` with the CLI's arguments."""
    return verify_pretrained(source, prompt, dtype=dtype)


__all__ = [
    "DEFAULT_ENCODER_PROMPTS",
    "DEFAULT_PADDED_PROMPTS",
    "capture_activations",
    "verify_against_module",
    "DEFAULT_TOLERANCES",
    "VerifyReport",
    "VerifyRow",
    "run_verify",
    "verify_against_hf",
    "verify_pretrained",
]

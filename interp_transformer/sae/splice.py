"""Splicing SAEs and transcoders into a model: the reconstruction replaces the activation.

Inside ``with splice_saes(model, [sae]):``

- at ``sae.hook_name`` the model's activation ``x`` is replaced by the SAE's
  output ``sae(x)`` (with ``use_error_term=True``, by
  ``sae(x) + (x - sae_clean(x))``, where ``sae_clean`` is the SAE run without
  any hook: the model computes exactly what it computed before until a hook
  edits a feature; as in SAELens the error term carries no gradient);
- a transcoder reads its input at ``hook_name`` and replaces the activation at
  ``hook_name_out`` (the MLP's output, typically); its error term is
  ``activation_at_hook_name_out - transcoder_clean(input)``;
- a ``hook_z`` SAE flattens the heads of ``[batch, pos, head_index, d_head]``
  and restores them; an SAE with ``hook_head_index = h`` reads and replaces
  head ``h`` only;
- the SAE's hook points are children of the hook point it writes at, so they
  appear in ``model.hook_dict`` as ``<hook>.hook_sae_input``, ``.hook_sae_acts_pre``,
  ``.hook_sae_acts_post``, ``.hook_sae_recons``, ``.hook_sae_error``,
  ``.hook_sae_output`` (SAELens' names and places: a transcoder's are under
  ``hook_name_out``). ``model.run_with_cache`` caches them and
  ``model.run_with_hooks`` edits them, e.g. ablates a feature at
  ``<hook>.hook_sae_acts_post``; ``model.hook_shapes`` and
  ``model.estimate_cache_bytes`` (dry runs on the ``meta`` device) include them;
- with ``exclude_special_tokens`` (``True``: the tokenizer's BOS, EOS, PAD, SEP
  and decoder-start ids; or a list of token ids) those positions bypass the
  SAE: the model's own activation flows on there, and their error is 0.

Order at one hook point: hook functions run in the order they were attached,
and the splice attaches the SAE when it begins. Hooks attached before (an
enclosing ``model.hooks(...)``) edit what the SAE reads; hooks attached inside
(``run_with_cache``, ``run_with_hooks``) see, and may edit, what it writes.

The model must be processed as the SAE expects (``sae.processing``);
``apply_processing=True`` applies a missing step. On exit, also when the body
raises, every hook point, ``model.hook_dict`` and the SAEs' own hook points are
as before (hooks attached to an SAE's hook points inside the block are
removed). A model is not meant to be spliced from two threads at once.
"""

import contextlib
import difflib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from interp_transformer.sae.processing import check_processing
from interp_transformer.sae.sae import HOOK_NAMES, SAE
from interp_transformer.text.special_tokens import SpecialTokens, special_token_ids

SAEs = SAE | Sequence[SAE]


def _hook_point(model, name: str, role: str):
    if name not in model.hook_dict:
        close = difflib.get_close_matches(name, list(model.hook_dict), n=3, cutoff=0.5)
        raise KeyError(f"the SAE's {role} {name!r} is not a hook point of this model; closest: {close}")
    return model.hook_dict[name]


class _BypassMask:
    """Per forward: a ``[batch, pos]`` bool mask of the positions whose token is a special token."""

    def __init__(self, model, token_ids: list[int]):
        self.model = model
        self.token_ids = torch.tensor(token_ids, dtype=torch.long)
        self.mask: Tensor | None = None

    def before_forward(self, module, args, kwargs) -> None:
        tokens = args[0] if args else kwargs.get("tokens")
        if isinstance(tokens, (str, list)):
            tokens = self.model.to_tokens(tokens)
        if not isinstance(tokens, Tensor) or tokens.is_floating_point():
            raise TypeError(f"exclude_special_tokens needs the model's input tokens, got {type(tokens).__name__}")
        tokens = tokens.unsqueeze(0) if tokens.ndim == 1 else tokens
        self.mask = torch.isin(tokens, self.token_ids.to(tokens.device))

    def after_forward(self, module, args, output) -> None:
        self.mask = None

    def for_activation(self, activation: Tensor, hook_name: str) -> Tensor:
        """The mask, broadcastable over ``activation [batch, pos, ...]``."""
        if self.mask is None:
            raise ValueError(f"{hook_name} ran outside a forward of the model: the special-token mask is unknown")
        if tuple(activation.shape[:2]) != tuple(self.mask.shape):
            raise ValueError(
                f"{hook_name} has batch and pos {tuple(activation.shape[:2])}, the tokens {tuple(self.mask.shape)}"
            )
        return self.mask.to(activation.device).reshape(*self.mask.shape, *([1] * (activation.ndim - 2)))


def spliced_output(sae: SAE, x: Tensor, activation: Tensor, use_error_term: bool, bypass: Tensor | None) -> Tensor:
    """What flows on where ``sae`` writes, given its input ``x`` and the model's ``activation`` there."""
    sae.check_input(x)
    out = sae.reconstruct(x)
    if out.shape != activation.shape:
        raise ValueError(
            f"the SAE writes shape {list(out.shape)} at {sae.hook_name_out or sae.hook_name}, where the model's "
            f"activation has shape {list(activation.shape)} (d_out={sae.d_out})"
        )
    if use_error_term:
        with torch.no_grad():
            error = activation.to(out.dtype) - sae.reconstruct(x, hooked=False)
            if bypass is not None:
                error = torch.where(bypass, torch.zeros_like(error), error)
            error = sae.hook_sae_error(error)
        out = out + error
    if bypass is not None:
        out = torch.where(bypass, activation.to(out.dtype), out)
    return sae.hook_sae_output(out).to(activation.dtype)


@contextlib.contextmanager
def weights_on_meta(sae: SAE) -> Iterator[None]:
    """The SAE's weights swapped for ``meta`` tensors of the same shapes: for the model's shape-only dry
    runs (``hook_shapes``, ``estimate_cache_bytes``), which run on PyTorch's ``meta`` device."""
    real = dict(sae._parameters)
    try:
        for name, weight in real.items():
            if weight is None:  # a parameter registered as None has no weight to swap
                continue
            sae._parameters[name] = torch.nn.Parameter(torch.empty_like(weight, device="meta"), weight.requires_grad)
        yield
    finally:
        sae._parameters.update(real)


class _Splice:
    """One SAE in one model: its hook points attached, its reading and writing hooks added."""

    def __init__(self, model, sae: SAE, use_error_term: bool, bypass: _BypassMask | None):
        if sae.hook_name is None:
            raise ValueError("the SAE's config has no metadata.hook_name: it does not say where it belongs in a model")
        self.sae, self.use_error_term, self.bypass = sae, use_error_term, bypass
        self.read_name = sae.hook_name
        self.write_name = sae.hook_name_out or sae.hook_name
        self.read_point = _hook_point(model, self.read_name, "hook_name")
        self.write_point = _hook_point(model, self.write_name, "hook_name_out" if sae.hook_name_out else "hook_name")
        if any(name in self.write_point._modules for name in HOOK_NAMES):
            raise ValueError(f"{self.write_name} already has an SAE spliced in")
        head = sae.cfg.hook_head_index
        if head is not None and (not isinstance(head, int) or isinstance(head, bool) or sae.is_transcoder):
            raise ValueError(f"hook_head_index must be an int, on an SAE that is not a transcoder; got {head!r}")
        self.captured: Tensor | None = None
        self.added: list = []  # (hook point, handle) of the hooks this splice added to the model
        self.sae_hooks_before = {name: list(getattr(sae, name)._hooks) for name in HOOK_NAMES}

    def attach(self) -> None:
        for name in HOOK_NAMES:
            self.write_point.add_module(name, getattr(self.sae, name))
        if self.read_point is not self.write_point:
            self.added.append((self.read_point, self.read_point.add_hook(self.capture, is_permanent=True)))
        self.added.append((self.write_point, self.write_point.add_hook(self.replace, is_permanent=True)))

    def detach(self) -> None:
        for point, handle in self.added:
            point.remove_hook(handle)
        for name in HOOK_NAMES:
            if self.write_point._modules.get(name) is getattr(self.sae, name):
                delattr(self.write_point, name)
            point = getattr(self.sae, name)
            for hook in list(point._hooks):
                if hook not in self.sae_hooks_before[name]:
                    point.remove_hook(hook)
        self.captured = None

    def capture(self, activation: Tensor, hook) -> None:
        self.captured = activation

    def replace(self, activation: Tensor, hook) -> Tensor:
        x: Tensor | None
        if self.read_point is self.write_point:
            x = activation
        else:
            x, self.captured = self.captured, None
            if x is None:
                raise ValueError(
                    f"the transcoder writes at {self.write_name} before it has read {self.read_name} in this forward"
                )
        with weights_on_meta(self.sae) if activation.is_meta else contextlib.nullcontext():
            head = self.sae.cfg.hook_head_index
            if head is None:
                bypass = self.bypass.for_activation(activation, self.write_name) if self.bypass is not None else None
                return spliced_output(self.sae, x, activation, self.use_error_term, bypass)
            one_head = activation[..., head, :]
            bypass = self.bypass.for_activation(one_head, self.write_name) if self.bypass is not None else None
            replaced = activation.clone()
            replaced[..., head, :] = spliced_output(self.sae, x[..., head, :], one_head, self.use_error_term, bypass)
            return replaced


def _as_list(saes: SAEs) -> list[SAE]:
    saes = [saes] if isinstance(saes, SAE) else list(saes)
    for sae in saes:
        if not isinstance(sae, SAE):
            raise TypeError(f"saes must be SAE objects (interp_transformer.sae.SAE), got {type(sae).__name__}")
    if len({id(sae) for sae in saes}) != len(saes):
        raise ValueError("the same SAE is listed twice: its hook points can sit in one place only")
    return saes


@contextlib.contextmanager
def splice_saes(
    model,
    saes: SAEs,
    *,
    use_error_term: bool = False,
    exclude_special_tokens: SpecialTokens = False,
    apply_processing: bool = False,
) -> Iterator:
    """Splice ``saes`` into ``model`` for the body of a ``with`` block (see the module docstring)."""
    saes = _as_list(saes)
    if not isinstance(use_error_term, bool):
        raise TypeError(f"use_error_term must be a bool, got {use_error_term!r}")
    token_ids = special_token_ids(model, exclude_special_tokens)
    bypass = _BypassMask(model, token_ids) if token_ids is not None else None
    splices = [_Splice(model, sae, use_error_term, bypass) for sae in saes]
    writes = [splice.write_name for splice in splices]
    twice = sorted({name for name in writes if writes.count(name) > 1})
    if twice:
        raise ValueError(f"two SAEs write at {twice}: splice one SAE per hook point")
    for sae in saes:
        check_processing(model, sae, apply=apply_processing)
    hook_dict = model.hook_dict
    attached: list[_Splice] = []
    handles = []
    try:
        for splice in splices:
            attached.append(splice)
            splice.attach()
        if bypass is not None:
            handles.append(model.register_forward_pre_hook(bypass.before_forward, with_kwargs=True))
            handles.append(model.register_forward_hook(bypass.after_forward, always_call=True))
        model.setup()
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for splice in reversed(attached):
            splice.detach()
        model.setup()
        model.hook_dict = hook_dict
        for sae in saes:
            sae.setup()


SPLICE_OPTIONS = ("use_error_term", "exclude_special_tokens", "apply_processing")


def _splice_for_call(model, saes: SAEs, kwargs: dict) -> tuple[contextlib.AbstractContextManager, dict]:
    """``splice_saes`` with the splice's own options taken out of ``kwargs``; the rest go to the call."""
    options = {name: kwargs.pop(name) for name in SPLICE_OPTIONS if name in kwargs}
    return splice_saes(model, saes, **options), kwargs


def run_with_saes(model, *model_args, saes: SAEs, **forward_kwargs):
    """``model(*model_args, **forward_kwargs)`` with ``saes`` spliced in for this one call.

    ``use_error_term``, ``exclude_special_tokens`` and ``apply_processing`` are ``splice_saes``'s."""
    splice, forward_kwargs = _splice_for_call(model, saes, forward_kwargs)
    with splice:
        return model(*model_args, **forward_kwargs)


def run_with_cache_with_saes(model, *model_args, saes: SAEs, **run_with_cache_kwargs):
    """``model.run_with_cache(...)`` with ``saes`` spliced in: ``(output, cache)``, SAE activations included.

    ``use_error_term``, ``exclude_special_tokens`` and ``apply_processing`` are ``splice_saes``'s."""
    splice, run_with_cache_kwargs = _splice_for_call(model, saes, run_with_cache_kwargs)
    with splice:
        return model.run_with_cache(*model_args, **run_with_cache_kwargs)


__all__ = ["run_with_cache_with_saes", "run_with_saes", "special_token_ids", "spliced_output", "splice_saes"]

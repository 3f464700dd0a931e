"""Adding a steering vector to the residual stream, with hooks that are gone when the block ends.

``steering(model, vector, hook, strength, positions)`` is a context manager: inside it every
forward of the calling thread adds ``strength * vector`` to the activation at ``hook``
(``[batch pos d_model]``), at every position (``positions=None``) or at the chosen ones.
A ``[n, d_model]`` vector (ActAdd's, one row per position) adds row ``i`` at ``positions[i]``
(default: the first ``n`` positions). The hooks are the model's ``hooks()`` block's, so they
belong to the calling thread: another thread running the same model meanwhile sees no steering,
and they are removed when the block exits, also when it raises or is interrupted.

Positions index the sequence each forward sees. Generation with a key/value cache feeds one
token per step after the prompt, so steering chosen positions while generating needs
``use_kv_cache=False`` (``steered_generate`` does this); with ``positions=None`` the cache is fine.

Every check of what a steering call takes lives here (``check_steering``), so every entry
(vectors, the sweep, the command line) refuses the same bad input the same way: a vector of the
wrong width, dtype or rank, a non-finite vector or strength, a hook name the model does not have
(``KeyError`` with the closest names), positions outside the prompt.

>>> import torch
>>> from interp_transformer.builder import build_decoder
>>> model = build_decoder(d_model=16, n_layers=1, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=8, seed=0)
>>> tokens = torch.tensor([[1, 2, 3]])
>>> with steering(model, torch.ones(16), "blocks.0.hook_resid_post", strength=2.0):
...     steered = model(tokens)
>>> bool((steered != model(tokens)).any()), model.hook_dict["blocks.0.hook_resid_post"].has_hooks()
(True, False)
"""

import contextlib
import math
import numbers
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

Positions = Sequence[int] | None


def check_hook(model, hook: str) -> str:
    """``hook`` if the model has a hook point of that name; ``KeyError`` with the closest names otherwise."""
    if not isinstance(hook, str):
        raise TypeError(f"the steering hook must be a hook name (str), got {type(hook).__name__} {hook!r}")
    model.resolve_hook_names([hook])  # KeyError: "no hook point named ...; closest: [...]"
    return hook


def check_strength(strength) -> float:
    """``strength`` as a finite float; ``TypeError``/``ValueError`` naming the value otherwise."""
    if isinstance(strength, Tensor) and strength.numel() == 1:
        strength = strength.item()
    if isinstance(strength, bool) or not isinstance(strength, numbers.Real):
        raise TypeError(f"the steering strength must be a real number, got {type(strength).__name__} {strength!r}")
    if not math.isfinite(float(strength)):
        raise ValueError(f"the steering strength must be finite, got {strength!r}")
    return float(strength)


def check_vector(model, vector, what: str = "steering vector") -> Tensor:
    """``vector`` (``[d_model]``, or ``[n, d_model]`` for one row per position), checked against the model.

    ``TypeError`` for a non-tensor or a dtype other than the model's; ``ValueError`` for another width or rank,
    or a NaN/inf entry. Returned on the model's device (the dtype is never converted silently)."""
    if not isinstance(vector, Tensor):
        raise TypeError(f"the {what} must be a torch.Tensor [d_model={model.cfg.d_model}], got {type(vector).__name__}")
    dtype = model.W_E.dtype
    if vector.dtype != dtype:
        raise TypeError(
            f"the {what} is {vector.dtype}; the model runs in {dtype}: convert it (vector.to({dtype})) so the sum "
            "is computed in the model's precision"
        )
    if vector.ndim not in (1, 2) or vector.shape[-1] != model.cfg.d_model:
        raise ValueError(
            f"the {what} must have shape [d_model={model.cfg.d_model}] (or [positions, d_model] for one row per "
            f"position), got {list(vector.shape)}"
        )
    if not bool(torch.isfinite(vector).all()):
        bad = (~torch.isfinite(vector)).nonzero().tolist()[:4]
        raise ValueError(f"the {what} has non-finite entries (NaN or inf) at {bad}: it would make every logit NaN")
    return vector.detach().to(model.W_E.device)


def check_positions(positions: Positions, vector: Tensor, n_positions: int | None = None) -> list[int] | None:
    """``positions`` as a list of ints (``None``: every position, for a ``[d_model]`` vector).

    A ``[n, d_model]`` vector needs ``n`` positions (default ``0..n-1``). With ``n_positions`` (the prompt's length)
    each position must lie in ``[-n_positions, n_positions)``: ``ValueError`` naming the prompt's length and the
    positions outside it."""
    if positions is None:
        if vector.ndim == 2:
            positions = list(range(vector.shape[0]))
        else:
            return None
    if isinstance(positions, Tensor):
        positions = positions.tolist()
    if isinstance(positions, (bool, str, bytes)) or not isinstance(positions, Sequence):
        raise TypeError(f"positions must be None or a sequence of ints, got {type(positions).__name__} {positions!r}")
    if not positions:
        raise ValueError("positions is empty: give at least one position, or None to steer every position")
    if any(isinstance(p, bool) or not isinstance(p, numbers.Integral) for p in positions):
        raise TypeError(f"positions must be ints, got {list(positions)!r}")
    positions = [int(p) for p in positions]
    if vector.ndim == 2 and len(positions) != vector.shape[0]:
        raise ValueError(
            f"a steering vector of {vector.shape[0]} rows is added at one position per row: got {len(positions)} "
            f"positions {positions}"
        )
    if n_positions is not None:
        outside = [p for p in positions if not -n_positions <= p < n_positions]
        if outside:
            raise ValueError(
                f"positions {outside} lie outside the prompt of {n_positions} tokens (valid: 0..{n_positions - 1}, "
                f"or -{n_positions}..-1)"
            )
    return positions


def check_steering(model, vector, hook: str, strength, positions: Positions = None, n_positions: int | None = None):
    """``(vector, hook, strength, positions)`` checked (see the ``check_*`` functions): the one place a steering
    call's input is checked."""
    hook = check_hook(model, hook)
    vector = check_vector(model, vector)
    return vector, hook, check_strength(strength), check_positions(positions, vector, n_positions)


def steering_hook(vector: Tensor, strength: float, positions: list[int] | None, hook_name: str):
    """The hook function: ``activation + strength * vector`` at ``positions`` (every position when None)."""
    delta = strength * vector

    def add_steering(activation: Tensor, hook) -> Tensor:
        if activation.ndim != 3 or activation.shape[-1] != vector.shape[-1]:
            raise ValueError(
                f"steering at {hook_name} adds a vector of width {vector.shape[-1]} to a [batch pos width] "
                f"activation; this hook's activation has shape {list(activation.shape)}: steer a residual hook"
            )
        if positions is None:
            return activation + delta
        n = activation.shape[1]
        outside = [p for p in positions if not -n <= p < n]
        if outside:
            raise ValueError(
                f"steering positions {outside} lie outside the {n} positions this forward sees at {hook_name} "
                "(a key/value cache feeds one position per step: generate with use_kv_cache=False to steer chosen "
                "positions)"
            )
        steered = activation.clone()
        steered[:, positions] += delta  # [d_model] broadcasts over the positions; [n, d_model] adds row by row
        return steered

    return add_steering


@contextlib.contextmanager
def steering(
    model,
    vector: Tensor,
    hook: str | Sequence[str],
    strength: float = 1.0,
    positions: Positions = None,
) -> Iterator[None]:
    """Within the block, this thread's forwards add ``strength * vector`` at ``hook`` (module docstring).

    ``hook`` may be a list of hook names (the same vector added at each). Exactly the hooks added here are removed
    on exit, also when the body raises."""
    hooks = [hook] if isinstance(hook, str) else list(hook)
    if not hooks:
        raise ValueError("no hook to steer at: give a hook name such as 'blocks.3.hook_resid_post'")
    fwd_hooks = []
    for name in hooks:
        checked, name, strength_value, where = check_steering(model, vector, name, strength, positions)
        fwd_hooks.append((name, steering_hook(checked, strength_value, where, name)))
    with model.hooks(fwd_hooks=fwd_hooks):
        yield


def steered_generate(
    model,
    tokens: Tensor,
    vector: Tensor,
    hook: str,
    strength: float = 1.0,
    positions: Positions = None,
    attention_mask: Tensor | None = None,
    max_new_tokens: int = 20,
    **generate_kwargs,
) -> Tensor:
    """``model.generate`` (greedy unless ``temperature`` is given) with steering: the prompt ``tokens [batch pos]``
    and its continuation. Chosen ``positions`` are checked against the prompt and generated without the key/value
    cache, so they keep their meaning at every step."""
    _, _, _, where = check_steering(model, vector, hook, strength, positions, n_positions=tokens.shape[-1])
    if where is not None:
        where = [p % tokens.shape[-1] for p in where]  # -1 means the prompt's last token, not the newest one
        generate_kwargs["use_kv_cache"] = False
    generate_kwargs.setdefault("temperature", 0.0)
    generate_kwargs.setdefault("stop_at_eos", False)
    with steering(model, vector, hook, strength, where):
        return model.generate(tokens, max_new_tokens=max_new_tokens, attention_mask=attention_mask, **generate_kwargs)


__all__ = [
    "check_hook",
    "check_positions",
    "check_steering",
    "check_strength",
    "check_vector",
    "steered_generate",
    "steering",
    "steering_hook",
]

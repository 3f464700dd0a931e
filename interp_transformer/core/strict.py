"""Strict checkpoint checks and weight loading without a second copy, shared by every architecture.

``check_checkpoint`` compares the tensor names and shapes a checkpoint holds with
the ones a converter expects, and raises one ``CheckpointError`` listing every
missing, unexpected and mis-shaped tensor. ``load_strict`` puts a converted state
dict into a model built on the ``meta`` device (no memory, no random init) with
``load_state_dict(assign=True)``, so the model's parameters *are* the converted
tensors: no copy, no initialisation that is thrown away. It refuses a weight holding
NaN or inf (``check_finite``): a damaged checkpoint must not load and compute NaN.
"""

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import torch
from torch import Tensor, nn

from interp_transformer.core.devices import checked_device

Shape = tuple[int, ...]
# Error messages list at most this many names per kind of problem.
_MAX_LISTED = 20


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: missing, unexpected or mis-shaped tensors.

    ``missing``, ``unexpected`` and ``mis_shaped`` (name -> (expected, received))
    say exactly what is wrong, for programs; the message says it for people.
    """

    def __init__(
        self,
        what: str,
        missing: Iterable[str] = (),
        unexpected: Iterable[str] = (),
        mis_shaped: Mapping[str, tuple[Shape, Shape]] | None = None,
    ):
        self.missing = sorted(missing)
        self.unexpected = sorted(unexpected)
        self.mis_shaped = dict(sorted((mis_shaped or {}).items()))
        parts = []
        if not (self.missing or self.unexpected or self.mis_shaped):
            super().__init__(what)
            return
        if self.missing:
            parts.append(f"missing {len(self.missing)} tensor(s): {_listing(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected {len(self.unexpected)} tensor(s): {_listing(self.unexpected)}")
        if self.mis_shaped:
            shown = [f"{name} expected {list(e)} received {list(r)}" for name, (e, r) in self.mis_shaped.items()]
            parts.append(f"mis-shaped {len(shown)} tensor(s): {_listing(shown)}")
        super().__init__(f"{what} does not fit the model: " + "; ".join(parts))


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f", ... ({len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else "")


def state_dict_shapes(state_dict: Mapping[str, Tensor]) -> dict[str, Shape]:
    """Name -> shape of every tensor, read from file headers when the mapping can (no tensor data read)."""
    shapes = getattr(state_dict, "shapes", None)
    if callable(shapes):
        return dict(shapes())
    return {name: tuple(tensor.shape) for name, tensor in state_dict.items()}


def check_checkpoint(
    received: Mapping[str, Shape],
    expected: Mapping[str, Shape],
    *,
    what: str = "checkpoint",
    optional: Iterable[str] = (),
    ignored: re.Pattern | None = None,
) -> None:
    """Raise ``CheckpointError`` unless ``received`` has exactly the ``expected`` names and shapes.

    ``optional`` names may be absent (they are still shape-checked when present);
    names that fully match ``ignored`` are skipped (e.g. non-weight buffers that old
    checkpoints carry).
    """
    optional = set(optional)
    missing = [name for name in expected if name not in received and name not in optional]
    unexpected = [
        name for name in received if name not in expected and not (ignored is not None and ignored.fullmatch(name))
    ]
    mis_shaped = {
        name: (tuple(expected[name]), tuple(shape))
        for name, shape in received.items()
        if name in expected and tuple(shape) != tuple(expected[name])
    }
    if missing or unexpected or mis_shaped:
        raise CheckpointError(what, missing, unexpected, mis_shaped)


# the shape fields every Hugging Face decoder config of the Llama lineage (and BERT, GPT-NeoX) holds
DECODER_SHAPE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def require_config_fields(
    hf_config, what: str, positive_ints: Iterable[str] = (), positive_floats: Iterable[str] = ()
) -> None:
    """``ValueError`` naming the field unless each is a positive int (or a positive finite number), before any
    arithmetic on them: a ``config.json`` is user input."""
    for name in positive_ints:
        value = getattr(hf_config, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{what} config field {name} must be a positive int, got {value!r}")
    for name in positive_floats:
        value = getattr(hf_config, name, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{what} config field {name} must be a positive finite number, got {value!r}")


def check_layer_count(shapes: Mapping[str, Shape], pattern: str, n_layers: int, what: str, field: str) -> None:
    r"""Compare the number of layers a config claims with the layers a checkpoint holds, before any per-layer work.

    ``pattern`` is a regular expression whose first group is the layer index of a tensor
    name (``r"h\.(\d+)\."``). A mismatch raises ``CheckpointError`` at once: a config that
    claims a million layers must not be enumerated first.
    """
    held = {int(match.group(1)) for name in shapes if (match := re.search(pattern, name))}
    if len(held) != n_layers or (held and max(held) != n_layers - 1):
        found = f"layers {min(held)}..{max(held)} ({len(held)} in all)" if held else "no layer"
        raise CheckpointError(f"{what}: the config says {field}={n_layers}, the checkpoint holds {found}")


FINITE_CHECK_CHUNK = 1 << 22  # values checked at once


def check_finite(name: str, tensor: Tensor, what: str) -> None:
    """``CheckpointError`` (a ``ValueError``) if the floating tensor ``name`` holds NaN or inf, saying how many.

    A meta tensor (no data) and a non-floating one are not checked.
    """
    if tensor.is_meta or not tensor.is_floating_point():
        return
    # a chunk at a time: isfinite's temporaries (a float and two bool tensors of the input's size) stay small beside
    # a large embedding
    flat = tensor.reshape(-1)
    if all(bool(torch.isfinite(chunk).all()) for chunk in flat.split(FINITE_CHECK_CHUNK)):
        return
    finite = torch.isfinite(tensor)
    count = finite.numel() - int(finite.sum())
    low_precision = tensor.dtype in (torch.float16, torch.bfloat16)
    overflow = (
        f" (in {tensor.dtype} a value beyond {torch.finfo(tensor.dtype).max:.4g} is inf)" if low_precision else ""
    )
    raise CheckpointError(
        f"{what}: {name} holds {count} non-finite value{'s' if count != 1 else ''} (NaN or inf) of "
        f"{tensor.numel()}{overflow}; the weights are damaged"
    )


ModuleT = TypeVar("ModuleT", bound=nn.Module)  # the model class built and loaded, given back as it is


def build_on_meta(factory: Callable[[], ModuleT]) -> ModuleT:
    """Run ``factory()`` with the ``meta`` device as default: parameters get shapes but no memory."""
    with torch.device("meta"):
        return factory()


def load_strict(
    model: ModuleT,
    state_dict: Mapping[str, Tensor],
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> ModuleT:
    """Load ``state_dict`` into ``model`` (typically built with ``build_on_meta``), strictly.

    Names and shapes must match the model's exactly (``CheckpointError`` lists every
    difference). Floating tensors are cast to ``dtype`` and everything is moved to
    ``device``; a tensor already right is used as is, without a copy
    (``load_state_dict(assign=True)``). Returns ``model`` in eval mode.

    Refused with ``CheckpointError``: an integer tensor where a weight is floating, and a
    weight holding NaN or inf (``check_finite``). A ``device`` torch cannot read raises
    ``ValueError`` (``devices.checked_device``) before any tensor is read.
    """
    device = checked_device(device) or torch.device("cpu")
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    check_checkpoint(state_dict_shapes(state_dict), expected, what="converted state dict")
    tensors = {}
    wanted = model.state_dict()
    for name in expected:
        tensor = state_dict[name]
        if wanted[name].is_floating_point() and not tensor.is_floating_point():
            raise CheckpointError(
                f"converted state dict: {name} holds {tensor.dtype} values, a weight must be floating "
                "point; the checkpoint is damaged or not a model's weights"
            )
        tensors[name] = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None)
        check_finite(name, tensors[name], "converted state dict")
    model.load_state_dict(tensors, strict=True, assign=True)
    still_meta = [name for name, t in model.state_dict().items() if t.is_meta]
    if still_meta:  # a parameter outside state_dict() (should not happen) would have no data
        raise CheckpointError("converted state dict", missing=still_meta)
    return model.eval()


__all__ = [
    "DECODER_SHAPE_FIELDS",
    "CheckpointError",
    "build_on_meta",
    "check_checkpoint",
    "check_finite",
    "load_strict",
    "state_dict_shapes",
]

"""The one check of a ``device`` argument, made by every entry point that takes one before it reads any weight.

``checked_device(device)`` returns ``None`` (the default: the CPU) or a ``torch.device``. It
refuses, with a one-line error naming what it received:

- a value of another type than ``str``, ``int`` or ``torch.device`` (``TypeError``);
- a string or index torch cannot read as a device, e.g. ``"banana"`` or ``-1`` (``ValueError``);
- a CUDA device when CUDA is not available, or an index past the GPUs there are (``ValueError``).
"""

import torch

DeviceLike = str | int | torch.device | None
EXAMPLES = "expected e.g. 'cpu', 'cuda', 'cuda:0'"


def checked_device(device: DeviceLike, name: str = "device") -> torch.device | None:
    """``device`` as a ``torch.device`` (``None`` stays ``None``); see the module docstring for what is refused."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            f"{name} must be a torch device or its name ({EXAMPLES}), received {type(device).__name__} {device!r:.80}"
        )
    try:
        resolved = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, ValueError, TypeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{name}={device!r:.80} is not a valid torch device ({EXAMPLES}); torch says: {reason}"
        ) from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r} names a CUDA device, but CUDA is not available here: use {name}='cpu'")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(
                f"{name}={device!r} names GPU {resolved.index}, but there are {count} (cuda:0 .. cuda:{count - 1})"
            )
    return resolved


__all__ = ["DeviceLike", "checked_device"]

"""The model a harvest runs: a model object, a shipped model's name, or anything ``from_pretrained`` loads."""

from pathlib import Path
from typing import Any, TypeGuard

import torch

from interp_transformer.pretrained import SHIPPED_MODELS, load_shipped

ModelSource = str | Path | torch.nn.Module


def is_hooked_model(obj: object) -> TypeGuard[torch.nn.Module]:
    """Ours (or any model with the same surface): ``hook_dict``, ``run_with_cache`` and ``estimate_cache_bytes``."""
    return isinstance(obj, torch.nn.Module) and all(
        hasattr(obj, attribute) for attribute in ("hook_dict", "run_with_cache", "estimate_cache_bytes", "cfg")
    )


def load_model(source: ModelSource, *, dtype: torch.dtype, device: torch.device) -> tuple[Any, str]:
    """``(model in eval mode on device, description)``.

    A hooked model object is used as given and moved to ``device`` (in place);
    ``"induction-2l"`` loads the shipped model; anything else goes to
    ``interp_transformer.loading.from_pretrained`` (a Hugging Face directory, an
    in-memory ``transformers`` model, or a hub name already in the local cache).
    """
    if is_hooked_model(source):
        return source.to(device).eval(), f"in-memory {type(source).__name__} ({getattr(source.cfg, 'name', '')})"
    if isinstance(source, str) and source in SHIPPED_MODELS:
        return load_shipped(source, dtype=dtype, device=device).eval(), f"{source} (shipped with interp_transformer)"
    if isinstance(source, torch.nn.Module) and not hasattr(source, "config"):
        raise TypeError(
            f"the model must be a hooked model (hook_dict, run_with_cache), a transformers model, a shipped model name "
            f"{list(SHIPPED_MODELS)} or a Hugging Face directory; received a {type(source).__name__}"
        )
    from interp_transformer.loading import from_pretrained

    # a module left here has a config: a transformers model
    model = from_pretrained(source, dtype=dtype, device=device).eval()  # type: ignore[arg-type]
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        description = f"directory {path.resolve()}" if path.is_dir() else f"hub model {source}"
    else:
        description = f"in-memory {type(source).__name__}"
    return model, description

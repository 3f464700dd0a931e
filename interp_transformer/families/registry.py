"""The architecture registry: which config class is built by which architecture, and every table derived from it.

An ``Architecture`` holds what one family of models needs beyond its parts: its
config class, how its parts are built from a config, its capabilities and its
hook-name table. ``DemoTransformer(cfg)`` and ``EncoderTransformer(cfg)`` look their
architecture up here by the config's class, so a new architecture is a new module
and one ``register`` call, never a branch in an existing forward (see
``docs/architecture.md``).

A family's one ``register(...)`` line (in ``families/<name>/__init__.py``) also hands in what
the floors above read about it: its Hugging Face converter and ``model_type`` values (loading's
table, ``hf_converters()``), its GGUF entries (``gguf_architectures()``) and its TransformerLens
mapping (``lens_of(cfg)``, read by ``compat``). There is no other family table.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.encoder_decoder import EncoderDecoderHookNames
from interp_transformer.families.gguf_entry import GGUFArchitecture
from interp_transformer.hooks.names import HookNames


@dataclass(frozen=True)
class DecoderParts:
    """The parts of a decoder, in forward order: what ``DemoTransformer`` composes.

    ``pos_embed`` is None when positions act inside attention (rotary) or there are none.
    """

    embed: nn.Module
    pos_embed: nn.Module | None
    blocks: list
    ln_final: nn.Module
    unembed: nn.Module


@dataclass(frozen=True)
class Architecture:
    """One architecture: ``build(cfg)`` gives its parts, ``capabilities(cfg)`` its facts.

    ``hook_names`` is its table, or a function of the config giving one (when the
    config decides which hooks exist, e.g. whether positions enter the residual stream).
    """

    name: str
    config_class: type
    build: Callable[[Any], Any]
    capabilities: Callable[[Any], Capabilities]
    hook_names: HookNames | EncoderDecoderHookNames | Callable[[Any], HookNames | EncoderDecoderHookNames]
    # given on the family's one register line: the module path of the converter that reads its checkpoints, the
    # Hugging Face model_types it reads, its GGUF entries (general.architecture -> GGUFArchitecture), its
    # TransformerLens mapping (cfg, common fields -> HookedTransformerConfig fields, or why there is none) and the
    # model class that holds it ("decoder", "encoder" or "encoder_decoder")
    converter: str | None = None
    hf_model_types: tuple[str, ...] = ()
    gguf: Mapping[str, GGUFArchitecture] = field(default_factory=dict)
    lens: Callable[[Any, dict], dict | None] | str | None = None
    model: str = "decoder"


_REGISTRY: dict[type, Architecture] = {}


MODELS = ("decoder", "encoder", "encoder_decoder")


def register(
    architecture: Architecture,
    *,
    converter: str | None = None,
    hf_model_types=(),
    gguf: Mapping[str, GGUFArchitecture] | None = None,
    lens: Callable[[Any, dict], dict | None] | str | None = None,
    model: str | None = None,
) -> Architecture:
    """Make ``architecture`` the one that builds models from configs of its ``config_class``.

    ``converter`` is the module path of its Hugging Face converter (e.g.
    ``"interp_transformer.families.llama.hf"``, imported only when used) and ``hf_model_types``
    the ``model_type`` values it reads; ``gguf`` its GGUF entries (``general.architecture`` ->
    ``GGUFArchitecture``); ``lens`` its TransformerLens mapping, a function
    ``(cfg, common) -> HookedTransformerConfig fields`` (None for a config it cannot say), or the
    reason no such config describes the family;
    ``model`` the model class holding it (one of ``MODELS``). Loading, GGUF and the TransformerLens
    layer derive their tables from these, so a family is this one line. What is not given keeps the
    architecture's own value. Returns the registered architecture (with these given).
    """
    if not isinstance(architecture, Architecture):
        raise TypeError(f"expected an Architecture, got {type(architecture).__name__}")
    converter = architecture.converter if converter is None else converter
    hf_model_types = hf_model_types or architecture.hf_model_types
    gguf = architecture.gguf if gguf is None else gguf
    lens = architecture.lens if lens is None else lens
    model = architecture.model if model is None else model
    if model not in MODELS:
        raise ValueError(f"architecture {architecture.name!r}: model must be one of {list(MODELS)}, received {model!r}")
    hf_model_types = (hf_model_types,) if isinstance(hf_model_types, str) else tuple(hf_model_types)
    if hf_model_types and converter is None:
        raise ValueError(f"architecture {architecture.name!r}: hf_model_types {list(hf_model_types)} need a converter")
    gguf = dict(gguf)
    others = [a for a in _REGISTRY.values() if a.name != architecture.name]
    for what, given, claimed in (
        ("model_type", hf_model_types, {t: a.name for a in others for t in a.hf_model_types}),
        ("GGUF architecture", gguf, {t: a.name for a in others for t in a.gguf}),
    ):
        taken = sorted(set(given) & set(claimed))
        if taken:
            raise ValueError(
                f"architecture {architecture.name!r}: {what} {taken[0]!r} is already read by architecture "
                f"{claimed[taken[0]]!r}"
            )
    existing = _REGISTRY.get(architecture.config_class)
    if existing is not None and existing.name != architecture.name:
        raise ValueError(
            f"{architecture.config_class.__name__} is already built by architecture {existing.name!r}; "
            f"unregister it before registering {architecture.name!r}"
        )
    given = dict(converter=converter, hf_model_types=hf_model_types, gguf=gguf, lens=lens, model=model)
    if any(getattr(architecture, name) != value for name, value in given.items()):
        architecture = replace(architecture, **given)  # the architecture itself when nothing new is given
    _REGISTRY[architecture.config_class] = architecture
    return architecture


def unregister(architecture: Architecture) -> None:
    """Remove ``architecture`` from the registry (``KeyError`` if it is not there)."""
    existing = _REGISTRY.get(architecture.config_class)
    if existing is None or existing.name != architecture.name:
        raise KeyError(f"architecture {architecture.name!r} is not registered")
    del _REGISTRY[architecture.config_class]


def hf_converters() -> dict[str, str]:
    """Hugging Face ``model_type`` -> the module path of its converter, from the registered architectures."""
    return {
        model_type: architecture.converter
        for architecture in _REGISTRY.values()
        if architecture.converter is not None
        for model_type in architecture.hf_model_types
    }


def gguf_architectures() -> dict[str, GGUFArchitecture]:
    """GGUF ``general.architecture`` -> its entry, from the registered architectures."""
    return {arch: entry for architecture in _REGISTRY.values() for arch, entry in architecture.gguf.items()}


def lens_of(cfg) -> Architecture | None:
    """The registered architecture of exactly ``cfg``'s class (its ``lens`` is TransformerLens' mapping), or None."""
    return _REGISTRY.get(type(cfg))


def registered() -> list[Architecture]:
    """Every registered architecture, in registration order."""
    return list(_REGISTRY.values())


def architecture_of(cfg) -> Architecture:
    """The architecture that builds models from ``cfg``; ``TypeError`` naming the known config classes otherwise."""
    architecture = _REGISTRY.get(type(cfg))
    if architecture is None:
        known = ", ".join(klass.__name__ for klass in _REGISTRY)
        raise TypeError(f"cfg must be the config of a registered architecture ({known}), got {type(cfg).__name__}")
    return architecture


__all__ = [
    "MODELS",
    "Architecture",
    "DecoderParts",
    "architecture_of",
    "gguf_architectures",
    "hf_converters",
    "lens_of",
    "register",
    "registered",
    "unregister",
]

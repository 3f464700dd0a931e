"""The architecture registry: which config class is built by which architecture.

An ``Architecture`` holds what one family of models needs beyond its parts: its
config class, how its parts are built from a config, its capabilities and its
hook-name table. ``DemoTransformer(cfg)`` and ``EncoderTransformer(cfg)`` look their
architecture up here by the config's class, so a new architecture is a new module
and one ``register`` call, never a branch in an existing forward (see
``docs/architecture.md``).
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families.encoder_decoder import EncoderDecoderHookNames
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
    # the converter module in interp_transformer.loading that reads its checkpoints, and the Hugging Face model_types
    # it reads (given on the architecture's one register line)
    converter: str | None = None
    hf_model_types: tuple[str, ...] = ()


_REGISTRY: dict[type, Architecture] = {}


def register(architecture: Architecture, *, converter: str | None = None, hf_model_types=()) -> Architecture:
    """Make ``architecture`` the one that builds models from configs of its ``config_class``.

    ``converter`` names its module in ``interp_transformer.loading`` (e.g. ``"llama"``) and
    ``hf_model_types`` the Hugging Face ``model_type`` values that module reads: loading and
    the TransformerLens layer derive their tables from these, so a family is one line here.
    Returns the registered architecture (with the two given).
    """
    if not isinstance(architecture, Architecture):
        raise TypeError(f"expected an Architecture, got {type(architecture).__name__}")
    hf_model_types = (hf_model_types,) if isinstance(hf_model_types, str) else tuple(hf_model_types)
    if hf_model_types and converter is None:
        raise ValueError(f"architecture {architecture.name!r}: hf_model_types {list(hf_model_types)} need a converter")
    claimed = {t: a.name for a in _REGISTRY.values() if a.name != architecture.name for t in a.hf_model_types}
    taken = sorted(set(hf_model_types) & set(claimed))
    if taken:
        raise ValueError(
            f"architecture {architecture.name!r}: model_type {taken[0]!r} is already read by architecture "
            f"{claimed[taken[0]]!r}"
        )
    existing = _REGISTRY.get(architecture.config_class)
    if existing is not None and existing.name != architecture.name:
        raise ValueError(
            f"{architecture.config_class.__name__} is already built by architecture {existing.name!r}; "
            f"unregister it before registering {architecture.name!r}"
        )
    if converter is not None or hf_model_types:
        architecture = replace(architecture, converter=converter, hf_model_types=hf_model_types)
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
        model_type: f"interp_transformer.families.{architecture.converter}.hf"
        for architecture in _REGISTRY.values()
        for model_type in architecture.hf_model_types
    }


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


__all__ = ["Architecture", "DecoderParts", "architecture_of", "hf_converters", "register", "registered", "unregister"]

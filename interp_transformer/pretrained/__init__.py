"""Models that ship inside the package, loadable with no network.

``induction-2l``: a 2-layer attention-only model trained on repeated random
tokens (see ``interp_transformer.pretrained.induction``), in which a previous-token head
and an induction head form. Stored as safetensors next to a JSON file holding
its config, training settings and training curve.

``translate-tiny``: a pre-LayerNorm encoder-decoder that translates numbers spelled out
in English into their digits (see ``interp_transformer.pretrained.translation``), whose
cross-attention learned the alignment; stored the same way, its JSON model card also
holding the task, the command that retrains it and its held-out accuracy.

Beside each lies ``<name>.train.toml``, the config file that retrains it through the general
trainer (``interp-transformer train``, ``interp_transformer.training``).
"""

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from interp_transformer.core.devices import checked_device
from interp_transformer.core.files import read_json_object
from interp_transformer.core.strict import build_on_meta, load_strict
from interp_transformer.families.gpt2.recipe import TransformerConfig
from interp_transformer.families.seq2seq.recipe import Seq2SeqConfig
from interp_transformer.loading.sources import LazyStateDict, open_safetensors_file
from interp_transformer.models.decoder import DemoTransformer
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer


def _read_safetensors(path: Path) -> LazyStateDict:
    """The tensors of a safetensors file, read strictly (a damaged file gives a ``ValueError`` naming it)."""
    loaders, shapes = open_safetensors_file(path)
    return LazyStateDict(loaders, shapes, description=str(path))


def _number_tokenizer():
    from interp_transformer.pretrained.translation import NumberTokenizer

    return NumberTokenizer.create()


@dataclass(frozen=True)
class ShippedKind:
    """How a shipped model is built: its config class, model class, tokenizer, and the command that retrains it."""

    config_class: type
    model_class: type
    tokenizer: Callable[[], object] | None
    retrain: str


PRETRAINED_DIR = Path(__file__).parent  # the weights lie beside this module
SHIPPED = {
    "induction-2l": ShippedKind(TransformerConfig, DemoTransformer, None, "interp-transformer train-induction"),
    "translate-tiny": ShippedKind(
        Seq2SeqConfig, EncoderDecoderTransformer, _number_tokenizer, "interp-transformer train-translation"
    ),
}
SHIPPED_MODELS = tuple(SHIPPED)


def shipped_paths(name: str, directory: Path = PRETRAINED_DIR) -> tuple[Path, Path]:
    if name not in SHIPPED_MODELS:
        raise KeyError(f"no shipped model named {name!r}; shipped models: {list(SHIPPED_MODELS)}")
    return directory / f"{name}.safetensors", directory / f"{name}.json"


def inside_package(directory: Path) -> bool:
    """Whether ``directory`` lies inside the installed ``interp_transformer`` package."""
    package = Path(__file__).resolve().parents[1]
    return Path(directory).resolve() == package or package in Path(directory).resolve().parents


def save_shipped(
    model: DemoTransformer | EncoderDecoderTransformer, name: str, metadata: dict, directory: Path
) -> tuple[Path, Path]:
    """Write ``model``'s weights (safetensors) and ``{config, **metadata}`` (JSON) into ``directory``.

    The copy inside the installed package is never overwritten (``ValueError``): a retrained
    model goes to a directory of yours, and loads from there with ``load_shipped(name, directory=...)``.
    """
    directory = Path(directory)
    if inside_package(directory):
        raise ValueError(
            f"{directory} is inside the installed package: a retrained model is written to a directory "
            "of yours (--out-dir), never over the shipped one"
        )
    weights_path, meta_path = shipped_paths(name, directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(weights_path))
    meta = {"config": dataclasses.asdict(model.cfg), **metadata}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return weights_path, meta_path


def load_shipped_metadata(name: str, directory: Path = PRETRAINED_DIR) -> dict:
    _, meta_path = shipped_paths(name, directory)
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path} is missing: retrain with `{SHIPPED[name].retrain}`")
    meta = read_json_object(meta_path, "a JSON object with a 'config' object")
    if not isinstance(meta.get("config"), dict):
        raise ValueError(
            f"{meta_path} must be a JSON object with a 'config' object (the model's "
            f"{SHIPPED[name].config_class.__name__})"
        )
    return meta


def _config_of(meta: dict, meta_path: Path, config_class: type = TransformerConfig):
    fields = {field.name for field in dataclasses.fields(config_class)}
    unknown = sorted(set(meta["config"]) - fields)
    if unknown:
        raise ValueError(f"{meta_path}: unknown config keys {unknown}; a {config_class.__name__} has {sorted(fields)}")
    try:
        return config_class(**meta["config"])
    except TypeError as error:
        raise ValueError(f"{meta_path}: {error}") from error


def shipped_config(name: str, directory: Path = PRETRAINED_DIR):
    """The config of shipped model ``name``, read from its JSON model card (what retraining it starts from)."""
    _, meta_path = shipped_paths(name, directory)
    return _config_of(load_shipped_metadata(name, directory), meta_path, SHIPPED[name].config_class)


def load_shipped(
    name: str = "induction-2l",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
    directory: Path | None = None,
) -> DemoTransformer | EncoderDecoderTransformer:
    """Load a shipped model by name, e.g. ``load_shipped("induction-2l")`` or ``load_shipped("translate-tiny")``.

    A ``device`` torch cannot read raises ``ValueError`` before anything is read (``checked_device``).
    """
    device = checked_device(device)
    directory = PRETRAINED_DIR if directory is None else Path(directory)
    weights_path, meta_path = shipped_paths(name, directory)
    kind = SHIPPED[name]
    cfg = _config_of(load_shipped_metadata(name, directory), meta_path, kind.config_class)
    if not weights_path.is_file():
        raise FileNotFoundError(f"{weights_path} is missing: retrain with `{kind.retrain}`")
    state = _read_safetensors(weights_path)
    tokenizer = kind.tokenizer() if kind.tokenizer is not None else None
    model = build_on_meta(lambda: kind.model_class(cfg, tokenizer=tokenizer, dtype=dtype))
    return load_strict(model, state, dtype=dtype, device=device)


def load_induction_model(**kwargs) -> DemoTransformer:
    """The shipped 2-layer attention-only induction model."""
    return load_shipped("induction-2l", **kwargs)  # type: ignore[return-value]  # SHIPPED builds it as a decoder


def load_translation_model(**kwargs) -> EncoderDecoderTransformer:
    """The shipped encoder-decoder that translates spelled-out numbers into digits, with its tokenizer."""
    return load_shipped("translate-tiny", **kwargs)  # type: ignore[return-value]  # an encoder-decoder in SHIPPED

"""The config file of ``interp-transformer train``: which model, which data, which settings, where to.

A TOML (read with ``tomllib``) or JSON file of four tables::

    [model]                       # a shipped model, retrained from scratch with its own config ...
    shipped = "induction-2l"
    # ... or an architecture by its registered name, and its config's fields:
    # architecture = "gpt2"
    # config = { d_model = 64, n_layers = 2, n_heads = 4, d_head = 16, d_mlp = 256, d_vocab = 64, n_ctx = 64 }

    [data]
    task = "induction"            # a task of ``tasks.TASKS``, then its options
    seq_len = 24

    [training]                    # the fields of ``TrainSettings``; steps and batch are required
    steps = 3000
    batch = 64
    lr = 1e-3

    [output]
    dir = "induction-2l-retrained"   # relative to the working folder; the default is ./<name>-trained

Every key is checked: one that is not known raises ``KeyError`` naming it, the closest known
key and all known keys; a missing required one names itself. The examples that retrain the
shipped models lie beside them: ``interp_transformer/pretrained/induction-2l.train.toml`` and
``translate-tiny.train.toml`` (``example_config(name)``).
"""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from interp_transformer.families import DecoderParts, architecture_of, registered
from interp_transformer.families.bert.recipe import EncoderParts
from interp_transformer.families.encoder_decoder import EncoderDecoderParts
from interp_transformer.models.decoder import DemoTransformer
from interp_transformer.models.encoder import EncoderTransformer
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer
from interp_transformer.pretrained import PRETRAINED_DIR, SHIPPED, shipped_config
from interp_transformer.training.settings import TrainSettings, unknown_key_message
from interp_transformer.training.tasks import TASKS, InductionTask, TranslationTask, make_task

TABLES = ("model", "data", "training", "output")
MODEL_KEYS = ("shipped", "architecture", "config")
OUTPUT_KEYS = ("dir",)
# which model class composes the parts an architecture builds (the parts say what the model is)
MODEL_CLASSES = {
    DecoderParts: DemoTransformer,
    EncoderDecoderParts: EncoderDecoderTransformer,
    EncoderParts: EncoderTransformer,
}


@dataclass(frozen=True)
class TrainingPlan:
    """What a config file asks for: how to build the model, the task, the settings and the output folder."""

    source: str  # the config file
    shipped: str | None  # the shipped model retrained, or None
    architecture: str  # the registered architecture's name
    config: object  # its config
    task: InductionTask | TranslationTask
    settings: TrainSettings
    out_dir: Path

    @property
    def name(self) -> str:
        """The shipped model's name, else the config's ``name``, else the architecture's."""
        return _name(self.shipped, self.config, self.architecture)

    def build_model(self) -> torch.nn.Module:
        """A fresh model of the config, initialised from ``settings.seed``, with the task's tokenizer (if any)."""
        if self.shipped is not None:
            kind = SHIPPED[self.shipped]
            model_class, tokenizer = kind.model_class, kind.tokenizer() if kind.tokenizer is not None else None
        else:
            model_class, tokenizer = model_class_of(self.config), self.task.tokenizer()
        return model_class(self.config, tokenizer=tokenizer, seed=self.settings.seed)


def _name(shipped: str | None, cfg, architecture: str) -> str:
    return shipped or getattr(cfg, "name", None) or architecture


def example_config(name: str) -> Path:
    """The config file that retrains shipped model ``name`` (``KeyError`` for another name)."""
    if name not in SHIPPED:
        raise KeyError(f"no shipped model named {name!r}; shipped models: {list(SHIPPED)}")
    return PRETRAINED_DIR / f"{name}.train.toml"


def read_config_file(path: str | Path) -> dict:
    """The tables of a ``.toml`` or ``.json`` config file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        import tomllib  # Python 3.11+

        try:
            values = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path} is not valid TOML: {error}") from error
    elif path.suffix == ".json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
    else:
        raise ValueError(f"a config file ends in .toml or .json, got {path.name!r}")
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold one object of tables {list(TABLES)}, got {type(values).__name__}")
    return values


def _table(values: dict, name: str, where: str, required: bool = True) -> dict:
    table = values.get(name, {} if not required else None)
    if table is None:
        raise KeyError(f"{where}: missing table [{name}]; a config file has tables {list(TABLES)}")
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [{name}] must be a table of keys, got {table!r}")
    return table


def _check_keys(table: dict, known, where: str) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise KeyError(unknown_key_message(where, unknown, list(known)))


def _architecture(name: str, where: str):
    by_name = {architecture.name: architecture for architecture in registered()}
    if name not in by_name:
        raise ValueError(f"{where}: architecture must be one of {sorted(by_name)}, got {name!r}")
    return by_name[name]


def model_class_of(cfg) -> type:
    """The model class that composes the parts ``cfg``'s architecture builds (built on the meta device)."""
    architecture = architecture_of(cfg)
    with torch.device("meta"):
        parts = architecture.build(cfg)
    for parts_class, model_class in MODEL_CLASSES.items():
        if isinstance(parts, parts_class):
            return model_class
    raise TypeError(f"architecture {architecture.name!r} builds {type(parts).__name__}, which no model class composes")


def _model(table: dict, where: str) -> tuple[str | None, str, object]:
    _check_keys(table, MODEL_KEYS, f"{where} [model]")
    if ("shipped" in table) == ("architecture" in table):
        raise KeyError(f"{where} [model]: give exactly one of 'shipped' (one of {list(SHIPPED)}) or 'architecture'")
    if "shipped" in table:
        if "config" in table:
            raise KeyError(f"{where} [model]: 'config' goes with 'architecture'; a shipped model brings its own")
        name = table["shipped"]
        if name not in SHIPPED:
            raise ValueError(f"{where} [model]: shipped must be one of {list(SHIPPED)}, got {name!r}")
        cfg = shipped_config(name)
        return name, architecture_of(cfg).name, cfg
    architecture = _architecture(table["architecture"], f"{where} [model]")
    fields = table.get("config", {})
    if not isinstance(fields, dict):
        raise ValueError(f"{where} [model]: config must be a table of {architecture.config_class.__name__}'s fields")
    known = [field.name for field in dataclasses.fields(architecture.config_class)]
    _check_keys(fields, known, f"{where} [model.config] ({architecture.config_class.__name__})")
    try:
        cfg = architecture.config_class(**fields)
    except TypeError as error:
        raise ValueError(f"{where} [model.config]: {error}") from error
    return None, architecture.name, cfg


def plan_from_config(path: str | Path, out_dir: Path | None = None) -> TrainingPlan:
    """Read and check a config file (see the module docstring); ``out_dir`` overrides its ``[output] dir``."""
    values = read_config_file(path)
    where = str(path)
    _check_keys(values, TABLES, where)
    shipped, architecture, cfg = _model(_table(values, "model", where), where)
    data = dict(_table(values, "data", where))
    if "task" not in data:
        raise KeyError(f"{where} [data]: missing 'task', one of the tasks {sorted(TASKS)}")
    task = make_task(data.pop("task"), data, where=f"{where} [data]")
    settings = TrainSettings.from_dict(_table(values, "training", where), where=f"{where} [training]")
    output = _table(values, "output", where, required=False)
    _check_keys(output, OUTPUT_KEYS, f"{where} [output]")
    default = f"{_name(shipped, cfg, architecture)}-trained"
    directory = Path(out_dir if out_dir is not None else output.get("dir", default))
    return TrainingPlan(str(path), shipped, architecture, cfg, task, settings, directory)


__all__ = ["TrainingPlan", "example_config", "model_class_of", "plan_from_config", "read_config_file"]

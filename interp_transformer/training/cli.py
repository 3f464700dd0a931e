"""``interp-transformer train CONFIG`` (also ``python -m interp_transformer.training CONFIG``, the same under
``torchrun``): read a config file, train, save the model with its card.

``add_train_parser(subparsers)`` mounts the command on another command line; ``run_config``
is the whole command as a function; ``main(argv)`` is the stand-alone entry point.

What is written into the output folder (process 0 only):

- a shipped model retrained: ``<name>.safetensors`` and ``<name>.json`` (``pretrained.save_shipped``),
  which ``load_shipped(name, directory=DIR)`` and the command line's ``--weights-dir DIR`` read;
- a model of an architecture: ``model.safetensors`` and ``model.json`` (``load_trained(DIR)`` reads them);
- ``checkpoint.pt``: the last checkpoint; running the same command again continues from it.

The card (the JSON file) holds the config, the architecture, the task, the settings, the
training curve, the task's measures after the last step and the command.
"""

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from interp_transformer.core.command_line import EXIT_OK, mount, run_standalone, standalone_parser
from interp_transformer.core.files import read_json_object
from interp_transformer.core.strict import build_on_meta, load_strict
from interp_transformer.families import registered
from interp_transformer.harvest.distributed import init_distributed
from interp_transformer.loading.sources import LazyStateDict, open_safetensors_file
from interp_transformer.pretrained import inside_package, save_shipped
from interp_transformer.training.config_file import TrainingPlan, model_class_of, plan_from_config
from interp_transformer.training.loop import TrainingRun, train
from interp_transformer.training.tasks import task_settings

MODEL_FILE = "model"  # model.safetensors and model.json, for a model of an architecture

DESCRIPTION = """\
Train a model built from the package's parts, as a config file says: the model (a shipped
model to retrain, or an architecture and its config), the data (a task: induction,
translation) and the settings (schedule, AdamW, gradient accumulation, clipping, precision,
checkpoints). Rerun the same command to resume from the last checkpoint. Under torchrun the
processes share each batch (data parallel):

  torchrun --nproc_per_node 2 -m interp_transformer.training CONFIG
"""

EPILOG = """\
examples:
  interp-transformer train interp_transformer/pretrained/induction-2l.train.toml --out-dir runs/induction
  interp-transformer train interp_transformer/pretrained/translate-tiny.train.toml
  python -m interp_transformer.training my-model.json --no-progress
"""


@dataclass
class Trained:
    """What ``run_config`` did: the plan it followed, the run, and the files written (process 0; else empty)."""

    plan: TrainingPlan
    run: TrainingRun
    files: tuple[Path, ...] = ()


def card(plan: TrainingPlan, run: TrainingRun, world_size: int) -> dict:
    """The JSON model card beside the weights (the config is added by the writer)."""
    return {
        "architecture": plan.architecture,
        "data": task_settings(plan.task),
        "command": f"interp-transformer train {plan.source}",
        "training": plan.settings.to_dict(),
        "processes": world_size,
        "metrics": run.metrics,
        "curve": run.curve,
    }


def save_trained(plan: TrainingPlan, run: TrainingRun, world_size: int = 1) -> tuple[Path, Path]:
    """Write the trained model and its card into ``plan.out_dir`` (see the module docstring)."""
    metadata = card(plan, run, world_size)
    model: Any = run.model  # what training builds: a DemoTransformer or an EncoderDecoderTransformer
    if plan.shipped is not None:
        return save_shipped(model, plan.shipped, metadata, directory=plan.out_dir)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    weights, meta = plan.out_dir / f"{MODEL_FILE}.safetensors", plan.out_dir / f"{MODEL_FILE}.json"
    state = {k: v.detach().to(torch.float32).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(weights))
    meta.write_text(json.dumps({"config": dataclasses.asdict(model.cfg), **metadata}, indent=1) + "\n")
    return weights, meta


def load_trained(directory: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The model ``save_trained`` wrote into ``directory`` for an architecture (``model.json`` names it)."""
    directory = Path(directory)
    meta_path = directory / f"{MODEL_FILE}.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} is missing: is {directory} a folder written by interp-transformer train?")
    meta = read_json_object(meta_path, "a JSON object with 'architecture' and 'config'")
    by_name = {architecture.name: architecture for architecture in registered()}
    if meta.get("architecture") not in by_name:
        raise ValueError(
            f"{meta_path}: architecture must be one of {sorted(by_name)}, got {meta.get('architecture')!r}"
        )
    try:
        cfg = by_name[meta["architecture"]].config_class(**meta["config"])
    except TypeError as error:
        raise ValueError(f"{meta_path}: {error}") from error
    loaders, shapes = open_safetensors_file(directory / f"{MODEL_FILE}.safetensors")
    model = build_on_meta(lambda: model_class_of(cfg)(cfg, dtype=dtype))
    return load_strict(model, LazyStateDict(loaders, shapes, description=str(directory)), dtype=dtype).eval()


def run_config(config: Path, out_dir: Path | None = None, progress: bool = True, until: int | None = None):
    """Train as the config file says and save the result (process 0); returns a ``Trained``."""
    plan = plan_from_config(config, out_dir)
    if inside_package(plan.out_dir):
        raise ValueError(
            f"{plan.out_dir} is inside the installed package: a trained model is written to a folder of yours "
            "(--out-dir DIR, or the config's [output] dir)"
        )
    context = init_distributed()
    try:
        model = plan.build_model()
        run = train(
            model,
            plan.task,
            plan.settings,
            checkpoint_dir=plan.out_dir,
            until=until,
            progress=progress,
            context=context,
        )
        files = (
            save_trained(plan, run, context.world_size) if context.is_rank0 and run.step == plan.settings.steps else ()
        )
        context.barrier()
    finally:
        context.close()
    return Trained(plan, run, tuple(files))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, metavar="CONFIG", help="a .toml or .json config file")
    parser.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="where the model, its card and the checkpoint go (default: the config's [output] dir, else "
        "./<name>-trained); the shipped models inside the package are never overwritten",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_train(args: argparse.Namespace) -> int:
    trained = run_config(args.config, args.out_dir, progress=not args.no_progress)
    if trained.files:
        run = trained.run
        last = {key: values[-1] for key, values in run.curve.items() if key not in ("steps", "lr", "tokens_per_second")}
        print(f"trained {trained.plan.name} for {run.step} steps: {last}; measures after the last step: {run.metrics}")
        print(f"saved {' and '.join(str(path) for path in trained.files)}")
    return EXIT_OK


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Mount ``train`` on another command line's subparsers; sets ``run=run_train``."""
    summary = "train a model from a config file (retrain a shipped model, or an architecture; torchrun-ready)"
    return mount(subparsers, "train", summary, DESCRIPTION, EPILOG, configure_parser, run_train)


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("python -m interp_transformer.training", DESCRIPTION, EPILOG, configure_parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: bad input is reported in one line with exit code 2."""
    return run_standalone("train", build_parser(), run_train, argv)


__all__ = ["Trained", "add_train_parser", "card", "load_trained", "main", "run_config", "save_trained"]

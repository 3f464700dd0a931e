"""A small SAE trainer: a standard or top-k SAE on a model's activations at one hook, saved in SAELens' format.

This is a small, readable trainer for experiments on a CPU budget: a few thousand to a
few million activation vectors, held in memory. It is not a replacement for SAELens'
training (no activation store streaming billions of tokens, no ghost grads or
feature resampling, no distributed training, no sweeps); an SAE it writes loads in
SAELens as in ``SAE.load``.

``train_sae(model, data, config)``:

1. activations at ``config.hook_name`` (``training_data``): from the model run over text
   files, a corpus or token batches (``data.token_batches``), or read from a harvest folder;
   every ``eval_every``-th context is held out; the BOS and separator positions are left out;
2. inputs scaled by one constant ``c = sqrt(d_in) / mean ||x||`` (so ``mean ||c x|| = sqrt(d_in)``
   and one set of hyperparameters fits models of any scale), folded into the weights at the
   end (``SAE.fold_activation_norm_scaling_factor``): the saved SAE reads raw activations;
3. initialization: ``W_dec`` rows random unit vectors, ``W_enc = W_dec^T``, ``b_enc = 0``,
   ``b_dec`` the mean input (subtracted before encoding, ``apply_b_dec_to_input``);
4. Adam on minibatches of ``batch_size`` vectors drawn by a seeded shuffle, the learning rate
   decaying linearly to 0 over the last 20% of steps. The forward pass is the SAE's own
   ``encode``/``decode``, so what is trained is exactly what is saved. Loss per vector:

   - ``topk``: ``||x - x_hat||^2`` (after each step ``W_dec``'s rows are set back to unit norm), plus
     ``aux_coefficient`` times the AuxK loss: the ``aux_k`` largest pre-activations of the
     features dead for the last ``dead_window`` steps reconstruct the residual ``x - x_hat``
     (``||(x - x_hat) - acts_dead W_dec||^2``), which moves dead features back where they are useful;
   - ``standard``: ``||x - x_hat||^2 + l1_coefficient * sum_f acts_f ||W_dec[f]||``;

5. metrics (``metrics``) on the held-out vectors: L0, fraction of variance explained, dead
   features, and the CE loss recovered with the SAE spliced into the model (for a model
   whose output is next-token logits); L0 and variance explained on the training vectors too.

Deterministic for a seed: the same data, config and seed give the same weights (on one
machine and thread count: float sums depend on both).
"""

import dataclasses
import difflib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.sae.data import TokenBatches, token_batches
from interp_transformer.sae.metrics import SAEMetrics, ce_loss_recovered, measure
from interp_transformer.sae.sae import SAE
from interp_transformer.sae.training_data import TrainingActivations, from_harvest, from_model

TRAINABLE = ("standard", "topk")
TRAINING_FILE = "training.json"


@dataclass(frozen=True)
class SAETrainingConfig:
    """What to train, and how (see the module docstring for the method)."""

    hook_name: str  # where the SAE reads and writes, e.g. "blocks.1.hook_resid_pre"
    architecture: str = "topk"  # "topk" or "standard"
    d_sae: int | None = None  # number of features; None: expansion_factor * d_in
    expansion_factor: int = 8
    k: int = 32  # top-k: features active per vector
    l1_coefficient: float = 5.0  # standard: weight of the decoder-norm-weighted L1 penalty
    steps: int = 2000
    batch_size: int = 256  # activation vectors per step
    lr: float = 1e-3
    seed: int = 0
    aux_k: int | None = None  # top-k: dead features the AuxK loss uses; None: d_in // 2
    aux_coefficient: float = 1 / 32
    dead_window: int = 200  # steps without firing after which a feature counts as dead for AuxK
    context_length: int | None = None  # tokens per context cut from a corpus, BOS included; None: min(n_ctx, 128)
    model_batch_size: int = 8  # contexts per forward pass
    eval_every: int = 8  # context i is held out when i % eval_every == eval_every - 1
    max_tokens: int | None = None  # training vectors to read at most
    exclude_special_tokens: bool = True  # leave BOS / separator positions out, and let them bypass the splice

    def __post_init__(self) -> None:
        if self.architecture not in TRAINABLE:
            raise ValueError(f"architecture must be one of {TRAINABLE}, got {self.architecture!r}")
        for name in ("expansion_factor", "k", "steps", "batch_size", "dead_window", "model_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("d_sae", "aux_k", "context_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        for name in ("l1_coefficient", "aux_coefficient"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 2:
            raise ValueError(
                f"eval_every must be an int >= 2 (every eval_every-th context is held out), got {self.eval_every!r}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")


@dataclass
class TrainedSAE:
    """The trained SAE, its metrics on held-out (``metrics``) and training (``train_metrics``) vectors, the loss
    curve."""

    sae: SAE
    config: SAETrainingConfig
    metrics: SAEMetrics
    train_metrics: SAEMetrics
    losses: list[float] = field(default_factory=list)  # mean loss per step (on scaled inputs)
    scaling_factor: float = 1.0  # the c folded into the weights

    def save(self, folder: str | Path) -> Path:
        """The SAE in SAELens' format (``SAE.save``) plus ``training.json`` (config and metrics)."""
        folder = self.sae.save(folder)
        record = {
            "config": asdict(self.config),
            "scaling_factor": self.scaling_factor,
            "metrics": self.metrics.to_dict(),
            "train_metrics": self.train_metrics.to_dict(),
        }
        (folder / TRAINING_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")
        return folder


def _initial_sae(config: SAETrainingConfig, x, d_sae: int, metadata: dict, generator: torch.Generator) -> SAE:
    d_in = x.shape[1]
    W_dec = torch.randn(d_sae, d_in, generator=generator)
    W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True)
    cfg = {"architecture": config.architecture, "d_in": d_in, "d_sae": d_sae, "metadata": metadata}
    if config.architecture == "topk":
        if config.k > d_sae:
            raise ValueError(f"k={config.k} must be at most d_sae={d_sae}")
        cfg["k"] = config.k
    tensors = {"W_enc": W_dec.T.clone(), "b_enc": torch.zeros(d_sae), "W_dec": W_dec, "b_dec": x.mean(dim=0)}
    return SAE.from_dict(cfg, tensors)


def _aux_loss(sae: SAE, pre, residual, dead, aux_k: int):
    """AuxK: the ``aux_k`` largest pre-activations among ``dead`` features reconstruct ``residual``."""
    if not bool(dead.any()):
        return pre.new_zeros(())
    masked = pre.masked_fill(~dead, float("-inf"))
    top = masked.topk(min(aux_k, int(dead.sum())), dim=-1)
    acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    return (residual - acts @ sae.W_dec).pow(2).sum(dim=-1).mean()


def fit(sae: SAE, x, config: SAETrainingConfig, generator: torch.Generator, progress: bool = False) -> list[float]:
    """Train ``sae`` in place on the (scaled) vectors ``x [n, d_in]``; returns the mean loss of every step."""
    optimizer = torch.optim.Adam(sae.parameters(), lr=config.lr)
    decay_start = int(0.8 * config.steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (config.steps - step) / max(1, config.steps - decay_start))
    )
    aux_k = config.aux_k or max(1, x.shape[1] // 2)
    last_fired = torch.zeros(sae.d_sae, dtype=torch.long)
    order, cursor, losses = torch.randperm(len(x), generator=generator), 0, []
    pre_acts: dict[str, Tensor] = {}
    handle = sae.hook_sae_acts_pre.add_hook(lambda pre, hook: pre_acts.__setitem__("pre", pre))
    try:
        for step in tqdm(range(config.steps), desc="training the SAE", disable=not progress):
            if cursor + config.batch_size > len(order):
                order, cursor = torch.randperm(len(x), generator=generator), 0
            batch = x[order[cursor : cursor + config.batch_size]]
            cursor += config.batch_size
            acts, state = sae.encode_with_state(batch)
            x_hat = sae.decode_with_state(acts, state, hooked=False)
            residual = batch - x_hat
            loss = residual.pow(2).sum(dim=-1).mean()
            fired = (acts > 0).any(dim=0)
            last_fired = torch.where(fired, torch.full_like(last_fired, step), last_fired)
            if config.architecture == "topk" and config.aux_coefficient > 0:
                dead = step - last_fired >= config.dead_window
                loss = loss + config.aux_coefficient * _aux_loss(sae, pre_acts["pre"], residual.detach(), dead, aux_k)
            elif config.architecture == "standard":
                loss = loss + config.l1_coefficient * (acts * sae.W_dec.norm(dim=-1)).sum(dim=-1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            if config.architecture == "topk":
                with torch.no_grad():
                    sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True))
            losses.append(float(loss.detach()))
    finally:
        sae.hook_sae_acts_pre.remove_hook(handle)
    return losses


def _metadata(model, config: SAETrainingConfig, data: TrainingActivations) -> dict:
    from interp_transformer.sae.processing import CHANGES

    metadata: dict[str, Any] = {"hook_name": config.hook_name, "dataset_path": data.description}
    if model is not None:
        metadata["model_name"] = getattr(model.cfg, "name", None) or type(model).__name__
        steps = [step for step in getattr(model, "processing", []) if step in CHANGES]
        metadata["model_from_pretrained_kwargs"] = {step: True for step in steps}
    if data.eval_tokens is not None:
        metadata["context_size"] = data.eval_tokens.shape[1]
    if data.excluded_ids:
        metadata["exclude_special_tokens"] = list(data.excluded_ids)
    return metadata


def train_on_activations(
    data: TrainingActivations, config: SAETrainingConfig, model=None, progress: bool = False
) -> TrainedSAE:
    """Train on activations already collected (``training_data``); ``model``, when given, is measured with the SAE
    spliced in."""
    if data.hook_name != config.hook_name:
        raise ValueError(f"the activations are from {data.hook_name!r}, the config trains at {config.hook_name!r}")
    generator = torch.Generator().manual_seed(config.seed)
    scaling_factor = math.sqrt(data.d_in) / float(data.train.norm(dim=-1).mean())
    x = data.train * scaling_factor
    d_sae = config.d_sae or config.expansion_factor * data.d_in
    sae = _initial_sae(config, x, d_sae, _metadata(model, config, data), generator)
    with torch.enable_grad():
        losses = fit(sae, x, config, generator, progress)
    sae.requires_grad_(False)
    sae.fold_activation_norm_scaling_factor(scaling_factor)
    train_metrics = measure(sae, data.train)
    sae.sparsity = ((_firing_counts(sae, data.train) / len(data.train)) + 1e-10).log10()
    metrics = measure(sae, data.eval)
    if model is not None and model.capabilities.next_token_logits and data.eval_tokens is not None:
        ce = ce_loss_recovered(model, sae, data.eval_tokens, data.excluded_ids, config.model_batch_size)
        metrics = dataclasses.replace(metrics, ce_loss=ce)
    return TrainedSAE(sae, config, metrics, train_metrics, losses, scaling_factor)


@torch.no_grad()
def _firing_counts(sae: SAE, x, chunk: int = 4096):
    """``[d_sae]``: on how many rows of ``x`` each feature is nonzero."""
    counts = ((sae.encode_with_state(rows, hooked=False)[0] != 0).sum(dim=0) for rows in x.split(chunk))
    return sum(counts, torch.zeros((), dtype=torch.long)).double()  # integer counts, summed exactly


def train_sae(model, data, config: SAETrainingConfig, progress: bool = True) -> TrainedSAE:
    """Train an SAE at ``config.hook_name`` (see the module docstring).

    ``data``: a harvest folder (a ``Path`` or str naming a folder with ``manifest.json``),
    ``TokenBatches``, or anything ``data.token_batches`` reads (text files, a corpus, token
    tensors). ``model`` runs over the tokens (and is measured with the SAE spliced in); with a
    harvest folder it may be None (no CE loss then).
    """
    if not isinstance(config, SAETrainingConfig):
        raise TypeError(f"config must be an SAETrainingConfig, got {type(config).__name__}")
    if model is not None and config.hook_name not in model.hook_dict:
        close = difflib.get_close_matches(config.hook_name, list(model.hook_dict), n=3, cutoff=0.5)
        raise KeyError(f"{config.hook_name!r} is not a hook point of this model; closest: {close}")
    options: dict[str, Any] = dict(
        eval_every=config.eval_every,
        max_tokens=config.max_tokens,
        exclude_special_tokens=config.exclude_special_tokens,
        progress=progress,
    )
    if isinstance(data, (str, Path)) and (Path(data) / "manifest.json").is_file():
        activations = from_harvest(data, config.hook_name, **options)
    else:
        if model is None:
            raise ValueError(
                "training from tokens or text needs the model to run; only a harvest folder can do without"
            )
        batches = (
            data
            if isinstance(data, TokenBatches)
            else token_batches(
                model, data, batch_size=config.model_batch_size, context_length=config.context_length, progress=progress
            )
        )
        activations = from_model(model, batches, config.hook_name, **options)
    return train_on_activations(activations, config, model, progress)


__all__ = ["SAETrainingConfig", "TRAINABLE", "TrainedSAE", "fit", "train_on_activations", "train_sae"]

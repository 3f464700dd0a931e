"""Logistic probes on cached activations, one per site, with the L2 penalty chosen on a validation split.

A probe reads ``x`` (a hook's activation at a token) and predicts a class through
``logits = (x - mean) W^T + b`` (``W [class, d]``), trained by L-BFGS on the mean cross-entropy plus
``l2 / 2 * ||W||^2``. Before training, features are centred on the training mean and divided by one
number (their root-mean-square coordinate), so one grid of penalties suits every layer's scale; ``W`` is
then mapped back, so ``weight`` and ``direction`` live in the basis of the activation the probe reads (the
raw residual stream for ``resid_post``: no per-coordinate scaling that would turn the direction).

For each penalty of ``l2_grid`` the probe is trained on the train examples; the one with the best
validation accuracy (then the lowest validation loss) is kept and reported on the test examples, beside
the control task's probe chosen the same way (``control.py``), and the majority class's accuracy.

>>> import torch
>>> generator = torch.Generator().manual_seed(0)
>>> x = torch.randn(200, 5, generator=generator)
>>> y = (x[:, 2] > 0).long()
>>> probe = fit_probe(x, y, train=torch.arange(120), val=torch.arange(120, 160), test=torch.arange(160, 200))
>>> probe.test_accuracy > 0.9, probe.direction.abs().argmax().item()
(True, 2)
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from .control import control_targets, selectivity
from .examples import Site, collect, example_tokens, label_rows, probe_sites, row_types, split_examples

L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # on features of unit RMS coordinate; the largest first when fitting
SPLIT = (0.6, 0.2, 0.2)  # train, validation, test: fractions of the examples (never of one example's tokens)
MAX_ITER = 300  # L-BFGS iterations per penalty (separable data with a tiny penalty would run on)


@dataclass(frozen=True)
class Probe:
    """One fitted probe: its weights in the basis of the activation it reads, and its accuracies.

    ``weight [class, d]``, ``bias [class]`` and ``mean [d]`` give ``logits = (x - mean) weight^T + bias``.
    Accuracies are fractions of positions; ``control_accuracy`` and ``majority`` are on the test split.
    """

    weight: Tensor
    bias: Tensor
    mean: Tensor
    l2: float
    train_accuracy: float
    val_accuracy: float
    test_accuracy: float
    majority: float
    control_accuracy: float | None = None
    control_l2: float | None = None
    classes: tuple = ()
    site: Site | None = None

    @property
    def selectivity(self) -> float | None:
        """Test accuracy minus the control task's (None when no control task was fitted)."""
        return None if self.control_accuracy is None else selectivity(self.test_accuracy, self.control_accuracy)

    @property
    def direction(self) -> Tensor:
        """A binary probe's unit direction ``[d]``: ``weight[1] - weight[0]``, pointing towards the second class."""
        if self.weight.shape[0] != 2:
            raise ValueError(f"a direction belongs to a probe of two classes, this one has {self.weight.shape[0]}")
        difference = self.weight[1] - self.weight[0]
        return difference / difference.norm().clamp_min(torch.finfo(difference.dtype).tiny)

    def logits(self, features: Tensor) -> Tensor:
        """``[row, class]`` for ``features [row, d]``."""
        if features.ndim != 2 or features.shape[-1] != self.weight.shape[-1]:
            raise ValueError(f"features must be [row, {self.weight.shape[-1]}], got {tuple(features.shape)}")
        return (features.to(self.weight.dtype) - self.mean) @ self.weight.T + self.bias

    def predict(self, features: Tensor) -> Tensor:
        """The class index of each row of ``features [row, d]``."""
        return self.logits(features).argmax(-1)


def _train(x: Tensor, y: Tensor, n_classes: int, l2: float, start: tuple | None) -> tuple[Tensor, Tensor]:
    weight = torch.zeros(n_classes, x.shape[1], dtype=x.dtype) if start is None else start[0].clone()
    bias = torch.zeros(n_classes, dtype=x.dtype) if start is None else start[1].clone()
    weight.requires_grad_(True), bias.requires_grad_(True)
    optimiser = torch.optim.LBFGS(
        [weight, bias], max_iter=MAX_ITER, tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe"
    )

    def closure():
        optimiser.zero_grad()
        loss = F.cross_entropy(x @ weight.T + bias, y) + 0.5 * l2 * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimiser.step(closure)
    return weight.detach(), bias.detach()


def _accuracy(x: Tensor, y: Tensor, weight: Tensor, bias: Tensor) -> float:
    return float(((x @ weight.T + bias).argmax(-1) == y).double().mean())


@dataclass
class _Choice:
    l2: float
    weight: Tensor
    bias: Tensor
    accuracy: dict = field(default_factory=dict)


def _select(x: Tensor, y: Tensor, rows: dict, n_classes: int, l2_grid: Sequence[float]) -> _Choice:
    """Train at each penalty (largest first, each warm-starting the next); keep the best on validation."""
    best, best_key, start = None, None, None
    for l2 in sorted(l2_grid, reverse=True):
        weight, bias = _train(x[rows["train"]], y[rows["train"]], n_classes, l2, start)
        start = (weight, bias)
        val_logits = x[rows["val"]] @ weight.T + bias
        key = (
            _accuracy(x[rows["val"]], y[rows["val"]], weight, bias),
            -float(F.cross_entropy(val_logits, y[rows["val"]])),
        )
        if best_key is None or key > best_key:
            best, best_key = _Choice(l2, weight, bias), key
    best.accuracy = {part: _accuracy(x[index], y[index], best.weight, best.bias) for part, index in rows.items()}
    return best


def _check_grid(l2_grid) -> tuple[float, ...]:
    grid = tuple(l2_grid) if isinstance(l2_grid, Sequence) else (l2_grid,)
    if not grid or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in grid):
        raise ValueError(f"l2_grid must hold positive numbers, got {l2_grid!r}")
    return grid


def fit_probe(
    features: Tensor,
    targets: Tensor,
    train: Tensor,
    val: Tensor,
    test: Tensor,
    control: Tensor | None = None,
    l2_grid: Sequence[float] = L2_GRID,
    classes: tuple = (),
    site: Site | None = None,
) -> Probe:
    """A probe of ``features [row, d]`` for the class indices ``targets [row]``; ``train``/``val``/``test`` are
    row indices. With ``control [row]`` (the control task's class indices) the control probe is fitted the same
    way and its test accuracy reported."""
    if features.ndim != 2 or targets.ndim != 1 or len(features) != len(targets):
        raise ValueError(
            f"features must be [row, d] and targets [row] with the same rows, got {tuple(features.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if not torch.isfinite(features).all():
        raise ValueError(f"{int((~torch.isfinite(features)).sum())} feature values are not finite (NaN or inf)")
    grid = _check_grid(l2_grid)
    x = features.double()
    mean = x[train].mean(0)
    scale = (x[train] - mean).square().mean().sqrt().clamp_min(1e-12)  # one number: the basis is not turned
    x = (x - mean) / scale
    rows = {"train": train, "val": val, "test": test}
    n_classes = int(targets.max()) + 1
    if len(targets[train].unique()) < 2:
        raise ValueError(f"the train split holds one class only ({targets[train][0].item()}): give more examples")
    chosen = _select(x, targets, rows, n_classes, grid)
    majority = float((targets[test] == torch.bincount(targets[train]).argmax()).double().mean())
    control_accuracy = control_l2 = None
    if control is not None:
        if len(control[train].unique()) < 2:  # the control labels are one class: predicting it is always right
            control_accuracy = float((control[test] == control[train][0]).double().mean())
        else:
            control_choice = _select(x, control, rows, int(control.max()) + 1, grid)
            control_accuracy, control_l2 = control_choice.accuracy["test"], control_choice.l2
    return Probe(
        weight=chosen.weight / scale,
        bias=chosen.bias,
        mean=mean,
        l2=chosen.l2,
        train_accuracy=chosen.accuracy["train"],
        val_accuracy=chosen.accuracy["val"],
        test_accuracy=chosen.accuracy["test"],
        majority=majority,
        control_accuracy=control_accuracy,
        control_l2=control_l2,
        classes=classes,
        site=site,
    )


@dataclass
class ProbeResults:
    """The probes of every site, in site order, and what they were trained on."""

    probes: list[Probe]
    classes: tuple
    position: str
    n_examples: int
    n_rows: int
    n_types: int
    split: dict = field(default_factory=dict)  # "train"/"val"/"test" -> example indices

    def __getitem__(self, key) -> Probe:
        """A probe by index, by its site's label (``"blocks.3.hook_resid_post"``) or by ``(hook, head)``."""
        if isinstance(key, int):
            return self.probes[key]
        for probe in self.probes:
            if key in (probe.site.label, (probe.site.hook, probe.site.head)):
                return probe
        raise KeyError(f"no probe at {key!r}; sites: {[probe.site.label for probe in self.probes]}")

    def __len__(self) -> int:
        return len(self.probes)

    def table(self) -> list[str]:
        """One line per site: accuracies, control accuracy, selectivity, the chosen penalty."""
        lines = [f"{'site':<36} {'train':>6} {'val':>6} {'test':>6} {'control':>8} {'select.':>8} {'l2':>7}"]
        for probe in self.probes:
            control = "" if probe.control_accuracy is None else f"{probe.control_accuracy:8.3f}"
            chosen = "" if probe.selectivity is None else f"{probe.selectivity:8.3f}"
            lines.append(
                f"{probe.site.label:<36} {probe.train_accuracy:6.3f} {probe.val_accuracy:6.3f} "
                f"{probe.test_accuracy:6.3f} {control:>8} {chosen:>8} {probe.l2:7.0e}"
            )
        return lines

    def figure(self):
        """Accuracy (with the control task's and the majority class's) and selectivity by layer (``figure.py``)."""
        from .figure import probe_figure

        return probe_figure(self)


def fit_probes(
    model,
    examples,
    labels,
    *,
    hooks=("resid_post",),
    layers=None,
    heads=None,
    position: str = "last",
    types=None,
    control: bool = True,
    l2_grid: Sequence[float] = L2_GRID,
    split: Sequence[float] = SPLIT,
    seed: int = 0,
    batch_size: int = 32,
    progress: bool = True,
) -> ProbeResults:
    """Fit a logistic probe at each site ``hooks`` names (per layer; ``"result"``: per head output) on
    labelled examples (texts or token ids), with the penalty chosen on a validation split and the control task.

    ``position="last"``: ``labels[i]`` is example ``i``'s label, read at its last token; ``"all"``:
    ``labels[i][p]`` labels token ``p`` (None skips it). ``types`` (default: the token id at each probed
    position) are the word types of the control task. Splits are of examples, stratified by label for
    ``"last"``; the same split serves every site and the control task.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    grid = _check_grid(l2_grid)
    tokens = example_tokens(model, examples)
    rows = label_rows(labels, tokens, position)
    kinds = row_types(types, tokens, rows, position)
    sites = probe_sites(model, hooks, layers, heads)
    strata = rows.target if position == "last" else None
    train, val, test = split_examples(len(tokens), split, seed, strata)
    row_index = {
        name: torch.nonzero(torch.isin(rows.example, part)).flatten()
        for name, part in (("train", train), ("val", val), ("test", test))
    }
    for name, index in row_index.items():
        if len(index) == 0:
            raise ValueError(f"the {name} examples hold no labelled position: give more labelled tokens")
    control_rows = control_targets(kinds, rows.target, seed) if control else None
    features = collect(model, tokens, rows, sites, batch_size, progress)
    probes = []
    for site in tqdm(sites, desc="fitting probes", unit="site", disable=not progress):
        probes.append(
            fit_probe(
                features[site],
                rows.target,
                row_index["train"],
                row_index["val"],
                row_index["test"],
                control_rows,
                grid,
                rows.classes,
                site,
            )
        )
    return ProbeResults(
        probes,
        rows.classes,
        position,
        len(tokens),
        len(rows.target),
        len(set(kinds)),
        {"train": train, "val": val, "test": test},
    )

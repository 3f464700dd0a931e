"""Linear probes per layer (and per head output), with the control task that tells probe skill from model knowledge.

``fit_probes(model, examples, labels, hooks=["resid_post"])`` caches the hooks' activations at the labelled
positions (``run_with_cache`` with a names filter), fits a logistic probe per site with the L2 penalty chosen
on a validation split, and fits the same probe on Hewitt and Liang's control task (each word type's label
drawn at random), so each site reports train / validation / test accuracy, the probe's direction in the
activation's basis, and ``selectivity = accuracy - control accuracy`` on held-out examples.

=====================  ======================================================================
``fit_probes``         the whole pipeline over a model's sites (``fit.py``)
``fit_probe``          one probe on given features and splits (``fit.py``)
``control_targets``    the control task's labels, one per word type (``control.py``)
``probe_figure``       accuracy and selectivity by layer, or layer x head (``figure.py``)
``noun_number``        singular/plural nouns at the last token, a labelled set (``datasets.py``)
``subject_number``     the subject's number, read at the end of its phrase (``datasets.py``)
=====================  ======================================================================

See ``docs/probes.md`` for the method, the check on a planted direction and a result on SmolLM2-135M.
"""

from .control import control_targets, selectivity
from .datasets import noun_number, subject_number
from .examples import Site
from .figure import probe_figure
from .fit import L2_GRID, SPLIT, Probe, ProbeResults, fit_probe, fit_probes

__all__ = [
    "L2_GRID",
    "SPLIT",
    "Probe",
    "ProbeResults",
    "Site",
    "control_targets",
    "fit_probe",
    "fit_probes",
    "noun_number",
    "probe_figure",
    "selectivity",
    "subject_number",
]

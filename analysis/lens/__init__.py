"""The tuned lens (Belrose et al. 2023): a learned affine translator per layer, read out through the model's own
final norm and read-out, trained to match the model's final distribution, judged beside the logit lens.

================================  ==============================================================================
``TunedLens``                     the translators; ``for_model``, ``logits``, ``save``/``load`` in ``tuned-lens``'s
                                  layout (``params.pt``, ``config.json``)
``train_tuned_lens``              train on a corpus the harvest reads, with a held-out split (``LensTrainingConfig``)
``evaluate_lens``                 per-layer KL to the final distribution and top-1 agreement, beside the logit lens
``lens_page``                     the evaluation as an offline page; the figure is ``plots.lens.plot_lens_comparison``
================================  ==============================================================================

The command line: ``interp-transformer lens train|eval`` (``analysis.cli.lens``). See ``docs/tuned_lens.md``.
"""

from .data import LensContexts, lens_contexts, split_contexts
from .evaluate import LensEvaluation, evaluate_lens
from .page import lens_page
from .train import LensTraining, LensTrainingConfig, train_tuned_lens
from .translators import TunedLens, TunedLensConfig, read_out

__all__ = [
    "LensContexts",
    "LensEvaluation",
    "LensTraining",
    "LensTrainingConfig",
    "TunedLens",
    "TunedLensConfig",
    "evaluate_lens",
    "lens_contexts",
    "lens_page",
    "read_out",
    "split_contexts",
    "train_tuned_lens",
]

"""Train models built from the package's parts: one trainer for decoders and encoder-decoders.

====================  ===========================================================================
``settings``          ``TrainSettings``: steps, batch, gradient accumulation (and its mean),
                      schedule, AdamW (betas, eps), clipping, label smoothing (and its
                      convention), precision, checkpoints; validated when made
``schedules``         the original Transformer's warmup + inverse square root, and linear warmup +
                      cosine decay
``param_groups``      AdamW's decay groups by each parameter's role, asked of its part (norms,
                      embeddings and biases are not decayed), never by its name
``tasks``             the data: the induction task's repeated random tokens, the translation
                      task's number pairs, and the protocol a task of one's own follows;
                      ``token_loss``, the one loss (next-token for decoders, target tokens for
                      encoder-decoders); ``IGNORE_INDEX`` (PyTorch's -100), the label of a
                      position that predicts nothing
``loop``              ``train``: micro-batches, autocast, clipping, checkpoints, progress bars, and
                      data parallel over ``torchrun``'s processes (the engine ``harvest`` runs on)
``checkpoint``        save and resume: a resumed run equals one that never stopped
``config_file``       the config file of ``interp-transformer train``
``cli``               ``interp-transformer train CONFIG`` and ``python -m interp_transformer.training``
====================  ===========================================================================

A model retrained in a few lines (``docs/training.md`` has more):

>>> from interp_transformer import DemoTransformer, TransformerConfig
>>> from interp_transformer.training import InductionTask, TrainSettings, train
>>> cfg = TransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=None, d_vocab=12, n_ctx=16)
>>> settings = TrainSettings(steps=4, batch=8, micro_batches=2, lr=1e-3, warmup_steps=2, log_every=2, threads=1)
>>> run = train(DemoTransformer(cfg, seed=0), InductionTask(seq_len=6, min_seq_len=3, n_eval=4), settings,
...             progress=False)
>>> run.step, run.curve["steps"], sorted(run.metrics)
(4, [2, 4], ['first_half_loss', 'repeated_half_loss'])
"""

from interp_transformer.training.checkpoint import load_checkpoint
from interp_transformer.training.config_file import TrainingPlan, example_config, plan_from_config
from interp_transformer.training.loop import TrainingRun, train
from interp_transformer.training.param_groups import parameter_groups, parameter_roles
from interp_transformer.training.schedules import cosine, inverse_sqrt, learning_rate
from interp_transformer.training.settings import TrainSettings
from interp_transformer.training.tasks import (
    IGNORE_INDEX,
    TASKS,
    Batch,
    InductionTask,
    TranslationTask,
    check_task,
    make_task,
    token_loss,
)

__all__ = [
    "Batch",
    "IGNORE_INDEX",
    "InductionTask",
    "TASKS",
    "TrainSettings",
    "TrainingPlan",
    "TrainingRun",
    "TranslationTask",
    "check_task",
    "cosine",
    "example_config",
    "inverse_sqrt",
    "learning_rate",
    "load_checkpoint",
    "make_task",
    "parameter_groups",
    "parameter_roles",
    "plan_from_config",
    "token_loss",
    "train",
]

"""Sparse autoencoders and transcoders in SAELens' format: load, encode/decode, splice into a model.

Axes, beside the model's glossary: ``d_in`` (width an SAE reads), ``d_sae``
(number of features), ``d_out`` (width it writes: ``d_in``, or a transcoder's
output width).

- ``SAE.load(folder)`` / ``SAE.from_dict(cfg, tensors)``: the standard, gated,
  top-k, AbsTop-k, JumpReLU and transcoder (plain, skip, JumpReLU) architectures,
  config format 6.x and older (``config``, ``architectures``, ``loading``);
- ``sae.encode(x)``, ``sae.decode(feature_acts)``, ``sae(x)``: SAELens' math,
  hook points named as in SAELens (``sae``, ``normalization``);
- ``splice_saes(model, saes)``, ``run_with_saes``, ``run_with_cache_with_saes``
  (also as ``model.saes(...)``, ``model.run_with_saes``, ``model.run_with_cache_with_saes``):
  the SAE's hook points join the model's (``<hook_name>.hook_sae_acts_post``)
  while its reconstruction replaces the activation (``splice``), on a model
  processed as the SAE expects (``processing``);
- ``train_sae(model, data, SAETrainingConfig(...))``: a small trainer of standard and
  top-k SAEs (``train``), on activations from text, token batches or a harvest folder
  (``data``, ``training_data``), measured by ``metrics``.

Reading features (top examples, logit effects, attribution, dashboards) is on the
analysis side: ``analysis.sae_features``.

See ``docs/saes.md``.
"""

from interp_transformer.sae.architectures import ARCHITECTURES
from interp_transformer.sae.config import SAEConfig
from interp_transformer.sae.processing import ProcessingMismatch, check_processing
from interp_transformer.sae.sae import SAE
from interp_transformer.sae.splice import run_with_cache_with_saes, run_with_saes, splice_saes
from interp_transformer.sae.train import SAETrainingConfig, TrainedSAE, train_sae

__all__ = [
    "ARCHITECTURES",
    "ProcessingMismatch",
    "SAE",
    "SAEConfig",
    "SAETrainingConfig",
    "TrainedSAE",
    "check_processing",
    "run_with_cache_with_saes",
    "run_with_saes",
    "splice_saes",
    "train_sae",
]

"""Build a classic transformer from parts in one call, with no config class and no ``register``.

Each function takes the fields of a spec (the parts by name, the sizes) and returns the model,
initialised like every model here; the spec is its ``cfg``, validated when the call is made, so
a design that cannot be built is refused before any weight exists:

======================================  ================================  ==================================
call                                    spec (``model.cfg``)              model
======================================  ================================  ==================================
``build_decoder(**fields)``             ``DecoderSpec``                   ``DemoTransformer``
``build_encoder(**fields)``             ``EncoderSpec``                   ``EncoderTransformer``
``build_encoder_decoder(**fields)``     ``EncoderDecoderSpec``            ``EncoderDecoderTransformer``
======================================  ================================  ==================================

``build_decoder(placement="post", positions="alibi", ...)`` is ``DemoTransformer(DecoderSpec(placement="post",
positions="alibi", ...))``: the architecture behind each spec is registered by the library, so
hooks, capabilities, ``run_with_cache``, verification, weight processing, the report and the
analysis tools read the result as they read a shipped family. The fields and what each picks:
``interp_transformer.families.composed`` and ``composed_stacks``; the part behind each name:
``architectures.composed_parts``. The parts the shipped families use are ``DecoderSpec`` fields too, named as
their Hugging Face configs name them (``n_key_value_heads``, ``parallel_residual``, ``qk_norm``,
``sliding_window`` with ``layer_types``, ``rotary_dim``, ``rotary_base_local``, ``attn_softcap``,
``final_softcap``, ``post_norms``, and ``placement="output"``), each giving the family's own part.
``load_from_modules`` (``interp_transformer.loading.from_modules``) copies the weights of a model written
in plain PyTorch into the result, part by part.

>>> from interp_transformer.builder import build_decoder
>>> model = build_decoder(d_model=32, n_layers=2, n_heads=4, d_mlp=64, d_vocab=50, n_ctx=16, placement="post",
...                       positions="rotary", seed=0)
>>> model.capabilities.norm_placement, "hook_pos_embed" in model.hook_dict, model.act_name("rot_q", 1)
('post', False, 'blocks.1.attn.hook_rot_q')
>>> build_decoder(d_model=30, n_heads=6, positions="rotary")
Traceback (most recent call last):
...
ValueError: positions='rotary' rotates pairs of dimensions: d_head must be even, got 5
"""

import torch

from interp_transformer.families.composed import DecoderSpec
from interp_transformer.families.composed_parts import ExpertSpec
from interp_transformer.families.composed_stacks import EncoderDecoderSpec, EncoderSpec
from interp_transformer.loading.from_modules import load_from_modules, weights_from_modules
from interp_transformer.models.decoder import DemoTransformer
from interp_transformer.models.encoder import EncoderTransformer
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer

Device = str | torch.device | None


def build_decoder(
    *, dtype: torch.dtype = torch.float32, device: Device = None, seed: int | None = None, tokenizer=None, **fields
) -> DemoTransformer:
    """``DemoTransformer(DecoderSpec(**fields))``: a decoder (causal or not) of the parts ``fields`` name."""
    return DemoTransformer(DecoderSpec(**fields), tokenizer=tokenizer, dtype=dtype, device=device, seed=seed)


def build_encoder(
    *, dtype: torch.dtype = torch.float32, device: Device = None, seed: int | None = None, tokenizer=None, **fields
) -> EncoderTransformer:
    """``EncoderTransformer(EncoderSpec(**fields))``: a BERT-style encoder of the parts ``fields`` name."""
    return EncoderTransformer(EncoderSpec(**fields), tokenizer=tokenizer, dtype=dtype, device=device, seed=seed)


def build_encoder_decoder(
    *, dtype: torch.dtype = torch.float32, device: Device = None, seed: int | None = None, tokenizer=None, **fields
) -> EncoderDecoderTransformer:
    """``EncoderDecoderTransformer(EncoderDecoderSpec(**fields))``: an encoder-decoder of the parts ``fields``
    name."""
    spec = EncoderDecoderSpec(**fields)
    return EncoderDecoderTransformer(spec, tokenizer=tokenizer, dtype=dtype, device=device, seed=seed)


__all__ = [
    "DecoderSpec",
    "EncoderDecoderSpec",
    "EncoderSpec",
    "ExpertSpec",
    "build_decoder",
    "build_encoder",
    "build_encoder_decoder",
    "load_from_modules",
    "weights_from_modules",
]

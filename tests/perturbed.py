"""Small decoders whose every parameter is moved off its init, so no identity passes on a zero or a one."""

import torch

from interp_transformer import DemoTransformer

SMALL_SHAPE = dict(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=31, n_ctx=12)


def perturb(model, scale: float = 0.3, seed: int = 1):
    """Add ``scale * N(0, 1)`` to every parameter (drawn in float32, so any dtype gets the same values); eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * scale)
    return model.eval()


def perturbed_decoder(cfg, dtype: torch.dtype = torch.float64, scale: float = 0.3):
    """``DemoTransformer(cfg)`` (seed 0) with perturbed parameters."""
    return perturb(DemoTransformer(cfg, dtype=dtype, seed=0), scale)

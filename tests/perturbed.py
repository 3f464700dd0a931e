"""Small decoders whose every parameter is moved off its init, so no identity passes on a zero or a one."""

import torch

from interp_transformer import DemoTransformer

SMALL_SHAPE = dict(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=31, n_ctx=12)
# a clean/corrupted pair for circuit discovery on SMALL_SHAPE models: two prompts, two answers each
CLEAN = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])
CORRUPTED = torch.tensor([[1, 6, 9, 2, 8, 3], [4, 5, 8, 1, 2, 6]])
ANSWERS = (torch.tensor([3, 6]), torch.tensor([8, 2]))


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


class LinearNorm(torch.nn.Module):
    """``x w + b``: a norm's place and hooks with nothing nonlinear, for a model that is linear end to end."""

    def __init__(self, d_model: int, generator: torch.Generator, dtype: torch.dtype):
        super().__init__()
        from interp_transformer.hooks import HookPoint

        self.w = torch.nn.Parameter((1 + 0.3 * torch.randn(d_model, generator=generator)).to(dtype))
        self.b = torch.nn.Parameter((0.3 * torch.randn(d_model, generator=generator)).to(dtype))
        self.hook_normalized = HookPoint()

    def normalize(self, x):
        return x * self.w + self.b

    def forward(self, x):
        return self.hook_normalized(self.normalize(x))


def linear_decoder(cfg, dtype: torch.dtype = torch.float64):
    """A perturbed decoder made linear in its input: norms ``x w + b``, MLP activations the identity (a gated
    MLP's gate 1; a mixture's router zero, so its routing is fixed), and
    ``W_Q = W_K = 0`` (every query attends uniformly to the keys before it, whatever the input)."""
    model = perturbed_decoder(cfg, dtype)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for block in model.blocks:
            for name in ("ln1", "ln2", "ln1_post", "ln2_post"):
                if isinstance(getattr(block, name, None), torch.nn.Module):
                    setattr(block, name, LinearNorm(cfg.d_model, generator, dtype))
            block.attn.W_Q.zero_()
            block.attn.stored("W_K").zero_()
            mlp = getattr(block, "mlp", None)
            experts = list(getattr(mlp, "experts", [])) if mlp is not None else []
            if experts:  # a router reading nothing routes every token to the same experts, with the same weights
                mlp.W_router.zero_()
            for part in experts or ([mlp] if mlp is not None else []):  # a gated MLP's gate is 1: act(gate) * up
                part.act_fn = torch.ones_like if hasattr(part, "W_gate") else (lambda x: x)
        model.ln_final = LinearNorm(cfg.d_model, generator, dtype)
    model.setup()
    return model.eval()

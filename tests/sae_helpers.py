"""Helpers of the SAE tests: SAELens' fixtures, random SAEs, and the model the fixtures were spliced into."""

import json
from pathlib import Path

import torch

from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.sae import ARCHITECTURES, SAE

FIXTURES = Path(__file__).parent / "data" / "saelens"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
SAE_CASES = sorted(MANIFEST["cases"])
SPLICE = MANIFEST["splice"]
SPLICE_CFG = TransformerConfig(**SPLICE["model_cfg"])  # d_model 16: the fixtures' d_in


def fixture_sae(name: str) -> SAE:
    return SAE.load(FIXTURES / name)


def saelens_model() -> DemoTransformer:
    """The model SAELens ran the splice cases on: parameters drawn in sorted name order from one seed.

    ``saelens_parity.py`` fills TransformerLens' model the same way; the two share
    parameter names and shapes, so they hold the same weights.
    """
    model = DemoTransformer(SPLICE_CFG).eval()
    names = sorted(name for name, _ in model.named_parameters())
    if names != SPLICE["model_parameters"]:
        raise AssertionError(
            f"parameter names differ from TransformerLens': {set(names) ^ set(SPLICE['model_parameters'])}"
        )
    generator = torch.Generator().manual_seed(SPLICE["model_seed"])
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            leaf = name.rsplit(".", 1)[-1]
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if leaf == "w" else (0.3 * noise if leaf.startswith("W_") else 0.1 * noise))
    return model


def random_sae(
    architecture: str = "standard",
    hook_name: str = "blocks.1.hook_resid_pre",
    d_in: int = 16,
    d_sae: int = 24,
    seed: int = 0,
    **fields,
) -> SAE:
    """An SAE with random weights (thresholds in [0, 1)), from a format-6 config dict."""
    metadata = {"hook_name": hook_name, "sae_lens_version": "6.54.12", **fields.pop("metadata", {})}
    arch = ARCHITECTURES[architecture]
    d_out = fields.pop("d_out", d_in)
    cfg = {"architecture": architecture, "d_in": d_in, "d_sae": d_sae, "metadata": metadata, **fields}
    if arch.transcoder:
        cfg.update(d_out=d_out, apply_b_dec_to_input=False)
    if arch.top_k:
        cfg.setdefault("k", 4)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in arch.shapes(d_in, d_sae, d_out).items():
        if name == "threshold":
            tensors[name] = torch.rand(shape, generator=generator)
        elif name.startswith("W_"):
            tensors[name] = torch.randn(shape, generator=generator) / shape[0] ** 0.5
        else:
            tensors[name] = 0.3 * torch.randn(shape, generator=generator)
    return SAE.from_dict(cfg, tensors)


PROSE = Path(__file__).parent / "data" / "prose"  # a few KB of English prose written for these tests


def prose_files() -> list[Path]:
    return sorted(PROSE.glob("*.txt"))


def gpt2_with_tokenizer(n_embd: int = 32, seed: int = 0, dtype: torch.dtype = torch.float32) -> DemoTransformer:
    """A random-weight 2-layer GPT-2 with GPT-2's real vocabulary and tokenizer (offline), loaded by
    ``from_pretrained``."""
    from interp_transformer.loading import from_pretrained
    from interp_transformer.text.tokens import offline_gpt2_tokenizer

    from .gpt2_helpers import tiny_gpt2

    hf_model = tiny_gpt2(seed, n_embd=n_embd, vocab_size=50257, n_positions=64)
    return from_pretrained(hf_model, dtype=dtype, tokenizer=offline_gpt2_tokenizer()).eval()

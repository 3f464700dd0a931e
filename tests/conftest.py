"""Shared fixtures. Models are built once per session; shape checks are always on here."""

import pytest
import torch

from interp_transformer import DemoTransformer, TransformerConfig, set_shape_checking

set_shape_checking(True)
# Tiny models run fastest on one thread; two threads on a shared 2-core machine oversubscribe.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _shape_checks_on():
    set_shape_checking(True)
    yield


@pytest.fixture(scope="session")
def small_cfg() -> TransformerConfig:
    return TransformerConfig(
        d_model=64, n_layers=2, n_heads=4, d_head=16, d_mlp=256, d_vocab=97, n_ctx=32, name="small"
    )


@pytest.fixture(scope="session")
def small_model(small_cfg) -> DemoTransformer:
    model = DemoTransformer(small_cfg, seed=0)
    model.eval()
    return model


@pytest.fixture(scope="session")
def attn_only_model() -> DemoTransformer:
    cfg = TransformerConfig(
        d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=None, d_vocab=50, n_ctx=24, name="attn-only"
    )
    return DemoTransformer(cfg, seed=1).eval()


@pytest.fixture
def tokens(small_cfg) -> torch.Tensor:
    return torch.randint(0, small_cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))


# The Hugging Face parity tests: every family hook by hook against transformers, verify, and the checkpoint and config
# walk. `.ci/newest` runs them (`-m hf_parity`) against the newest releases pyproject.toml's ranges allow.
HF_PARITY_MODULES = {
    "test_bert_real_weights",
    "test_builder_family_parts",
    "test_checkpoint_walk",
    "test_classic",
    "test_classic_parts",
    "test_encoder",
    "test_encoder_decoder",
    "test_encoder_decoder_generate",
    "test_encoder_decoder_verify",
    "test_encoder_verify",
    "test_gemma",
    "test_llama",
    "test_llama_parts",
    "test_loading_gpt2",
    "test_moe",
    "test_smollm2",
    "test_transformers_drift",
    "test_verify",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in HF_PARITY_MODULES:
            item.add_marker(pytest.mark.hf_parity)

"""The compatibility tests run offline, on one thread, with shape checks on (as the rest of the suite)."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from .hub import AutoTokenizer

    return AutoTokenizer.from_pretrained("gpt2")


@pytest.fixture(scope="session")
def gpt2_model():
    from .hub import stand_in

    return stand_in("gpt2")


@pytest.fixture(scope="session")
def gpt2_hooked_processed():
    from .hub import stand_in

    return stand_in("gpt2")


@pytest.fixture(autouse=True)
def _no_grad_leaks():
    yield
    torch.set_grad_enabled(True)

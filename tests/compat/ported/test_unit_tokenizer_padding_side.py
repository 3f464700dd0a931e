"""Ported from TransformerLens v3.5.1, tests/unit/test_tokenizer_padding_side.py (MIT License, see
LICENSE-TransformerLens).

Changed: imports, and the model source (tests.compat.hub stand-ins for hub checkpoints).
"""

import pytest
from ..hub import AutoTokenizer

from interp_transformer.compat.utils import get_tokenizer_with_bos


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    """A fresh GPT-2 tokenizer (cached by HF). add_bos_token defaults to False."""
    return AutoTokenizer.from_pretrained("gpt2")


def test_padding_side_left_is_preserved(gpt2_tokenizer):
    """User-set padding_side='left' must be preserved through get_tokenizer_with_bos()."""
    gpt2_tokenizer.padding_side = "left"
    result = get_tokenizer_with_bos(gpt2_tokenizer)
    assert result.padding_side == "left", f"padding_side='left' was reset to '{result.padding_side}' after reload"


def test_padding_side_preserved_when_already_has_bos():
    """When add_bos_token is already True, function returns original tokenizer unchanged."""
    tokenizer = AutoTokenizer.from_pretrained("gpt2", add_bos_token=True)
    tokenizer.padding_side = "left"
    result = get_tokenizer_with_bos(tokenizer)
    # Same object (no reload happened), so padding_side is naturally preserved
    assert result.padding_side == "left"

"""Ported from TransformerLens v3.5.1, tests/integration/test_loading_from_pretrained.py (MIT License, see
LICENSE-TransformerLens).

Changed: imports (TransformerLens' loading module is interp_transformer.compat.pretrained).
"""

from interp_transformer.compat import pretrained as loading


def test_get_basic_config():
    cfg = loading.get_basic_config("gpt2-small")
    assert cfg.d_model
    assert cfg.layer_norm_eps
    assert cfg.d_vocab
    assert cfg.init_range
    assert cfg.n_ctx
    assert cfg.d_head
    assert cfg.d_mlp
    assert cfg.n_heads
    assert cfg.n_layers

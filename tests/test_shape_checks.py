"""Canary tests: the jaxtyping annotations are really checked at run time, and the switch works."""

import pathlib

import pytest
import torch
from jaxtyping import TypeCheckError

import interp_transformer
from interp_transformer import set_shape_checking, shape_checking, shape_checking_enabled

from .test_components import single_thread  # noqa: F401


def test_shape_checks_are_on_in_the_test_suite():
    assert shape_checking_enabled()


def _bad_calls(model):
    """(label, call) pairs, each giving one component an input its annotation rejects."""
    d = model.cfg.d_model
    block, attn = model.blocks[0], model.blocks[0].attn
    return [
        ("attention without a batch axis", lambda: attn(torch.randn(5, d))),
        ("attention with an extra axis", lambda: attn(torch.randn(1, 2, 5, d))),
        ("embed given float tokens", lambda: model.embed(torch.rand(2, 5))),
        ("embed given 1-D tokens", lambda: model.embed(torch.zeros(5, dtype=torch.long))),
        ("pos_embed given 1-D tokens", lambda: model.pos_embed(torch.zeros(5, dtype=torch.long))),
        ("layer norm without a batch axis", lambda: block.ln1(torch.randn(5, d))),
        ("mlp given int activations", lambda: block.mlp(torch.zeros(2, 5, d, dtype=torch.long))),
        ("block without a batch axis", lambda: block(torch.randn(5, d))),
        ("unembed without a batch axis", lambda: model.unembed(torch.randn(5, d))),
    ]


@pytest.mark.parametrize("index", range(9))
def test_wrong_shape_or_dtype_raises_the_shape_check_error(small_model, index):
    label, call = _bad_calls(small_model)[index]
    with pytest.raises(TypeCheckError, match="Type-check error"):
        call()


def test_attn_only_block_is_checked(attn_only_model):
    with pytest.raises(TypeCheckError):
        attn_only_model.blocks[0](torch.randn(5, attn_only_model.cfg.d_model))


def test_set_shape_checking_false_disables_the_checks(small_model):
    tokens_1d = torch.zeros(5, dtype=torch.long)
    x_2d = torch.randn(5, small_model.cfg.d_model)
    try:
        set_shape_checking(False)
        assert not shape_checking_enabled()
        # the unchecked code happily computes on the wrong shapes
        assert small_model.embed(tokens_1d).shape == (5, small_model.cfg.d_model)
        assert small_model.blocks[0].ln1(x_2d).shape == (5, small_model.cfg.d_model)
    finally:
        set_shape_checking(True)
    with pytest.raises(TypeCheckError):
        small_model.embed(tokens_1d)
    with shape_checking(False):
        assert small_model.blocks[0].ln1(x_2d).shape == (5, small_model.cfg.d_model)
    assert shape_checking_enabled()
    with pytest.raises(TypeCheckError):
        small_model.blocks[0].ln1(x_2d)
    with pytest.raises(TypeError, match="bool"):
        set_shape_checking("no")


def test_checked_modules_never_postpone_annotations():
    """``from __future__ import annotations`` turns annotations into strings and silences the checks."""
    root = pathlib.Path(interp_transformer.__file__).parent
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "from __future__ import annotations" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []

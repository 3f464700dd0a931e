"""Where W_Q/W_K/W_V lie in memory (``components.head_projection``): every layout gives the same values.

References: the projection computed one head at a time with ``@``; Hugging Face models
through ``verify_against_hf`` with each layout forced; and the layouts' own definitions
(a view shares the weight's memory, a copy does not).
"""

import einops
import pytest
import torch

from interp_transformer.loading import from_pretrained
from interp_transformer.parts import head_projection
from interp_transformer.parts.head_projection import (
    heads_side_by_side,
    new_head_weight,
    placed,
    placed_copy,
    project_heads,
    side_by_side_matrix,
)
from interp_transformer.verify import verify_against_hf

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import FAMILIES, random_tokens, tiny_hf_model

D_MODEL, D_HEAD = 10, 4


def one_head_at_a_time(x, W, b):
    return torch.stack([x @ W[h] + b[h] for h in range(W.shape[0])], dim=2)


def laid_out(layout: str, n_heads: int) -> torch.Tensor:
    """A float64 ``[n_heads, D_MODEL, D_HEAD]`` weight in one of the layouts a weight can arrive in."""
    generator = torch.Generator().manual_seed(n_heads)
    values = torch.randn(n_heads, D_MODEL, D_HEAD, generator=generator, dtype=torch.float64)
    if layout == "head by head":
        return values
    if layout == "side by side":
        return einops.rearrange(values, "h d e -> d h e").contiguous().permute(1, 0, 2)
    if layout == "fused qkv slice":  # GPT-2's c_attn [d_model, 3 * n_heads * d_head], its first third
        fused = torch.cat(
            [
                einops.rearrange(values, "h d e -> d (h e)"),
                torch.zeros(D_MODEL, 2 * n_heads * D_HEAD, dtype=torch.float64),
            ],
            dim=1,
        )
        return einops.rearrange(fused[:, : n_heads * D_HEAD], "d (h e) -> h d e", e=D_HEAD)
    if layout == "nn.Linear":  # [(h e), d] viewed per head: neither contiguous nor side by side
        return einops.rearrange(einops.rearrange(values, "h d e -> (h e) d").contiguous(), "(h e) d -> h d e", e=D_HEAD)
    raise ValueError(layout)


LAYOUTS = ["head by head", "side by side", "fused qkv slice", "nn.Linear"]


@pytest.mark.parametrize("n_heads", [1, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_projects_like_one_head_at_a_time(layout, n_heads):
    W = laid_out(layout, n_heads)
    b = torch.randn(n_heads, D_HEAD, dtype=torch.float64)
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    torch.testing.assert_close(project_heads(x, W, b), one_head_at_a_time(x, W, b), atol=1e-12, rtol=0)
    matrix = side_by_side_matrix(W)
    one_product = layout in ("side by side", "fused qkv slice") or (n_heads == 1 and layout == "head by head")
    assert (matrix is not None) == one_product
    if matrix is not None:  # a view of the weight, not a copy
        assert matrix.data_ptr() == W.data_ptr()
        torch.testing.assert_close(matrix, einops.rearrange(W, "h d e -> d (h e)"), atol=0, rtol=0)


@pytest.mark.parametrize(
    "threads, n_heads, side_by_side",
    [(1, 9, False), (1, 12, False), (2, 9, True), (2, 3, True), (2, 12, False), (3, 9, False), (4, 6, True)],
)
def test_heads_lie_side_by_side_when_they_do_not_divide_among_the_threads(threads, n_heads, side_by_side):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert heads_side_by_side(n_heads, "auto") == side_by_side  # the thread count, read only for "auto"
        W = new_head_weight(n_heads, D_MODEL, D_HEAD, "auto")
        assert W.shape == (n_heads, D_MODEL, D_HEAD)
        assert (side_by_side_matrix(W) is not None) == side_by_side
        assert W.is_contiguous() != side_by_side
        for layout in LAYOUTS:  # placed: the same values in that layout, the weight itself when already there
            given = laid_out(layout, n_heads)
            put = placed(given, "auto")
            torch.testing.assert_close(put, given, atol=0, rtol=0)
            assert (side_by_side_matrix(put) is not None) == side_by_side and put.is_contiguous() != side_by_side
            already = (side_by_side_matrix(given) is not None) if side_by_side else given.is_contiguous()
            assert (put.data_ptr() == given.data_ptr()) == already
            copy = placed_copy(given, "auto")
            torch.testing.assert_close(copy, given, atol=0, rtol=0)
            assert copy.untyped_storage().data_ptr() != given.untyped_storage().data_ptr()
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(params=[True, False], ids=["side by side", "head by head"])
def forced_layout(request, monkeypatch):
    """Every weight made or loaded in this test lies as the parameter says, whatever the thread count."""
    monkeypatch.setattr(head_projection, "heads_side_by_side", lambda n_heads, layout=None: request.param)
    return request.param


def lies_as(W: torch.Tensor, side_by_side: bool) -> bool:
    return (side_by_side_matrix(W) is not None) if side_by_side else W.is_contiguous()


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_loaded_weights_take_the_layout_and_match_hugging_face(label, forced_layout):
    hf_model = tiny_hf_model(label)
    model = from_pretrained(hf_model)
    attn = model.blocks[0].attn
    for name in ("W_Q", "W_K", "W_V"):
        weight = attn.W_Q if name == "W_Q" else attn.stored(name)
        assert lies_as(weight, forced_layout), f"{name} {tuple(weight.stride())}"
    report = verify_against_hf(
        model, hf_model, tokens=random_tokens(2, 7, seed=1), float64_recheck=False, atol=1e-4, rtol=0
    )
    assert report.within_tolerance, str(report)


def test_a_state_dict_loads_into_either_layout_with_the_same_logits(monkeypatch):
    """Loading copies values, not layouts: a side-by-side model's weights in a head-by-head model, and back."""
    hf_model = tiny_hf_model("llama-gqa3-tied-llama3")
    tokens = random_tokens(2, 7, seed=2)
    monkeypatch.setattr(head_projection, "heads_side_by_side", lambda n_heads, layout=None: True)
    side = from_pretrained(hf_model)
    monkeypatch.setattr(head_projection, "heads_side_by_side", lambda n_heads, layout=None: False)
    head = from_pretrained(hf_model)
    head.load_state_dict(side.state_dict())  # copy_ into head-by-head parameters: they keep their layout
    assert lies_as(head.blocks[0].attn.W_Q, False) and lies_as(side.blocks[0].attn.W_Q, True)
    torch.testing.assert_close(head(tokens), side(tokens), atol=1e-5, rtol=0)
    reloaded = from_pretrained(hf_model)
    reloaded.load_state_dict(side.state_dict(), assign=True)  # assign: laid out as this model lays its weights
    assert lies_as(reloaded.blocks[0].attn.W_Q, False)
    torch.testing.assert_close(reloaded(tokens), side(tokens), atol=1e-5, rtol=0)

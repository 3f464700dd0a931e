"""``head_layout``: where W_Q/W_K/W_V lie in memory is an explicit option, never the thread count at creation.

References: the layouts' definitions (``side_by_side_matrix``, ``is_contiguous``), the same
model re-laid with ``set_head_layout`` (a layout changes strides, never values), and the
explicit einsum path, which reads no layout.
"""

import copy
import re

import pytest
import torch

from interp_transformer import DemoTransformer
from interp_transformer.families.gpt2.recipe import TransformerConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.loading import from_pretrained
from interp_transformer.parts.attention import Attention
from interp_transformer.parts.head_projection import (
    DEFAULT_HEAD_LAYOUT,
    HEAD_LAYOUTS,
    heads_side_by_side,
    new_head_weight,
    placed,
    set_head_layout,
    side_by_side_matrix,
)

from .gpt2_helpers import (
    one_thread,  # noqa: F401 (autouse fixture)
    tiny_gpt2,
)

CONFIGS = {
    "gpt2, 3 heads": TransformerConfig(d_model=24, n_layers=2, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=32),
    "llama, 4 query / 2 key-value heads": LlamaConfig(
        d_model=24, n_layers=2, n_heads=4, n_key_value_heads=2, d_head=8, d_mlp=40, d_vocab=50, n_ctx=32
    ),
}
TOKENS = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))


def head_weights(model) -> dict[str, torch.Tensor]:
    """Every W_Q/W_K/W_V as stored (grouped keys and values as ``_W_K``, ``_W_V``)."""
    return {
        name: param
        for name, param in model.named_parameters()
        if name.rsplit(".", 1)[-1] in ("W_Q", "W_K", "W_V", "_W_K", "_W_V")
    }


def lies_side_by_side(W: torch.Tensor) -> bool:
    return side_by_side_matrix(W) is not None and not (W.shape[0] > 1 and W.is_contiguous())


def with_threads(threads: int, make):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return make()
    finally:
        torch.set_num_threads(previous)


def test_the_default_is_side_by_side():
    assert DEFAULT_HEAD_LAYOUT == "side_by_side" and DEFAULT_HEAD_LAYOUT in HEAD_LAYOUTS
    model = DemoTransformer(CONFIGS["llama, 4 query / 2 key-value heads"], seed=0)
    assert all(attn.head_layout == "side_by_side" for attn in (block.attn for block in model.blocks))
    weights = head_weights(model)
    assert len(weights) == 6  # W_Q, _W_K, _W_V in each of 2 layers
    assert all(lies_side_by_side(W) for W in weights.values()), {n: W.stride() for n, W in weights.items()}


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_the_default_layout_does_not_follow_the_thread_count(label):
    """The same parameters, values and strides, however many threads there were when the model was made."""
    original = torch.get_num_threads()
    built = {threads: with_threads(threads, lambda: DemoTransformer(CONFIGS[label], seed=0)) for threads in (1, 2, 3)}
    assert torch.get_num_threads() == original
    reference = built[1].state_dict()
    for threads, model in built.items():
        state = model.state_dict()
        assert list(state) == list(reference)
        for name, tensor in state.items():
            assert torch.equal(tensor, reference[name]), f"{threads} threads: {name}"
            assert tensor.stride() == reference[name].stride(), f"{threads} threads: {name} {tensor.stride()}"
    for threads in (1, 2, 3):  # a single weight, and a loaded model, likewise
        W = with_threads(threads, lambda: new_head_weight(3, 24, 8))
        assert lies_side_by_side(W), (threads, W.stride())
        loaded = with_threads(threads, lambda: from_pretrained(tiny_gpt2(n_head=4)))
        assert all(lies_side_by_side(W) for W in head_weights(loaded).values()), threads


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_every_layout_gives_the_same_values_and_outputs(label, dtype):
    model = DemoTransformer(CONFIGS[label], dtype=dtype, seed=0).eval()
    reference_state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    laid = {layout: set_head_layout(copy.deepcopy(model), layout) for layout in HEAD_LAYOUTS}
    fast = {layout: m(TOKENS) for layout, m in laid.items()}
    for m in laid.values():
        for block in m.blocks:
            block.attn.use_fused_attention = False
    explicit = {layout: m(TOKENS) for layout, m in laid.items()}
    for layout, m in laid.items():
        assert all(block.attn.head_layout == layout for block in m.blocks)
        state = m.state_dict()
        assert list(state) == list(reference_state)
        for name, tensor in state.items():  # strides may differ, values never
            assert tensor.dtype == dtype and torch.equal(tensor, reference_state[name]), f"{layout}: {name}"
        weights = head_weights(m)
        if layout != "auto":
            side_by_side = layout == "side_by_side"
            assert all(lies_side_by_side(W) == side_by_side for W in weights.values()), layout
        assert torch.equal(explicit[layout], explicit["side_by_side"]), layout  # the einsum path reads no layout
        # the fast product: one addmm or a batched one, the same sums in another order
        atol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(fast[layout], fast["side_by_side"], atol=atol, rtol=0)
        torch.testing.assert_close(fast[layout], explicit[layout], atol=atol, rtol=0)


def test_set_head_layout_keeps_the_parameters_and_later_loads_follow_it():
    model = DemoTransformer(CONFIGS["llama, 4 query / 2 key-value heads"], seed=0)
    before = head_weights(model)
    values = {name: W.detach().clone() for name, W in before.items()}
    assert set_head_layout(model, "per_head") is model
    after = head_weights(model)
    for name, W in after.items():
        assert W is before[name] and W.is_contiguous() and torch.equal(W, values[name]), name
    model.load_state_dict(
        DemoTransformer(CONFIGS["llama, 4 query / 2 key-value heads"], seed=1).state_dict(), assign=True
    )
    assert all(W.is_contiguous() for W in head_weights(model).values())
    set_head_layout(model.blocks[0], "side_by_side")  # one block: only its parts
    assert all(lies_side_by_side(W) == name.startswith("blocks.0.") for name, W in head_weights(model).items())


@pytest.mark.parametrize("threads, n_heads, side_by_side", [(1, 3, False), (2, 3, True), (2, 4, False), (3, 4, True)])
def test_auto_reads_the_thread_count_only_when_asked(threads, n_heads, side_by_side):
    def check():
        assert heads_side_by_side(n_heads, "auto") == side_by_side
        assert heads_side_by_side(n_heads) and not heads_side_by_side(n_heads, "per_head")
        assert lies_side_by_side(new_head_weight(n_heads, 24, 8, "auto")) == side_by_side
        assert lies_side_by_side(placed(torch.randn(n_heads, 24, 8), "auto")) == side_by_side

    with_threads(threads, check)


@pytest.mark.parametrize("bad", ["columns", "auto ", None, 1])
def test_a_bad_layout_is_refused_naming_the_choices(bad):
    message = re.escape(f"head_layout must be one of 'side_by_side', 'per_head', 'auto'; got {bad!r}")
    with pytest.raises(ValueError, match=message):
        set_head_layout(DemoTransformer(CONFIGS["gpt2, 3 heads"], seed=0), bad)
    with pytest.raises(ValueError, match=message):
        Attention(CONFIGS["gpt2, 3 heads"], head_layout=bad)
    with pytest.raises(ValueError, match=message):
        new_head_weight(3, 24, 8, bad)


def test_the_layout_survives_a_change_of_dtype():
    model = DemoTransformer(CONFIGS["gpt2, 3 heads"], seed=0)
    assert all(lies_side_by_side(W) for W in head_weights(model.to(torch.float64)).values())
    set_head_layout(model, "per_head")
    assert all(W.is_contiguous() for W in head_weights(model.to(torch.float32)).values())

"""Every fast computation against the readable one it replaces.

Fused attention and fused LayerNorm run only while nobody observes what they skip
(the pattern, the scale); projections add their bias inside the matrix product; the
shape checks remember verdicts. Each is checked here against the explicit formula.
"""

import threading

import einops
import pytest
import torch
from jaxtyping import Float, TypeCheckError
from torch import Tensor

from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts import Attention, LayerNorm
from interp_transformer.parts.affine import affine

from .test_components import randomize, single_thread  # noqa: F401

CFG = TransformerConfig(d_model=48, n_layers=2, n_heads=3, d_head=16, d_mlp=96, d_vocab=61, n_ctx=20)
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_and_explicit_layer_norm_agree(dtype):
    ln = LayerNorm(CFG.d_model, CFG.layer_norm_eps).to(dtype)
    with torch.no_grad():
        ln.w.normal_(1.0, 0.3)
        ln.b.normal_(0.0, 0.3)
    x = 3 * torch.randn(2, 7, CFG.d_model, dtype=dtype, generator=torch.Generator().manual_seed(0)) + 1
    assert ln.uses_fused_path()
    fused = ln(x)
    ln.use_fused_layer_norm = False
    explicit = ln(x)
    centred = x - x.mean(-1, keepdim=True)
    by_hand = centred / (centred.pow(2).mean(-1, keepdim=True) + CFG.layer_norm_eps).sqrt() * ln.w + ln.b
    torch.testing.assert_close(fused, explicit, rtol=0, atol=TOLERANCE[dtype])
    torch.testing.assert_close(explicit, by_hand, rtol=0, atol=TOLERANCE[dtype])


def test_observing_the_scale_selects_the_explicit_layer_norm():
    model = DemoTransformer(CFG, seed=0)
    ln = model.blocks[1].ln2
    assert ln.uses_fused_path()
    with model.hooks([("blocks.1.ln2.hook_scale", lambda t, hook: None)]):
        assert not ln.uses_fused_path()
        assert all(other.uses_fused_path() for other in (model.blocks[0].ln1, model.ln_final))
    assert ln.uses_fused_path()
    _, cache = model.run_with_cache(torch.arange(10), names_filter="blocks.1.ln2.hook_scale")
    assert cache["scale", 1, "ln2"].shape == (1, 10, 1)


def random_attention(dtype: torch.dtype, seed: int, scale: float) -> tuple[Attention, torch.Generator]:
    attn = Attention(CFG).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=dtype) * scale)
    return attn, generator


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_and_explicit_attention_agree(dtype):
    attn, generator = random_attention(dtype, seed=1, scale=0.3)
    x = torch.randn(2, 9, CFG.d_model, dtype=dtype, generator=generator)
    assert attn.uses_fused_path()
    fused = attn(x)
    with_pattern = []
    attn.hook_pattern.add_hook(lambda t, hook: with_pattern.append(t))
    assert not attn.uses_fused_path()
    explicit = attn(x)
    attn.hook_pattern.remove_hooks()
    torch.testing.assert_close(fused, explicit, rtol=0, atol=TOLERANCE[dtype])
    assert with_pattern[0].shape == (2, CFG.n_heads, 9, 9)


def test_a_given_pattern_replaces_the_scores_without_computing_them():
    attn, generator = random_attention(torch.float64, seed=3, scale=0.3)
    x = torch.randn(3, 7, CFG.d_model, dtype=torch.float64, generator=generator)
    seen = {"scores": 0, "patterns": []}
    attn.hook_attn_scores.add_hook(lambda t, hook: seen.update(scores=seen["scores"] + 1))
    attn.hook_pattern.add_hook(lambda t, hook: seen["patterns"].append(t))
    expected = attn(x)
    own = seen["patterns"][0]
    with attn.pattern_given(own):
        assert not attn.uses_fused_path() and attn.given_pattern is own
        assert torch.equal(attn(x), expected) and seen["scores"] == 1  # the same output, and no second scores
    other = torch.rand(1, CFG.n_heads, 7, 7, dtype=torch.float64, generator=generator)
    v = einops.einsum(x, attn.W_V, "b p d, h d e -> b p h e") + attn.b_V
    z = einops.einsum(other, v, "one h q k, b k h e -> b q h e")
    with attn.pattern_given(other):  # one pattern for every row: z = pattern v, row by row
        torch.testing.assert_close(attn(x), attn._combine_heads(z), rtol=0, atol=1e-12)
        with pytest.raises(RuntimeError, match="already has a pattern given"), attn.pattern_given(own):
            pass
    assert seen["scores"] == 1 and seen["patterns"][-1].shape == (3, CFG.n_heads, 7, 7)
    with (
        attn.pattern_given(other[:, :, :6]),
        pytest.raises(
            ValueError, match=r"pattern_given: the pattern must have shape \[1 or 3, 3, 7, 7\], got \(1, 3, 6, 7\)"
        ),
    ):
        attn(x)
    assert attn.given_pattern is None
    attn.hook_attn_scores.remove_hooks()
    attn.hook_pattern.remove_hooks()
    assert attn.uses_fused_path()  # unhooked and no pattern given: the fused kernel again
    torch.testing.assert_close(attn(x), expected, rtol=0, atol=1e-12)


def test_a_given_pattern_is_the_giving_threads_only():
    attn, generator = random_attention(torch.float64, seed=4, scale=0.3)
    x = torch.randn(2, 5, CFG.d_model, dtype=torch.float64, generator=generator)
    expected = attn(x)
    given, release, seen = threading.Event(), threading.Event(), {}

    def give() -> None:
        with attn.pattern_given(torch.full((1, CFG.n_heads, 5, 5), 0.2, dtype=torch.float64)):
            seen["giver"] = attn(x)
            given.set()
            release.wait(30)

    thread = threading.Thread(target=give)
    thread.start()
    assert given.wait(30)
    seen["other"] = attn(x)  # while the other thread holds its pattern
    release.set()
    thread.join()
    assert not torch.allclose(seen["giver"], expected)
    torch.testing.assert_close(seen["other"], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_projections_equal_the_per_head_einsum(dtype):
    attn, generator = random_attention(dtype, seed=2, scale=1.0)
    x = torch.randn(2, 5, CFG.d_model, dtype=dtype, generator=generator)
    q = attn._project(x, attn.W_Q, attn.b_Q)
    for head in range(CFG.n_heads):
        torch.testing.assert_close(
            q[:, :, head], x @ attn.W_Q[head] + attn.b_Q[head], rtol=0, atol=100 * TOLERANCE[dtype]
        )
    z = torch.randn(2, 5, CFG.n_heads, CFG.d_head, dtype=dtype, generator=generator)
    by_heads = sum(z[:, :, head] @ attn.W_O[head] for head in range(CFG.n_heads)) + attn.b_O
    torch.testing.assert_close(attn._combine_heads(z), by_heads, rtol=0, atol=100 * TOLERANCE[dtype])


def test_affine_is_einsum_plus_bias_and_rejects_mismatched_shapes():
    generator = torch.Generator().manual_seed(3)
    x, W, b = (torch.randn(shape, generator=generator, dtype=torch.float64) for shape in [(2, 3, 4), (4, 5), (5,)])
    expected = einops.einsum(x, W, "batch pos d_in, d_in d_out -> batch pos d_out") + b
    torch.testing.assert_close(affine(x, W, b), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"W \[d_in, d_out\].*got x \(2, 3, 4\), W \(5, 4\)"):
        affine(x, W.T, b)


def test_the_whole_fast_forward_equals_the_all_explicit_forward():
    model = randomize(DemoTransformer(CFG, dtype=torch.float64, seed=0), seed=5).eval()
    tokens = torch.randint(0, CFG.d_vocab, (2, CFG.n_ctx), generator=torch.Generator().manual_seed(4))
    fast = model(tokens)
    for module in model.modules():
        if isinstance(module, Attention):
            module.use_fused_attention = False
        if isinstance(module, LayerNorm):
            module.use_fused_layer_norm = False
    torch.testing.assert_close(fast, model(tokens), rtol=0, atol=1e-10)


# --- remembered shape-check verdicts ------------------------------------------------------
class Doubler:
    """A checked method whose result's size comes from the instance, not from the arguments."""

    def __init__(self, width: int, extra_rows: int = 0):
        self.width, self.extra_rows = width, extra_rows

    @shape_checked
    def __call__(self, x: Float[Tensor, "rows cols"]) -> Float[Tensor, "rows width"]:
        return torch.zeros(x.shape[0] + self.extra_rows, self.width)


def test_a_remembered_signature_still_checks_a_different_result():
    x = torch.zeros(2, 3)
    assert Doubler(4)(x).shape == (2, 4)
    assert Doubler(5)(x).shape == (2, 5)  # same argument shapes, another result shape: checked, passes
    with pytest.raises(TypeCheckError, match="return value"):
        Doubler(4, extra_rows=1)(x)  # the full check binds rows=2 from x and rejects 3 rows


def test_new_argument_shapes_always_get_the_full_check():
    checked = Doubler(4)
    checked(torch.zeros(2, 3))
    with pytest.raises(TypeCheckError):
        checked(torch.zeros(2, 3, 1))
    with pytest.raises(TypeCheckError):
        checked(torch.zeros(2, 3, dtype=torch.long))


def test_remembered_signatures_are_bounded():
    from interp_transformer.core import shape_checks

    checked = Doubler(1)
    for rows in range(1, shape_checks.MAX_REMEMBERED_SIGNATURES + 20):
        checked(torch.zeros(rows, 1))
    assert len(Doubler.__call__.remembered_signatures) == shape_checks.MAX_REMEMBERED_SIGNATURES


# --- one Attention, every mask: the fused kernel against the explicit formula ---------------
from interp_transformer.core.kv_cache import LayerKVCache  # noqa: E402
from interp_transformer.parts import CausalMask, PaddingMask, SlidingWindowMask, TokenLayout  # noqa: E402
from interp_transformer.parts.scores import masked_scores  # noqa: E402

PADDED = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])  # a left-padded and a right-padded row
MASK_CASES = {
    "causal": ((CausalMask(), PaddingMask()), None),
    "causal+left/right padding": ((CausalMask(), PaddingMask()), PADDED),
    "bidirectional padding": ((PaddingMask(),), PADDED),
    "no mask": ((), None),
    "sliding window 3": ((SlidingWindowMask(3), PaddingMask()), None),
    "sliding window 2, padded": ((SlidingWindowMask(2), PaddingMask()), PADDED),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(MASK_CASES))
def test_fused_and_explicit_attention_agree_under_every_mask(case, dtype):
    masks, attention_mask = MASK_CASES[case]
    attn, generator = random_attention(dtype, seed=5, scale=0.3)
    attn.masks = torch.nn.ModuleList(masks)
    x = torch.randn(2, 7, CFG.d_model, dtype=dtype, generator=generator)
    layout = TokenLayout.contiguous(2, 7) if attention_mask is None else TokenLayout.from_attention_mask(attention_mask)
    fused = attn(x, layout)
    attn.use_fused_attention = False
    explicit = attn(x, layout)
    real = torch.ones(2, 7, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    torch.testing.assert_close(fused[real], explicit[real], rtol=0, atol=TOLERANCE[dtype])
    assert torch.isfinite(explicit).all() and torch.isfinite(fused).all()  # padding rows too: finite, never NaN


@pytest.mark.parametrize("case", ["causal", "sliding window 3"])
def test_attention_with_a_key_value_cache_equals_the_whole_sequence(case):
    masks, _ = MASK_CASES[case]
    attn, generator = random_attention(torch.float64, seed=6, scale=0.3)
    attn.masks = torch.nn.ModuleList(masks)
    x = torch.randn(2, 7, CFG.d_model, dtype=torch.float64, generator=generator)
    whole = attn(x, TokenLayout.contiguous(2, 7))
    for fused in (True, False):
        attn.use_fused_attention = fused
        cache = LayerKVCache()
        steps = [attn(x[:, :4], TokenLayout.contiguous(2, 4), cache)]
        steps += [attn(x[:, p : p + 1], TokenLayout.contiguous(2, 1, offset=p), cache) for p in range(4, 7)]
        torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=0, atol=1e-12)


def test_masked_scores_is_the_einsum_formula_with_the_mask():
    generator = torch.Generator().manual_seed(7)
    q, k = (torch.randn(2, 5, 3, 4, dtype=torch.float64, generator=generator) for _ in range(2))
    per_row = torch.rand(2, 1, 5, 5, generator=generator) > 0.3
    shared = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    formula = (
        einops.einsum(
            q,
            k,
            "batch query_pos head_index d_head, batch key_pos head_index d_head -> batch head_index query_pos key_pos",
        )
        * 0.5
    )
    for allowed in (None, shared, per_row):
        expected = formula if allowed is None else formula.masked_fill(~allowed, float("-inf"))
        torch.testing.assert_close(masked_scores(q, k, 0.5, allowed), expected, rtol=0, atol=1e-12)

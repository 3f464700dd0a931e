"""TransformerLens' public surface beyond the classic model: its exception classes, hook introspection, the
remainder at layer 0, tensor-like operands, ``unembed``'s hooks, full names in ``get_act_name``, duck-typed
tokenizers, key/value patching on grouped-query attention, and its module paths.

Each is checked against a reference: the core API on the same inputs (same message, plain type), a value
read from the cache, a product computed densely, or patching done one head at a time with hooks.
"""

import importlib

import numpy as np
import pytest
import torch

import interp_transformer
from interp_transformer import DemoTransformer, HookedTransformer, HookedTransformerConfig, TransformerConfig, utils
from interp_transformer.cache.activations import ActivationCache as CoreActivationCache
from interp_transformer.circuits.factored_matrix import FactoredMatrix as CoreFactoredMatrix
from interp_transformer.compat import FactoredMatrix, head_detector, patching
from interp_transformer.compat.errors import CompatKeyError, CompatValueError, assertion_compatible
from interp_transformer.hooks import HookedRootModule

from ..gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)

TOKENS = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(0))


def tiny(**overrides) -> HookedTransformer:
    settings = dict(n_layers=2, d_model=24, d_head=6, n_ctx=12, d_vocab=30, act_fn="gelu", seed=0)
    model = HookedTransformer(HookedTransformerConfig(**{**settings, **overrides}, dtype=torch.float64))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return tiny()


# --- 1. exception classes ------------------------------------------------------------------------------------------
def test_compat_errors_are_also_assertion_errors_with_the_core_message(model):
    with pytest.raises(KeyError) as core:  # the core's own check, on the same hook points: a plain KeyError
        HookedRootModule.resolve_hook_names(model, ["blocks.0.hook_resid_prei"])
    assert not isinstance(core.value, AssertionError)
    with pytest.raises(AssertionError) as compat:
        model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_prei", lambda x, hook: x)])
    assert type(compat.value) is CompatKeyError and str(compat.value) == str(core.value)
    assert "blocks.0.hook_resid_pre" in str(compat.value)  # the closest name
    with pytest.raises(CompatKeyError):
        model.add_hook("hook_embedd", lambda x, hook: x)
    with pytest.raises(CompatKeyError), model.hooks([("hook_embedd", print)]):
        pass

    a, b = torch.randn(3, 2), torch.randn(2, 4)
    with pytest.raises(ValueError) as core:
        CoreFactoredMatrix(a, b) * torch.randn(2, 2)
    assert not isinstance(core.value, AssertionError)
    with pytest.raises(AssertionError) as compat:
        FactoredMatrix(a, b) * torch.randn(2, 2)
    assert type(compat.value) is CompatValueError and str(compat.value) == str(core.value)

    settings = dict(n_layers=1, d_model=16, d_head=4, n_ctx=16, d_vocab=-1, seed=0)
    reader = HookedTransformer(HookedTransformerConfig(**settings), tokenizer=CharTokenizer())
    with pytest.raises(AssertionError, match="lower triangular"):  # "abcab" is 6 tokens with the BOS
        head_detector.detect_head(reader, "abcab", torch.ones(6, 6))
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError) as core:
        CoreActivationCache(dict(cache.items()), model).remove_batch_dim()
    assert not isinstance(core.value, AssertionError)
    with pytest.raises(AssertionError, match="batch size 1"):
        cache.remove_batch_dim()
    with pytest.raises(AssertionError):
        utils.get_act_name("not_a_name", 0)


def test_errors_with_a_meaning_of_their_own_pass_through_unchanged():
    from interp_transformer.sae.processing import ProcessingMismatch

    def refuse(kind):
        raise kind("why")

    for kind in (ProcessingMismatch, TypeError, IndexError):
        with pytest.raises(kind) as raised:
            assertion_compatible(refuse)(kind)
        assert type(raised.value) is kind


# --- 2. hook introspection -----------------------------------------------------------------------------------------
def test_list_hooks_names_the_user_hooks_of_every_kind(model):
    def double(x, hook):
        return 2 * x

    def keep(x, hook):
        return None

    model.reset_hooks(including_permanent=True)
    try:
        model.add_perma_hook("blocks.0.hook_resid_pre", keep)
        model.add_hook("blocks.1.attn.hook_z", double, dir="bwd")
        with model.hooks([("hook_embed", double)]):
            hooks = model.list_hooks()
            assert {name: [h.user_hook for h in found] for name, found in hooks.items()} == {
                "hook_embed": [double],
                "blocks.0.hook_resid_pre": [keep],
                "blocks.1.attn.hook_z": [double],
            }
            assert repr(model.hook_embed) == "HookPoint(name='hook_embed', 1 fwd)"
        assert repr(model.blocks[1].attn.hook_z) == "HookPoint(name='blocks.1.attn.hook_z', 1 bwd)"
        assert list(model.list_hooks(dir="fwd", including_permanent=False)) == []
        assert list(model.list_hooks(name_filter=lambda name: name.startswith("blocks.1"))) == ["blocks.1.attn.hook_z"]
        with pytest.raises(KeyError, match="blocks.0.hook_resid_pre"):
            model.list_hooks(name_filter="blocks.0.hook_resid_pr")
    finally:
        model.reset_hooks(including_permanent=True)
    assert model.list_hooks() == {} and repr(model.hook_embed) == "HookPoint(name='hook_embed')"


# --- 3. the remainder at layer 0 -----------------------------------------------------------------------------------
def test_layer_zero_remainder_is_the_final_residual_here_and_the_embeddings_in_the_core(model):
    _, cache = model.run_with_cache(TOKENS)
    core = CoreActivationCache(dict(cache.items()), model)
    final, embeddings = cache["resid_post", -1][None, :, -1], cache["resid_pre", 0][None, :, -1]
    for stack in (cache.stack_head_results, lambda **kw: cache.stack_neuron_results(**kw)):
        heads, labels = stack(layer=0, pos_slice=-1, incl_remainder=True, return_labels=True)
        assert labels == ["remainder"] and torch.equal(heads, final)
    for stack in (core.stack_head_results, lambda **kw: core.stack_neuron_results(**kw)):
        heads, labels = stack(layer=0, pos_slice=-1, incl_remainder=True, return_labels=True)
        assert labels == ["remainder"] and torch.equal(heads, embeddings)
    for layer in (1, 2):  # elsewhere the two agree
        torch.testing.assert_close(
            cache.stack_head_results(layer, incl_remainder=True), core.stack_head_results(layer, incl_remainder=True)
        )
    assert type(cache.to("cpu")) is type(cache) and type(cache.apply_slice_to_batch_dim(0)) is type(cache)


# --- 4. tensor-like operands ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [CoreFactoredMatrix, FactoredMatrix])
def test_factored_matrix_takes_what_torch_as_tensor_takes(cls):
    generator = np.random.default_rng(0)
    A, B, M = generator.normal(size=(4, 3)), generator.normal(size=(3, 5)), generator.normal(size=(5, 2))
    fm = cls(A, B.tolist())
    dense = torch.as_tensor(A) @ torch.as_tensor(B)
    assert type(fm) is cls and fm.dtype == torch.float64
    torch.testing.assert_close((fm @ M).AB, dense @ torch.as_tensor(M))
    torch.testing.assert_close((M.T[:, :4] @ fm).AB, torch.as_tensor(M.T[:, :4]) @ dense)
    torch.testing.assert_close(fm @ M[:, 0].tolist(), dense @ torch.as_tensor(M[:, 0]))
    torch.testing.assert_close((fm * np.array(2.0)).AB, 2 * dense)
    float32 = cls(torch.randn(4, 3), torch.randn(3, 5))
    assert (float32 @ M).dtype == torch.float32  # an operand takes the matrix's dtype
    with pytest.raises(TypeError):
        fm @ "a string"


# --- 5. unembed's hooks --------------------------------------------------------------------------------------------
def test_unembed_hooks_hold_the_final_normalized_residual_and_the_logits(model):
    logits, cache = model.run_with_cache(TOKENS)
    assert list(model.hook_dict)[-2:] == ["unembed.hook_in", "unembed.hook_out"]
    torch.testing.assert_close(cache["unembed.hook_in"], model.ln_final(cache["resid_post", -1]), rtol=0, atol=0)
    torch.testing.assert_close(cache["unembed.hook_in"] @ model.W_U + model.b_U, logits)
    assert torch.equal(cache["unembed.hook_out"], logits)
    edited = model.run_with_hooks(TOKENS, fwd_hooks=[("unembed.hook_out", lambda x, hook: x + 1)])
    torch.testing.assert_close(edited, logits + 1, rtol=0, atol=0)


# --- 6. full names in get_act_name ---------------------------------------------------------------------------------
def test_get_act_name_returns_a_full_name_unchanged(model):
    for name in list(model.hook_dict) + ["blocks.3.attn.hook_result", "hook_tokens"]:
        assert utils.get_act_name(name) == name
    assert utils.get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern" == utils.get_act_name("attn0")


# --- 7. a tokenizer that is not a Hugging Face one -----------------------------------------------------------------
class CharTokenizer:
    """One token per character of "abcdefgh ", id 0 the BOS/EOS/pad token: TransformerLens' tokenizer methods only."""

    def __init__(self):
        self.vocab = {"<s>": 0, **{char: i + 1 for i, char in enumerate("abcdefgh ")}}
        self.bos_token = self.eos_token = self.pad_token = "<s>"
        self.bos_token_id = self.eos_token_id = self.pad_token_id = 0
        self.padding_side = "right"

    def __call__(self, texts, add_special_tokens=False, **kwargs):
        return {"input_ids": self.encode(texts) if isinstance(texts, str) else [self.encode(t) for t in texts]}

    def encode(self, text, **kwargs):
        return [self.vocab[char] for char in text]

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        names = {i: char for char, i in self.vocab.items()}
        return "".join(names[int(i)] for i in ids if not (skip_special_tokens and int(i) == 0))

    def batch_decode(self, rows, **kwargs):
        return [self.decode(row, **kwargs) for row in rows]

    def get_vocab(self):
        return dict(self.vocab)


def test_any_object_with_the_tokenizer_methods_is_a_tokenizer():
    settings = dict(n_layers=1, d_model=16, d_head=4, n_ctx=16, d_vocab=-1, seed=0)
    model = HookedTransformer(HookedTransformerConfig(**settings), tokenizer=CharTokenizer())
    assert model.cfg.d_vocab == 10 and model.cfg.tokenizer_prepends_bos is False
    assert model.to_tokens(["abc", "h"]).tolist() == [[0, 1, 2, 3], [0, 8, 0, 0]]
    assert model.to_str_tokens("ab c") == ["<s>", "a", "b", " ", "c"]
    assert model.to_string(torch.tensor([1, 2, 9, 3])) == "ab c"
    assert model.to_single_token("c") == 3 and model.get_token_position("c", "abc") == 3
    torch.testing.assert_close(model("abc"), model(torch.tensor([[0, 1, 2, 3]])), rtol=0, atol=0)
    greedy = model.generate("ab", max_new_tokens=3, do_sample=False, verbose=False, stop_at_eos=False)
    expected = torch.tensor([[0, 1, 2]])
    for _ in range(3):
        expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], dim=1)
    assert greedy == CharTokenizer().decode(expected[0, 1:])
    with pytest.raises(TypeError, match=r"lacks \['batch_decode', 'get_vocab'\]"):
        model.set_tokenizer(type("Half", (), {"__call__": print, "encode": print, "decode": print})())
    with pytest.raises(TypeError, match="Hugging Face"):  # the core API keeps its Hugging Face tokenizers
        DemoTransformer(
            TransformerConfig(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=16, d_vocab=10, n_ctx=8),
            tokenizer=CharTokenizer(),
        )


# --- 9. key/value patching on grouped-query attention --------------------------------------------------------------
def one_by_one(model, corrupted, clean_cache, metric, name: str, n_heads: int, pos=None) -> torch.Tensor:
    """The metric with one key/value head (at one position, or all) of ``name`` patched in, by a hook."""
    results = torch.zeros(model.cfg.n_layers, *(() if pos is None else (corrupted.shape[1],)), n_heads)
    for layer in range(model.cfg.n_layers):
        hook_name = f"blocks.{layer}.attn.hook_{name}"
        for where in [slice(None)] if pos is None else range(corrupted.shape[1]):
            for head in range(n_heads):

                def patch(x, hook, where=where, head=head, hook_name=hook_name):
                    x = x.clone()
                    x[:, where, head] = clean_cache[hook_name][:, where, head]
                    return x

                value = metric(model.run_with_hooks(corrupted, fwd_hooks=[(hook_name, patch)]))
                results[(layer, head) if pos is None else (layer, where, head)] = value
    return results


def test_key_value_sweeps_run_over_key_value_heads_and_never_pad_with_numbers():
    model = tiny(n_heads=4, n_key_value_heads=2, positional_embedding_type="rotary")
    clean, corrupted = TOKENS[:1], TOKENS[1:]
    _, clean_cache = model.run_with_cache(clean)
    metric = lambda logits: logits[0, -1, 3] - logits[0, -1, 5]
    for name in ("k", "v"):
        all_pos = getattr(patching, f"get_act_patch_attn_head_{name}_all_pos")
        found, index = all_pos(model, corrupted, clean_cache, metric, return_index_df=True)
        assert list(index.columns) == ["layer", "key_value_head"] and found.shape == (2, 2)
        torch.testing.assert_close(found, one_by_one(model, corrupted, clean_cache, metric, name, 2))
        by_pos = getattr(patching, f"get_act_patch_attn_head_{name}_by_pos")(model, corrupted, clean_cache, metric)
        torch.testing.assert_close(by_pos, one_by_one(model, corrupted, clean_cache, metric, name, 2, pos=True))
    every = patching.get_act_patch_attn_head_all_pos_every(model, corrupted, clean_cache, metric)
    assert every.shape == (5, 2, 4)
    assert every[[0, 1, 4]].isfinite().all() and every[2:4, :, :2].isfinite().all() and every[2:4, :, 2:].isnan().all()
    torch.testing.assert_close(every[2, :, :2], one_by_one(model, corrupted, clean_cache, metric, "k", 2))
    with pytest.raises(AssertionError, match="key_value_head"):
        patching.generic_activation_patch(
            model, corrupted, clean_cache, metric, patching.layer_head_vector_patch_setter, "k", ["layer", "head"]
        )


def test_without_grouping_the_key_value_axis_is_transformer_lens_head(model):
    _, clean_cache = model.run_with_cache(TOKENS[:1])
    metric = lambda logits: logits[0, -1, 3]
    found, index = patching.get_act_patch_attn_head_k_all_pos(model, TOKENS[1:], clean_cache, metric, True)
    assert list(index.columns) == ["layer", "head"] and found.shape == (2, model.cfg.n_heads)
    assert patching.get_act_patch_attn_head_all_pos_every(model, TOKENS[1:], clean_cache, metric).isfinite().all()


# --- 10. TransformerLens' module paths ------------------------------------------------------------------------------
def test_transformer_lens_module_paths_import_and_keep_the_package_attributes():
    modules = {
        name: importlib.import_module(f"interp_transformer.{name}")
        for name in interp_transformer.TRANSFORMERLENS_MODULES
    }
    assert modules["hook_points"] is importlib.import_module("interp_transformer.hooks")
    assert modules["hook_points"].HookPoint is interp_transformer.HookPoint
    assert modules["FactoredMatrix"].FactoredMatrix is interp_transformer.FactoredMatrix is FactoredMatrix
    assert modules["HookedTransformer"].HookedTransformer is interp_transformer.HookedTransformer
    assert modules["HookedTransformerConfig"].HookedTransformerConfig is interp_transformer.HookedTransformerConfig
    assert modules["HookedRootModule"].HookedRootModule is interp_transformer.HookedRootModule
    assert issubclass(modules["ActivationCache"].ActivationCache, interp_transformer.ActivationCache)
    assert modules["loading_from_pretrained"].get_pretrained_model_config("gpt2").d_model == 768
    assert modules["utils"] is utils and modules["patching"] is patching and modules["head_detector"] is head_detector
    for name, target in interp_transformer.TRANSFORMERLENS_MODULES.items():  # the package keeps its classes
        assert modules[name] is importlib.import_module(f"interp_transformer.{target}")
        assert isinstance(getattr(interp_transformer, name), type) or getattr(interp_transformer, name) is modules[name]

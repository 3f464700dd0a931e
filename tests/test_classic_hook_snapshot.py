"""Snapshot of the classic decoders' public contract: the ordered hook names and shapes of 2-layer models.

One model per new block kind: GPT-NeoX's parallel block (two norms, no ``hook_resid_mid``),
GPT-J's parallel block with one shared norm (no ``ln2``), OPT-350m's post-norm block (no final
norm, ``hook_normalized_resid_post``) and BLOOM's normalized embedding and ALiBi bias. The
snapshot lives in ``tests/data/hook_snapshot_classic_2layer.json``; a change to it is a change
of interface, never rewritten silently. After an intended change, regenerate it explicitly and
review the diff:

    INTERP_TRANSFORMER_UPDATE_SNAPSHOT=1 python -m pytest tests/test_classic_hook_snapshot.py

Besides the snapshot, the order and shapes are checked against the tables written out here
and against a real run.
"""

import dataclasses
import json
import os
import pathlib

import pytest
import torch

from interp_transformer import DemoTransformer
from interp_transformer.families.bloom.recipe import BloomConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.gptj.recipe import GPTJConfig
from interp_transformer.families.opt.recipe import OPTPostNormConfig

from .test_hook_snapshot import to_json

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "hook_snapshot_classic_2layer.json"
UPDATE = os.environ.get("INTERP_TRANSFORMER_UPDATE_SNAPSHOT") == "1"
BATCH, POS = 2, 5
SHAPE = dict(d_model=12, n_layers=2, n_heads=3, d_head=4, d_mlp=20, d_vocab=17, n_ctx=8)
CONFIGS = {
    "gpt_neox": GPTNeoXConfig(**SHAPE, rotary_dim=2),
    "gptj": GPTJConfig(**SHAPE, rotary_dim=2),
    "opt_post_norm": OPTPostNormConfig(**SHAPE),
    "bloom": BloomConfig(**SHAPE),
}


def current_snapshot() -> dict:
    snapshot = {"batch": BATCH, "pos": POS}
    for label, cfg in CONFIGS.items():
        shapes = DemoTransformer(cfg, seed=0).hook_shapes(BATCH, POS)
        config = {key: value for key, value in dataclasses.asdict(cfg).items() if key in SHAPE or key == "rotary_dim"}
        snapshot[label] = {"config": config, "hooks": [[name, list(shape)] for name, shape in shapes.items()]}
    return snapshot


def test_hook_names_and_shapes_match_the_snapshot():
    current = current_snapshot()
    if UPDATE:
        SNAPSHOT.write_text(to_json(current), encoding="utf-8")
        pytest.skip(f"snapshot rewritten: {SNAPSHOT}; review the diff before committing")
    assert current == json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def contract_table(label: str, cfg, batch: int, pos: int) -> list[tuple[str, tuple]]:
    """The hooks of each block kind in forward order, written out from the block formulas."""
    bpd, scale = (batch, pos, cfg.d_model), (batch, pos, 1)
    heads, square, neurons = (
        (batch, pos, cfg.n_heads, cfg.d_head),
        (batch, cfg.n_heads, pos, pos),
        (batch, pos, cfg.d_mlp),
    )
    norm = lambda p, name: [(p + f"{name}.hook_scale", scale), (p + f"{name}.hook_normalized", bpd)]  # noqa: E731
    # noqa: E731
    mlp = lambda p: [(p + "mlp.hook_pre", neurons), (p + "mlp.hook_post", neurons), (p + "hook_mlp_out", bpd)]

    def attention(p: str) -> list:
        rows = [(p + "attn.hook_q", heads), (p + "attn.hook_k", heads), (p + "attn.hook_v", heads)]
        if label in ("gpt_neox", "gptj"):
            rows += [(p + "attn.hook_rot_q", heads), (p + "attn.hook_rot_k", heads)]
        if label == "bloom":
            rows += [(p + "attn.score_bias.hook_bias", square)]
        return rows + [
            (p + "attn.hook_attn_scores", square),
            (p + "attn.hook_pattern", square),
            (p + "attn.hook_z", heads),
            (p + "hook_attn_out", bpd),
        ]

    rows = norm("", "embed.ln") + [("hook_embed", bpd)] if label == "bloom" else [("hook_embed", bpd)]
    if label == "opt_post_norm":
        rows += [("hook_pos_embed", bpd)]
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        rows += [(p + "hook_resid_pre", bpd)]
        if label == "opt_post_norm":  # ln1(x + attn(x)), ln2(. + mlp(.))
            rows += (
                attention(p) + [(p + "hook_resid_mid", bpd)] + norm(p, "ln1") + mlp(p) + [(p + "hook_resid_post", bpd)]
            )
            rows += norm(p, "ln2") + [(p + "hook_normalized_resid_post", bpd)]
        elif label == "gpt_neox":  # x + attn(ln1(x)) + mlp(ln2(x))
            rows += norm(p, "ln1") + attention(p) + norm(p, "ln2") + mlp(p) + [(p + "hook_resid_post", bpd)]
        elif label == "gptj":  # x + attn(ln1(x)) + mlp(ln1(x))
            rows += norm(p, "ln1") + attention(p) + mlp(p) + [(p + "hook_resid_post", bpd)]
        else:  # pre-norm
            rows += norm(p, "ln1") + attention(p) + [(p + "hook_resid_mid", bpd)] + norm(p, "ln2") + mlp(p)
            rows += [(p + "hook_resid_post", bpd)]
    return rows + ([] if label == "opt_post_norm" else norm("", "ln_final"))


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_snapshot_is_the_contract_table(label):
    saved = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    rows = [(name, tuple(shape)) for name, shape in saved[label]["hooks"]]
    assert rows == contract_table(label, CONFIGS[label], saved["batch"], saved["pos"])


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_meta_shapes_equal_a_real_run_in_forward_order(label):
    cfg = CONFIGS[label]
    model = DemoTransformer(cfg, seed=0)
    tokens = torch.randint(0, cfg.d_vocab, (3, 7), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    assert model.hook_shapes(3, 7) == {name: tuple(t.shape) for name, t in cache.items()}
    assert list(model.hook_shapes(3, 7)) == list(model.hook_dict)
    assert model.estimate_cache_bytes(3, 7) == cache.nbytes()  # BLOOM's bias is a broadcast view: copied, and counted


def test_short_names():
    neox, gptj, opt, bloom = (
        DemoTransformer(CONFIGS[label], seed=0) for label in ("gpt_neox", "gptj", "opt_post_norm", "bloom")
    )
    assert (
        neox.act_name("rot_q", 1) == "blocks.1.attn.hook_rot_q"
        and gptj.act_name("scale", 0, "ln1") == "blocks.0.ln1.hook_scale"
    )
    assert bloom.act_name("alibi", -1) == "blocks.1.attn.score_bias.hook_bias"
    assert opt.act_name("normalized_resid_post", -1) == "blocks.1.hook_normalized_resid_post"
    for model, architecture in ((neox, "GPT-NeoX"), (gptj, "GPT-J"), (bloom, "BLOOM")):
        with pytest.raises(KeyError, match=f"a {architecture} model has no positional embedding"):
            model.act_name("pos_embed")
    with pytest.raises(KeyError, match="a post-norm OPT has no final norm"):
        opt.act_name("scale")

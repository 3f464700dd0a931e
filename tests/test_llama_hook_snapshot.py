"""Snapshot of the Llama family's public contract: the ordered hook names and shapes of 2-layer models.

The snapshot lives in ``tests/data/hook_snapshot_llama_2layer.json``; a change to it is a
change of interface, never rewritten silently. After an intended change, regenerate it
explicitly and review the diff:

    INTERP_TRANSFORMER_UPDATE_SNAPSHOT=1 python -m pytest tests/test_llama_hook_snapshot.py

Besides the snapshot, the shapes are checked against the table written out here (DESIGN
section 3 with RMSNorm, rotary, grouped-query and gated-MLP hooks) and a real run.
"""

import dataclasses
import json
import os
import pathlib

import pytest
import torch

from interp_transformer import DemoTransformer
from interp_transformer.families.llama.recipe import LlamaConfig

from .test_hook_snapshot import to_json

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "hook_snapshot_llama_2layer.json"
UPDATE = os.environ.get("INTERP_TRANSFORMER_UPDATE_SNAPSHOT") == "1"
BATCH, POS = 2, 5
CONFIGS = {  # d_model != n_heads * d_head in both
    "llama": LlamaConfig(
        d_model=12, n_layers=2, n_heads=4, n_key_value_heads=2, d_head=4, d_mlp=20, d_vocab=17, n_ctx=8
    ),
    "qwen3": LlamaConfig(
        d_model=12, n_layers=2, n_heads=3, n_key_value_heads=1, d_head=6, d_mlp=20, d_vocab=17, n_ctx=8, qk_norm=True
    ),
}


def current_snapshot() -> dict:
    snapshot = {"batch": BATCH, "pos": POS}
    for label, cfg in CONFIGS.items():
        shapes = DemoTransformer(cfg, seed=0).hook_shapes(BATCH, POS)
        config = {
            k: v
            for k, v in dataclasses.asdict(cfg).items()
            if k
            in ("d_model", "n_layers", "n_heads", "n_key_value_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "qk_norm")
        }
        snapshot[label] = {"config": config, "hooks": [[name, list(shape)] for name, shape in shapes.items()]}
    return snapshot


def test_hook_names_and_shapes_match_the_snapshot():
    current = current_snapshot()
    if UPDATE:
        SNAPSHOT.write_text(to_json(current), encoding="utf-8")
        pytest.skip(f"snapshot rewritten: {SNAPSHOT}; review the diff before committing")
    assert current == json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def contract_table(cfg: LlamaConfig, batch: int, pos: int) -> list[tuple[str, tuple]]:
    """The hooks of a Llama-family decoder in forward order: no hook_pos_embed; k and v have n_key_value_heads."""
    bpd, scale = (batch, pos, cfg.d_model), (batch, pos, 1)
    queries, keys = (batch, pos, cfg.n_heads, cfg.d_head), (batch, pos, cfg.n_key_value_heads, cfg.d_head)
    square, neurons = (batch, cfg.n_heads, pos, pos), (batch, pos, cfg.d_mlp)
    rows = [("hook_embed", bpd)]
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        rows += [(p + "hook_resid_pre", bpd), (p + "ln1.hook_scale", scale), (p + "ln1.hook_normalized", bpd)]
        rows += [(p + "attn.hook_q", queries), (p + "attn.hook_k", keys), (p + "attn.hook_v", keys)]
        if cfg.qk_norm:
            for norm, shape in (("q_norm", queries), ("k_norm", keys)):
                rows += [
                    (p + f"attn.{norm}.hook_scale", shape[:-1] + (1,)),
                    (p + f"attn.{norm}.hook_normalized", shape),
                ]
        rows += [(p + "attn.hook_rot_q", queries), (p + "attn.hook_rot_k", keys)]
        rows += [(p + "attn.hook_attn_scores", square), (p + "attn.hook_pattern", square), (p + "attn.hook_z", queries)]
        rows += [
            (p + "hook_attn_out", bpd),
            (p + "hook_resid_mid", bpd),
            (p + "ln2.hook_scale", scale),
            (p + "ln2.hook_normalized", bpd),
        ]
        rows += [(p + "mlp.hook_pre", neurons), (p + "mlp.hook_pre_linear", neurons), (p + "mlp.hook_post", neurons)]
        rows += [(p + "hook_mlp_out", bpd), (p + "hook_resid_post", bpd)]
    return rows + [("ln_final.hook_scale", scale), ("ln_final.hook_normalized", bpd)]


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_snapshot_is_the_contract_table(label):
    saved = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    rows = [(name, tuple(shape)) for name, shape in saved[label]["hooks"]]
    assert rows == contract_table(CONFIGS[label], saved["batch"], saved["pos"])


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_meta_shapes_equal_a_real_run_in_forward_order(label):
    cfg = CONFIGS[label]
    model = DemoTransformer(cfg, seed=0)
    tokens = torch.randint(0, cfg.d_vocab, (3, 7), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    assert model.hook_shapes(3, 7) == {name: tuple(t.shape) for name, t in cache.items()}
    assert list(model.hook_shapes(3, 7)) == list(model.hook_dict)


def test_short_names():
    model = DemoTransformer(CONFIGS["llama"], seed=0)
    assert model.act_name("rot_q", 1) == "blocks.1.attn.hook_rot_q"
    assert model.act_name("pre_linear", -1) == "blocks.1.mlp.hook_pre_linear"
    assert (
        model.act_name("scale", 0, "ln2") == "blocks.0.ln2.hook_scale"
        and model.act_name("normalized") == "ln_final.hook_normalized"
    )
    with pytest.raises(KeyError, match="no positional embedding: its positions rotate q and k"):
        model.act_name("pos_embed")
    with pytest.raises(AttributeError, match="W_pos: this model has no learned positional embedding"):
        model.W_pos

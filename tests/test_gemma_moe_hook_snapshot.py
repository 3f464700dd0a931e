"""Snapshot of the public contract of the Gemma and mixture-of-experts block kinds: ordered hook names and shapes.

The snapshot lives in ``tests/data/hook_snapshot_gemma_moe_2layer.json``; a change to it is a
change of interface, never rewritten silently. After an intended change, regenerate it
explicitly and review the diff:

    INTERP_TRANSFORMER_UPDATE_SNAPSHOT=1 python -m pytest tests/test_gemma_moe_hook_snapshot.py

Besides the snapshot, the shapes are checked against the table written out here (the Llama
family's table with Gemma's post norms, soft-capped scores and read-out, and the router's and
every expert's hooks) and against a real run.
"""

import dataclasses
import json
import os
import pathlib

import pytest
import torch

from interp_transformer import DemoTransformer
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.moe.recipe import MoEConfig

from .test_hook_snapshot import to_json

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "hook_snapshot_gemma_moe_2layer.json"
UPDATE = os.environ.get("INTERP_TRANSFORMER_UPDATE_SNAPSHOT") == "1"
BATCH, POS = 2, 5
SMALL = dict(d_model=12, n_layers=2, n_heads=4, n_key_value_heads=2, d_head=4, d_vocab=17, n_ctx=8)  # d_model != 4 * 4
CONFIGS = {
    "gemma1": GemmaConfig(
        **SMALL,
        d_mlp=20,
        query_pre_attn_scalar=None,
        post_norms=False,
        attn_softcap=None,
        final_softcap=None,
        sliding_window=None,
    ),
    "gemma2": GemmaConfig(**SMALL, d_mlp=20, sliding_window=3),
    "gemma3": GemmaConfig(
        **SMALL,
        d_mlp=20,
        sliding_window=3,
        qk_norm=True,
        attn_softcap=None,
        final_softcap=None,
        rotary_base_local=100.0,
    ),
    "mixtral": MoEConfig(**SMALL, d_mlp=6, n_experts=3, experts_per_token=2),
    "qwen2_moe": MoEConfig(
        **SMALL,
        d_mlp=6,
        n_experts=3,
        experts_per_token=2,
        d_mlp_shared=8,
        dense_layers=(1,),
        d_mlp_dense=10,
        normalize_routing=False,
    ),
}
FIELDS = (
    "d_model",
    "n_layers",
    "n_heads",
    "n_key_value_heads",
    "d_head",
    "d_mlp",
    "d_vocab",
    "n_ctx",
    "post_norms",
    "qk_norm",
    "attn_softcap",
    "final_softcap",
    "n_experts",
    "experts_per_token",
    "d_mlp_shared",
    "dense_layers",
    "d_mlp_dense",
)


def current_snapshot() -> dict:
    snapshot = {"batch": BATCH, "pos": POS}
    for label, cfg in CONFIGS.items():
        shapes = DemoTransformer(cfg, seed=0).hook_shapes(BATCH, POS)
        config = {k: v for k, v in dataclasses.asdict(cfg).items() if k in FIELDS}
        snapshot[label] = {"config": config, "hooks": [[name, list(shape)] for name, shape in shapes.items()]}
    return snapshot


def test_hook_names_and_shapes_match_the_snapshot():
    current = current_snapshot()
    if UPDATE:
        SNAPSHOT.write_text(to_json(current), encoding="utf-8")
        pytest.skip(f"snapshot rewritten: {SNAPSHOT}; review the diff before committing")
    assert json.loads(to_json(current)) == json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def _norm(prefix: str, shape: tuple) -> list:
    return [(prefix + "hook_scale", shape[:-1] + (1,)), (prefix + "hook_normalized", shape)]


def _attention(cfg, p: str, batch: int, pos: int) -> list:
    queries, keys = (batch, pos, cfg.n_heads, cfg.d_head), (batch, pos, cfg.n_key_value_heads, cfg.d_head)
    square = (batch, cfg.n_heads, pos, pos)
    rows = [(p + "attn.hook_q", queries), (p + "attn.hook_k", keys), (p + "attn.hook_v", keys)]
    if cfg.qk_norm:
        rows += _norm(p + "attn.q_norm.", queries) + _norm(p + "attn.k_norm.", keys)
    rows += [(p + "attn.hook_rot_q", queries), (p + "attn.hook_rot_k", keys)]
    if getattr(cfg, "attn_softcap", None) is not None:
        rows += [(p + "attn.hook_attn_scores_uncapped", square)]
    return rows + [
        (p + "attn.hook_attn_scores", square),
        (p + "attn.hook_pattern", square),
        (p + "attn.hook_z", queries),
    ]


def _gated(prefix: str, batch: int, pos: int, width: int) -> list:
    return [(prefix + name, (batch, pos, width)) for name in ("hook_pre", "hook_pre_linear", "hook_post")]


def _mlp(cfg, layer: int, p: str, batch: int, pos: int) -> list:
    if isinstance(cfg, GemmaConfig):
        return _gated(p + "mlp.", batch, pos, cfg.d_mlp)
    if layer in cfg.dense_layers:
        return _gated(p + "mlp.", batch, pos, cfg.d_mlp_dense)
    experts, chosen = (batch, pos, cfg.n_experts), (batch, pos, cfg.experts_per_token)
    rows = [
        (p + "mlp.hook_router_logits", experts),
        (p + "mlp.hook_expert_weights", experts),
        (p + "mlp.hook_expert_indices", chosen),
        (p + "mlp.hook_routing_weights", chosen),
    ]
    for expert in range(cfg.n_experts):
        rows += _gated(p + f"mlp.experts.{expert}.", batch, pos, cfg.d_mlp)
    if cfg.d_mlp_shared is not None:
        rows += _gated(p + "mlp.shared_expert.", batch, pos, cfg.d_mlp_shared) + [
            (p + "mlp.hook_shared_expert_gate", (batch, pos, 1))
        ]
    return rows


def contract_table(cfg, batch: int, pos: int) -> list[tuple[str, tuple]]:
    """The hooks in forward order: Llama's, with Gemma 2/3's ``ln1_post``/``ln2_post`` and soft-caps, or a mixture's
    hooks."""
    bpd = (batch, pos, cfg.d_model)
    post_norms = getattr(cfg, "post_norms", False)
    rows = [("hook_embed", bpd)]
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        rows += [(p + "hook_resid_pre", bpd)] + _norm(p + "ln1.", bpd) + _attention(cfg, p, batch, pos)
        rows += (_norm(p + "ln1_post.", bpd) if post_norms else []) + [
            (p + "hook_attn_out", bpd),
            (p + "hook_resid_mid", bpd),
        ]
        rows += _norm(p + "ln2.", bpd) + _mlp(cfg, layer, p, batch, pos)
        rows += (_norm(p + "ln2_post.", bpd) if post_norms else []) + [
            (p + "hook_mlp_out", bpd),
            (p + "hook_resid_post", bpd),
        ]
    rows += _norm("ln_final.", bpd)
    if getattr(cfg, "final_softcap", None) is not None:
        rows += [("unembed.hook_logits_uncapped", (batch, pos, cfg.d_vocab))]
    return rows


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
    gemma, moe = DemoTransformer(CONFIGS["gemma2"], seed=0), DemoTransformer(CONFIGS["qwen2_moe"], seed=0)
    assert gemma.act_name("scale", 1, "ln1_post") == "blocks.1.ln1_post.hook_scale"
    assert gemma.act_name("attn_scores_uncapped", 0) == "blocks.0.attn.hook_attn_scores_uncapped"
    assert gemma.act_name("logits_uncapped") == "unembed.hook_logits_uncapped"
    assert moe.act_name("router_logits", -2) == "blocks.0.mlp.hook_router_logits"
    assert moe.act_name("shared_expert_gate", 0) == "blocks.0.mlp.hook_shared_expert_gate"
    with pytest.raises(KeyError, match="a Gemma model has no positional embedding"):
        gemma.act_name("pos_embed")

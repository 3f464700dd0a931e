"""Snapshot of the public contract: the ordered hook names and their shapes for 2-layer models.

The snapshot lives in ``tests/data/hook_snapshot_2layer.json``. A change to it is a change
to the interface every user, SAE release and tutorial relies on, so it is never rewritten
silently. After an intended change, regenerate it explicitly and review the diff:

    INTERP_TRANSFORMER_UPDATE_SNAPSHOT=1 python -m pytest tests/test_hook_snapshot.py

Besides the snapshot, the shapes are checked against the DESIGN section 3 table written
out here, and against a real (non-meta) run.
"""

import json
import os
import pathlib

import pytest

from interp_transformer import DemoTransformer, TransformerConfig

from .test_components import random_tokens, single_thread  # noqa: F401

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "hook_snapshot_2layer.json"
UPDATE = os.environ.get("INTERP_TRANSFORMER_UPDATE_SNAPSHOT") == "1"
BATCH, POS = 2, 5
CONFIGS = {
    "full": TransformerConfig(d_model=12, n_layers=2, n_heads=3, d_head=4, d_mlp=20, d_vocab=17, n_ctx=8),
    "attn_only": TransformerConfig(d_model=12, n_layers=2, n_heads=3, d_head=4, d_mlp=None, d_vocab=17, n_ctx=8),
}


def current_snapshot() -> dict:
    snapshot = {"batch": BATCH, "pos": POS}
    for label, cfg in CONFIGS.items():
        shapes = DemoTransformer(cfg, seed=0).hook_shapes(BATCH, POS)
        snapshot[label] = {
            "config": {
                k: getattr(cfg, k) for k in ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")
            },
            "hooks": [[name, list(shape)] for name, shape in shapes.items()],
        }
    return snapshot


def to_json(snapshot: dict) -> str:
    """JSON with one hook per line, so a diff of the snapshot reads like a diff of the contract."""
    lines = ["{", f' "batch": {snapshot["batch"]},', f' "pos": {snapshot["pos"]},']
    labels = [key for key in snapshot if key not in ("batch", "pos")]
    for i, label in enumerate(labels):
        entry = snapshot[label]
        hooks = ",\n".join(f"   {json.dumps(row)}" for row in entry["hooks"])
        end = "," if i < len(labels) - 1 else ""
        lines += [
            f' "{label}": {{',
            f'  "config": {json.dumps(entry["config"])},',
            '  "hooks": [',
            hooks,
            "  ]",
            f" }}{end}",
        ]
    return "\n".join(lines + ["}"]) + "\n"


def test_hook_names_and_shapes_match_the_snapshot():
    current = current_snapshot()
    if UPDATE:
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(to_json(current), encoding="utf-8")
        pytest.skip(f"snapshot rewritten: {SNAPSHOT}; review the diff before committing")
    saved = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert current == saved


def design_table(cfg: TransformerConfig, batch: int, pos: int) -> list[tuple[str, tuple]]:
    """The DESIGN section 3 table, in forward order, for one config."""
    bpd = (batch, pos, cfg.d_model)
    heads = (batch, pos, cfg.n_heads, cfg.d_head)
    square = (batch, cfg.n_heads, pos, pos)
    rows = [("hook_embed", bpd), ("hook_pos_embed", bpd)]
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        rows += [(p + "hook_resid_pre", bpd), (p + "ln1.hook_scale", (batch, pos, 1)), (p + "ln1.hook_normalized", bpd)]
        rows += [(p + f"attn.hook_{n}", heads) for n in ("q", "k", "v")]
        rows += [(p + "attn.hook_attn_scores", square), (p + "attn.hook_pattern", square), (p + "attn.hook_z", heads)]
        rows += [(p + "hook_attn_out", bpd)]
        if cfg.d_mlp is not None:
            rows += [
                (p + "hook_resid_mid", bpd),
                (p + "ln2.hook_scale", (batch, pos, 1)),
                (p + "ln2.hook_normalized", bpd),
            ]
            rows += [(p + "mlp.hook_pre", (batch, pos, cfg.d_mlp)), (p + "mlp.hook_post", (batch, pos, cfg.d_mlp))]
            rows += [(p + "hook_mlp_out", bpd)]
        rows += [(p + "hook_resid_post", bpd)]
    rows += [("ln_final.hook_scale", (batch, pos, 1)), ("ln_final.hook_normalized", bpd)]
    return rows


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_snapshot_is_the_design_table(label):
    saved = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    cfg = CONFIGS[label]
    assert [(name, tuple(shape)) for name, shape in saved[label]["hooks"]] == design_table(
        cfg, saved["batch"], saved["pos"]
    )


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_meta_shapes_equal_a_real_run(label):
    cfg = CONFIGS[label]
    model = DemoTransformer(cfg, seed=0)
    _, cache = model.run_with_cache(random_tokens(cfg, 3, 7))
    assert model.hook_shapes(3, 7) == {name: tuple(t.shape) for name, t in cache.items()}
    assert list(model.hook_shapes(3, 7)) == list(model.hook_dict)  # hook_dict is in forward order

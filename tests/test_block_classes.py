"""Three block classes, and the contract every family's blocks keep: hook names, firing order, shapes, weights.

A block is a class that lists its residual-stream steps (a ``StreamBlock``, directly or through
another block class). There are three: ``PreNormBlock`` (optional MLP, post norms, output norms,
cross-attention, writers beside the MLP and TransformerLens' input hooks), ``PostNormBlock``
(optional cross-attention) and ``ParallelBlock`` (optional shared norm). The finder reads the AST
and is tried on a known-bad snippet.

``tests/data/block_contract.json`` holds, for a tiny seeded model of every registered family, the
variants their recipes build (attention-only, post norms, output norms, parallel, shared norm,
cross-attention, adapter, TransformerLens' flags and toggles) and a seeded draw of builder specs:
the hooks a forward fires, in order, with shapes; the ``state_dict`` keys; the module paths; and
the output's sum. It was recorded from the eleven classes the three replace (810fec1); a change to
it is a change of interface, never rewritten silently. After an intended change, regenerate it
explicitly and review the diff:

    INTERP_TRANSFORMER_UPDATE_SNAPSHOT=1 python -m pytest tests/test_block_classes.py
"""

import ast
import json
import math
import os
import pathlib
import re

import pytest
import torch

import interp_transformer
from interp_transformer import DemoTransformer, EncoderTransformer, HookedTransformer, HookedTransformerConfig
from interp_transformer.builder import build_decoder, build_encoder_decoder
from interp_transformer.families.registry import registered
from interp_transformer.hooks import HookPoint
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer

from .spec_generator import draw_specs

PACKAGE = pathlib.Path(interp_transformer.__file__).parent
SNAPSHOT = pathlib.Path(__file__).parent / "data" / "block_contract.json"
UPDATE = os.environ.get("INTERP_TRANSFORMER_UPDATE_SNAPSHOT") == "1"
BASE = "StreamBlock"


# --- (a) the count of block classes ------------------------------------------------------------------------------
def block_classes(sources: dict[str, str]) -> list[str]:
    """Every class that is a block: a subclass of ``StreamBlock``, directly or through another block class, or a
    class whose name ends in ``Block`` (the base itself not counted). ``sources`` maps a file name to its text."""
    bases, names = {}, set()
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
                bases[node.name] = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
    blocks = {BASE}
    grew = True
    while grew:
        new = {name for name, parents in bases.items() if parents & blocks} - blocks
        blocks |= new
        grew = bool(new)
    return sorted((blocks | {name for name in names if name.endswith("Block")}) - {BASE})


def package_sources() -> dict[str, str]:
    return {str(path): path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def test_the_block_finder_sees_every_kind_of_block_in_a_known_bad_snippet():
    bad = """
class StreamBlock(nn.Module): ...
class TransformerBlock(StreamBlock): ...
class GatedBlock(parts.TransformerBlock): ...
class Sandwich(GatedBlock): ...
class LonelyBlock(nn.Module): ...
class Attention(nn.Module): ...
"""
    assert block_classes({"bad.py": bad}) == ["GatedBlock", "LonelyBlock", "Sandwich", "TransformerBlock"]


def test_there_are_three_block_classes():
    assert block_classes(package_sources()) == ["ParallelBlock", "PostNormBlock", "PreNormBlock"]


# --- (b) the contract every family keeps ---------------------------------------------------------------------------
SHAPE = dict(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=24, d_vocab=37, n_ctx=16)
SEQ2SEQ = dict(SHAPE, n_decoder_layers=2)
KV = dict(n_key_value_heads=1)
TL = dict(d_model=16, d_head=8, n_layers=2, n_ctx=16, n_heads=2, d_vocab=37, d_mlp=24, act_fn="gelu", seed=0)


def config(architecture: str) -> type:
    """The config class of a registered architecture (looked up by name: wherever its family module lives)."""
    return next(entry.config_class for entry in registered() if entry.name == architecture)


def family_models() -> dict:
    """A tiny seeded model (or how to build one) of every family and every block variant their recipes build."""
    decoders = {
        "gpt2": config("gpt2")(**SHAPE),
        "gpt2-attn-only": config("gpt2")(**{**SHAPE, "d_mlp": None}),
        "llama": config("llama")(**SHAPE, **KV),
        "gemma": config("gemma")(**SHAPE, **KV, post_norms=False, attn_softcap=None, final_softcap=None),
        "gemma2": config("gemma")(**SHAPE, **KV, sliding_window=4, query_pre_attn_scalar=8.0),
        "gemma3": config("gemma")(**SHAPE, **KV, sliding_window=4, qk_norm=True, attn_softcap=None, final_softcap=None),
        "moe": config("moe")(**SHAPE, **KV, n_experts=3, experts_per_token=2),
        "gpt_oss": config("gpt_oss")(**SHAPE, **KV, n_experts=3, experts_per_token=2, sliding_window=4),
        "gpt_neox-parallel": config("gpt_neox")(**SHAPE, rotary_dim=4),
        "gpt_neox-sequential": config("gpt_neox")(**SHAPE, rotary_dim=4, parallel_residual=False),
        "gptj": config("gptj")(**SHAPE, rotary_dim=4),
        "opt": config("opt")(**SHAPE),
        "opt-post-norm": config("opt-post-norm")(**SHAPE),
        "bloom": config("bloom")(**SHAPE),
        "olmo2": config("olmo2")(**SHAPE, n_key_value_heads=2),
        "phi3": config("phi3")(**SHAPE, n_key_value_heads=2),
        "smollm3": config("smollm3")(**SHAPE, **KV),
        "adapter": config("adapter_decoder")(**SHAPE, d_adapter=4),
    }
    models = {label: (lambda cfg=cfg: DemoTransformer(cfg, seed=0)) for label, cfg in decoders.items()}
    models["bert"] = lambda: EncoderTransformer(config("bert")(**SHAPE), seed=0)
    encoder_decoders = {
        "bart": config("bart")(**SEQ2SEQ),
        "marian": config("marian")(**SEQ2SEQ, pad_token_id=36, decoder_start_token_id=36),
        "seq2seq-pre-ln": config("seq2seq-pre-ln")(**SEQ2SEQ),
        "t5": config("t5")(**SEQ2SEQ),
    }
    for label, cfg in encoder_decoders.items():
        models[label] = lambda cfg=cfg: EncoderDecoderTransformer(cfg, seed=0)
    builder = dict(d_model=16, n_layers=2, n_heads=2, d_mlp=24, d_vocab=37, n_ctx=16)
    for label, extra in {
        "pre": {},
        "post": dict(placement="post"),
        "output": dict(placement="output", norm="rms"),
        "parallel": dict(parallel_residual=True),
        "post_norms": dict(post_norms=True),
        "attn-only": dict(d_mlp=None),
    }.items():
        models[f"builder-{label}"] = lambda extra=extra: build_decoder(**{**builder, **extra}, seed=0)
    for placement in ("pre", "post"):
        models[f"builder-encdec-{placement}"] = lambda placement=placement: build_encoder_decoder(
            **builder, placement=placement, seed=0
        )
    for label, extra in {
        "plain": {},
        "attn-only": dict(attn_only=True),
        "attn-in": dict(use_attn_in=True),
        "split-qkv": dict(use_split_qkv_input=True, n_key_value_heads=1),
        "mlp-in": dict(use_hook_mlp_in=True),
        "shortformer": dict(positional_embedding_type="shortformer"),
        "pre-post-norm": dict(use_normalization_before_and_after=True, normalization_type="RMS"),
        "pre-post-norm-hooks": dict(
            use_normalization_before_and_after=True, normalization_type="RMS", use_attn_in=True
        ),
        "parallel": dict(parallel_attn_mlp=True),
        "attn-result": dict(use_attn_result=True),
        "attn-only-attn-in": dict(attn_only=True, use_attn_in=True, use_split_qkv_input=True),
    }.items():
        models[f"tl-{label}"] = lambda extra=extra: HookedTransformer(HookedTransformerConfig(**TL, **extra))
    models["tl-toggled-on"] = lambda: _toggled(on=True)
    models["tl-toggled-off"] = lambda: _toggled(on=False)
    return models


def _toggled(on: bool):
    model = HookedTransformer(HookedTransformerConfig(**TL))
    for toggle in (model.set_use_split_qkv_input, model.set_use_hook_mlp_in, model.set_use_attn_in):
        toggle(True)
    if not on:
        for toggle in (model.set_use_split_qkv_input, model.set_use_hook_mlp_in, model.set_use_attn_in):
            toggle(False)
    return model


def _tokens(shape, low: int, high: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))


def _run(model):
    """A forward on two seeded prompts, ids clear of the special ones (0, 1, 2 and the vocabulary's last)."""
    high = model.cfg.d_vocab - 1
    if isinstance(model, EncoderDecoderTransformer):
        target = _tokens((2, 4), 3, high, seed=1)
        target[:, 0] = model.cfg.decoder_start_token_id
        return model(_tokens((2, 5), 3, getattr(model.cfg, "source_vocab", high + 1) - 1), target)
    return model(_tokens((2, 5), 3, high))


def contract(model) -> dict:
    """What a forward fires (``[name, shape]`` in order), the ``state_dict`` keys, the module paths, the output's
    sum."""
    fired = []
    points = [module for module in model.modules() if isinstance(module, HookPoint)]
    for point in points:
        point.add_hook(lambda tensor, hook: fired.append([hook.name, list(tensor.shape)]))
    try:
        with torch.no_grad():
            out = _run(model)
    finally:
        for point in points:
            point.remove_hooks()
    return {
        "hooks": fold_layers(f"{name} {'x'.join(map(str, shape))}" for name, shape in fired),
        "state_dict": fold_layers(model.state_dict()),
        "modules": fold_layers(name for name, _ in model.named_modules()),
        "sum": float(out.double().sum()),
    }


LAYER = re.compile(r"(^|\.)blocks\.(\d+)(\.|$)")


def fold_layers(names) -> list[str]:
    """``names`` with consecutive layers that list the same entries (but for the layer index) written once, as
    ``blocks.0-1.…``; the original list is these expanded, in order."""
    runs = []  # [(prefix, first layer, last layer) or None, entries with the layer index as "#"]
    for name in names:
        match = LAYER.search(name)
        if match is None:
            runs.append([None, [name]])
            continue
        key, entry = (name[: match.start()], int(match.group(2))), LAYER.sub(r"\1blocks.#\3", name, count=1)
        last = runs[-1] if runs else [None, []]
        if last[0] is not None and last[0][0] == key[0] and last[0][2] == key[1]:
            last[1].append(entry)
        else:
            runs.append([(key[0], key[1], key[1]), [entry]])
    merged = []
    for span, entries in runs:
        previous = merged[-1] if merged else None
        if (
            span is not None
            and previous is not None
            and previous[0] is not None
            and previous[0][0] == span[0]
            and previous[0][2] + 1 == span[1]
            and previous[1] == entries
        ):
            previous[0] = (span[0], previous[0][1], span[2])
        else:
            merged.append([span, entries])
    out = []
    for span, entries in merged:
        layers = None if span is None else (f"{span[1]}" if span[1] == span[2] else f"{span[1]}-{span[2]}")
        out += entries if span is None else [entry.replace("blocks.#", f"blocks.{layers}", 1) for entry in entries]
    return out


def spec_models() -> dict:
    return {f"spec-{drawn.name}": drawn.build for drawn in draw_specs(8, seed=41)}


def current_contracts() -> dict:
    return {label: contract(build()) for label, build in {**family_models(), **spec_models()}.items()}


def to_json(snapshot: dict) -> str:
    """One line per hook, key or module, so a diff shows what changed."""
    return json.dumps(snapshot, indent=1, sort_keys=True) + "\n"


@pytest.fixture(scope="module")
def recorded() -> dict:
    current = current_contracts()
    if UPDATE:
        SNAPSHOT.write_text(to_json(current), encoding="utf-8")
        pytest.skip(f"snapshot rewritten: {SNAPSHOT}; review the diff before committing")
    return {"current": current, "recorded": json.loads(SNAPSHOT.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("part", ["hooks", "state_dict", "modules"])
def test_every_family_keeps_its_hooks_weights_and_modules(recorded, part):
    current, snapshot = recorded["current"], recorded["recorded"]
    assert sorted(current) == sorted(snapshot)
    changed = [label for label in snapshot if current[label][part] != snapshot[label][part]]
    assert not changed, f"{part} changed for {changed}: first {current[changed[0]][part]}"


def test_every_family_computes_what_it_computed(recorded):
    current, snapshot = recorded["current"], recorded["recorded"]
    changed = [
        (label, snapshot[label]["sum"], current[label]["sum"])
        for label in snapshot
        if not math.isclose(current[label]["sum"], snapshot[label]["sum"], rel_tol=1e-5, abs_tol=1e-5)
    ]
    assert not changed


def test_the_contract_test_sees_a_changed_block():
    """The snapshot comparison is not vacuous: a block with one hook fewer, or renamed weights, differs."""
    model = DemoTransformer(config("gpt2")(**SHAPE), seed=0)
    before = contract(model)
    del model.blocks[0]._modules["hook_resid_mid"]
    model.blocks[0].hook_resid_mid = torch.nn.Identity()
    model.setup()
    after = contract(model)
    assert "blocks.0-1.hook_resid_mid 2x5x16" in before["hooks"] and after["state_dict"] == before["state_dict"]
    assert [name for name in after["hooks"] if "resid_mid" in name] == ["blocks.1.hook_resid_mid 2x5x16"]


# --- the options' rules -------------------------------------------------------------------------------------------
def test_a_part_that_needs_an_mlp_is_refused_by_name_on_an_attention_only_block():
    from interp_transformer.parts import MLP, Attention, LayerNorm, PostNormBlock, PreNormBlock

    cfg = config("gpt2")(**SHAPE)
    norm = lambda: LayerNorm(cfg.d_model, 1e-5)  # noqa: E731
    with pytest.raises(ValueError, match="ln2 needs an MLP"):
        PreNormBlock(norm(), Attention(cfg), norm())
    with pytest.raises(ValueError, match="beside_mlp needs an MLP"):
        PreNormBlock(norm(), Attention(cfg), beside_mlp={"adapter": MLP(cfg)})
    with pytest.raises(ValueError, match="ln1_post and ln2_post come together"):
        PreNormBlock(norm(), Attention(cfg), norm(), MLP(cfg), ln1_post=norm())
    with pytest.raises(ValueError, match="cross_attn and cross_norm come together"):
        PostNormBlock(Attention(cfg), norm(), MLP(cfg), norm(), cross_attn=Attention(cfg))


def test_input_hooks_are_refused_on_a_parallel_block_not_turned_into_a_sequential_one():
    model = HookedTransformer(HookedTransformerConfig(**TL, parallel_attn_mlp=True))
    logits = model(_tokens((2, 5), 3, 36))
    with pytest.raises(ValueError, match="ParallelBlock"):
        model.set_use_attn_in(True)
    assert all(type(block).__name__ == "ParallelBlock" for block in model.blocks)
    assert torch.equal(model(_tokens((2, 5), 3, 36)), logits)


def test_toggled_input_hooks_keep_the_hooks_already_attached():
    model = HookedTransformer(HookedTransformerConfig(**TL))
    seen = []
    model.blocks[0].hook_resid_mid.add_hook(lambda tensor, hook: seen.append(hook.name))
    model.set_use_split_qkv_input(True)
    model(_tokens((2, 5), 3, 36))
    model.set_use_split_qkv_input(False)
    model(_tokens((2, 5), 3, 36))
    assert seen == ["blocks.0.hook_resid_mid"] * 2

"""Attention is two classes, ``Attention`` and ``CrossAttention``; the soft-cap, split inputs and ``hook_result``
are options of the one class, and the models that use them kept their contract through the change.

The count is read from the package's AST (tried on a known-bad snippet). The contract of tiny random models of
every family that used one of the old subclasses (Gemma 2's soft-caps; TransformerLens' ``use_split_qkv_input``,
``use_attn_result``; both with Gemma 2's caps, built so and toggled so) lives in
``tests/data/attention_classes_snapshot.json``: the hooks a forward fires, in order, with their shapes, the
``named_modules`` paths, the ``state_dict`` keys and a checksum of the logits (bit for bit). It was recorded on the
code before the merge; a change to it is a change of interface, never rewritten silently. After an intended change,
regenerate it explicitly and review the diff:

    INTERP_TRANSFORMER_UPDATE_SNAPSHOT=1 python -m pytest tests/test_attention_classes.py
"""

import ast
import hashlib
import json
import os
import pathlib

import pytest
import torch

import interp_transformer
from interp_transformer import DemoTransformer, HookedTransformer, HookedTransformerConfig
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.parts import Attention, Unembed

PACKAGE = pathlib.Path(interp_transformer.__file__).parent
SNAPSHOT = pathlib.Path(__file__).parent / "data" / "attention_classes_snapshot.json"
UPDATE = os.environ.get("INTERP_TRANSFORMER_UPDATE_SNAPSHOT") == "1"
MOST_ATTENTION_CLASSES = 2


# --- (a) the count --------------------------------------------------------------------------------------------------
def attention_classes(sources: dict[str, str]) -> list[str]:
    """``module:Class`` for every attention class in ``sources`` (``{module: source}``): an ``nn.Module`` subclass
    named ``*Attention``, or any class with an attention class among its bases (followed through the modules)."""
    bases: dict[str, list[str]] = {}  # class name -> the last part of each base's dotted name
    where: dict[str, str] = {}
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                bases.setdefault(node.name, []).extend(names)
                where.setdefault(node.name, f"{module}:{node.name}")

    def reaches(name: str, targets: set[str], seen: frozenset = frozenset()) -> bool:
        if name in seen:
            return False
        return any(base in targets or reaches(base, targets, seen | {name}) for base in bases.get(name, ()))

    modules = {name for name in bases if reaches(name, {"Module"})}
    roots = {name for name in modules if name.endswith("Attention")}
    found = roots | {name for name in bases if reaches(name, roots)}
    return sorted(where[name] for name in found)


def package_sources() -> dict[str, str]:
    return {str(path.relative_to(PACKAGE.parent)): path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")}


def test_the_finder_sees_every_kind_of_attention_class():
    bad = {
        "a.py": "from torch import nn\nclass Mixin: pass\nclass Attention(Mixin, nn.Module): pass\n"
        "class CrossAttention(Attention): pass\nclass CrossAttentionSource: pass\nclass Other(nn.Module): pass\n",
        "b.py": "from a import Attention\nclass SoftCapped(Attention): pass\nclass Split(SoftCapped): pass\n"
        "class Base(torch.nn.Module): pass\nclass LocalAttention(Base): pass\n",
    }
    assert attention_classes(bad) == [
        "a.py:Attention",
        "a.py:CrossAttention",
        "b.py:LocalAttention",
        "b.py:SoftCapped",
        "b.py:Split",
    ]


def test_attention_is_two_classes():
    found = attention_classes(package_sources())
    assert len(found) <= MOST_ATTENTION_CLASSES, found


# --- (b, c) the contract of the models that used the old subclasses --------------------------------------------------
BATCH, POS = 2, 5
TOKENS = torch.randint(0, 17, (BATCH, POS), generator=torch.Generator().manual_seed(0))
SHAPE = dict(d_model=12, n_layers=2, n_heads=4, d_head=4, d_vocab=17, n_ctx=8)
GEMMA2 = GemmaConfig(
    **SHAPE,
    n_key_value_heads=2,
    d_mlp=10,
    query_pre_attn_scalar=6.0,
    attn_softcap=0.8,
    final_softcap=1.5,
    sliding_window=3,
    global_every=2,
)
TL = dict(**SHAPE, d_mlp=10, act_fn="gelu", normalization_type="LN", seed=0)
TL_GEMMA2 = dict(
    **SHAPE,
    d_mlp=10,
    act_fn="gelu_pytorch_tanh",
    normalization_type="RMS",
    positional_embedding_type="rotary",
    rotary_dim=2,
    n_key_value_heads=2,
    gated_mlp=True,
    use_normalization_before_and_after=True,
    use_local_attn=True,
    window_size=3,
    attn_types=["local", "global"],
    attn_scores_soft_cap=0.8,
    output_logits_soft_cap=1.5,
    seed=0,
)


def perturbed(model):
    """``model`` with every parameter drawn again, large enough that the soft-caps bite (seeded: the same each run)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model.eval()


def toggled(model, *states: bool):
    """``model`` after ``set_use_attn_result`` and ``set_use_split_qkv_input`` were set to each of ``states``."""
    for state in states:
        model.set_use_attn_result(state)
        model.set_use_split_qkv_input(state)
    return model


MODELS = {
    "gemma2_softcap": lambda: DemoTransformer(GEMMA2, seed=0),
    "tl_split_qkv_input": lambda: HookedTransformer(HookedTransformerConfig(**TL, use_split_qkv_input=True)),
    "tl_attn_result": lambda: HookedTransformer(HookedTransformerConfig(**TL, use_attn_result=True)),
    "tl_gemma2_softcap_split_result": lambda: HookedTransformer(
        HookedTransformerConfig(**TL_GEMMA2, use_split_qkv_input=True, use_attn_result=True)
    ),
    "tl_gemma2_softcap_toggled_on": lambda: toggled(HookedTransformer(HookedTransformerConfig(**TL_GEMMA2)), True),
    "tl_gemma2_softcap_toggled_off": lambda: toggled(
        HookedTransformer(HookedTransformerConfig(**TL_GEMMA2)), True, False
    ),
}


def checksum(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().to(torch.float64).contiguous().numpy().tobytes()).hexdigest()


def contract(model) -> dict:
    """What the merge must keep: hooks fired (in order, with shapes), module paths, state_dict keys, logits."""
    fired = []

    def note(tensor, hook):
        fired.append([hook.name, list(tensor.shape)])

    with torch.no_grad():
        logits = model(TOKENS)
        hooked = model.run_with_hooks(TOKENS, fwd_hooks=[(lambda name: True, note)])
        attn = model.blocks[0].attn
        x = torch.randn(BATCH, POS, SHAPE["d_model"], generator=torch.Generator().manual_seed(2))
        record = {
            "hooks": fired,
            "modules": [name for name, _ in model.named_modules()],
            "state_dict": list(model.state_dict()),
            "logits": checksum(logits),
            "logits_all_hooked": checksum(hooked),
            "attn": checksum(attn(x)),
        }
        if isinstance(model, HookedTransformer):  # TransformerLens' own call, one input per head too
            per_head = (
                x[:, :, None].repeat(1, 1, SHAPE["n_heads"], 1) * torch.linspace(0.5, 1.5, SHAPE["n_heads"])[:, None]
            )
            kv = per_head[:, :, : attn.n_key_value_heads]
            record["attn_tl_call"] = checksum(attn(query_input=x, key_input=x, value_input=x))
            record["attn_per_head_inputs"] = checksum(attn(query_input=per_head, key_input=kv, value_input=kv))
    return record


def to_json(snapshot: dict) -> str:
    """JSON with one hook, module or key per line, so a diff of the snapshot reads like a diff of the contract."""
    lines = []
    for label, record in snapshot.items():
        fields = []
        for key, value in record.items():
            if isinstance(value, list):
                items = ",\n".join("   " + json.dumps(item) for item in value)
                fields.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
            else:
                fields.append(f"  {json.dumps(key)}: {json.dumps(value)}")
        lines.append(f" {json.dumps(label)}: {{\n" + ",\n".join(fields) + "\n }")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def current_snapshot() -> dict:
    return {label: contract(perturbed(build())) for label, build in MODELS.items()}


@pytest.fixture(scope="module")
def snapshot() -> dict:
    current = current_snapshot()
    if UPDATE:
        SNAPSHOT.write_text(to_json(current), encoding="utf-8")
        pytest.skip(f"snapshot rewritten: {SNAPSHOT}; review the diff before committing")
    return current


@pytest.mark.parametrize("label", list(MODELS))
@pytest.mark.parametrize("key", ["hooks", "modules", "state_dict"])
def test_hooks_modules_and_state_dict_keys_are_unchanged(snapshot, label, key):
    assert snapshot[label][key] == json.loads(SNAPSHOT.read_text(encoding="utf-8"))[label][key]


@pytest.mark.parametrize("label", list(MODELS))
def test_logits_are_unchanged_bit_for_bit(snapshot, label):
    recorded = json.loads(SNAPSHOT.read_text(encoding="utf-8"))[label]
    checksums = {key: value for key, value in snapshot[label].items() if key.startswith(("logits", "attn"))}
    assert checksums == {key: recorded[key] for key in checksums}
    assert set(checksums) == {key for key in recorded if key.startswith(("logits", "attn"))}


def test_the_soft_capped_models_do_cap():
    """The snapshot's models reach their caps, so that a lost cap would show in the checksums."""
    model = perturbed(MODELS["gemma2_softcap"]())
    _, cache = model.run_with_cache(TOKENS)
    assert cache["blocks.0.attn.hook_attn_scores_uncapped"].abs().nan_to_num(posinf=0, neginf=0).max() > 2 * 0.8
    assert cache["unembed.hook_logits_uncapped"].abs().max() > 2 * 1.5


# --- the options, each refused by name when given wrong ---------------------------------------------------------
def test_the_options_are_checked_where_they_enter():
    cfg = GEMMA2
    with pytest.raises(TypeError, match="split_inputs must be a bool, got 'yes'"):
        Attention(cfg, split_inputs="yes")
    with pytest.raises(TypeError, match="result_hook must be a bool, got 1"):
        Attention(cfg, result_hook=1)
    with pytest.raises(ValueError, match="a soft-cap must be a finite number > 0, got 0"):
        Attention(cfg, softcap=0)
    with pytest.raises(TypeError, match="in_out_hooks must be a bool, got None"):
        Unembed(cfg, in_out_hooks=None)
    x = torch.zeros(1, 3, cfg.d_model)
    with pytest.raises(TypeError, match=r"build it with Attention\(\.\.\., split_inputs=True\)"):
        Attention(cfg)(query_input=x)
    with pytest.raises(TypeError, match="pass the input once"):
        Attention(cfg, split_inputs=True)(x, query_input=x)


def test_the_result_hook_is_added_last_and_taken_away_in_place():
    model = HookedTransformer(HookedTransformerConfig(**TL))
    attn = model.blocks[0].attn
    model.set_use_attn_result(True)
    assert model.blocks[0].attn is attn and list(attn._modules)[-1] == "hook_result"
    assert "blocks.0.attn.hook_result" in model.hook_dict
    model.set_use_attn_result(False)
    assert "hook_result" not in attn._modules and "blocks.0.attn.hook_result" not in model.hook_dict

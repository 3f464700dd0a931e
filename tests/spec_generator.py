"""Random builder specs over every field: decoders (experts included), encoders and encoder-decoders.

``draw_specs(n, seed)`` gives ``n`` ``RandomSpec``s, the same for the same seed: each field of
``DecoderSpec``, ``EncoderSpec`` or ``EncoderDecoderSpec`` takes one of its values (every choice of
every field is reachable, each option of a kind of positions only with it, as the builder asks), at
sizes small enough that every tool runs on a spec in well under a second. ``RandomSpec.build()`` is
the model in float64 with every trainable parameter moved off its init (``perturbed.perturb``'s
noise: nothing sits at a zero or a one that would hide a wrong term), a bias the design holds at
zero left at zero. ``RandomSpec.repro`` is the one line that builds it again.

The fields the builder gains later plug in at one place, ``LATER_DECODER_FIELDS``: a field is drawn
only where ``DecoderSpec`` has it, so the generator runs over the fields of the builder it is given.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from interp_transformer.builder import build_decoder, build_encoder, build_encoder_decoder
from interp_transformer.families import composed
from interp_transformer.families import composed_parts as parts
from interp_transformer.families.composed import DecoderSpec
from interp_transformer.families.composed_stacks import EncoderDecoderSpec, EncoderSpec
from interp_transformer.parts.activations import ACTIVATIONS

KINDS = {"decoder": build_decoder, "encoder": build_encoder, "encoder_decoder": build_encoder_decoder}
KIND_WEIGHTS = {"decoder": 6, "encoder": 2, "encoder_decoder": 2}  # decoders have the most fields
# d_model, n_heads, d_head (None: d_model // n_heads); one d_head wider than d_model / n_heads, one odd
SHAPES = [(12, 2, None), (16, 4, 4), (16, 2, 6), (8, 2, None), (12, 3, 4), (10, 2, 5)]
N_POS = 6  # every prompt's length; n_ctx is drawn at or above it
PLACEMENTS = getattr(composed, "PLACEMENTS", parts.PLACEMENTS)  # a decoder's placements (OLMo 2's "output" too)


@dataclass(frozen=True)
class RandomSpec:
    """One drawn spec: which builder, its fields, and the seed of its weights and prompts."""

    kind: str  # "decoder", "encoder" or "encoder_decoder"
    fields: dict
    seed: int

    @property
    def name(self) -> str:
        """A short label for test ids: kind, seed and the parts that most change what a tool sees."""
        f = self.fields
        words = [self.kind, str(self.seed), f.get("norm", "layer"), f.get("placement", "post"), f.get("positions")]
        if f.get("experts"):
            words.append("experts")
        if self.kind == "decoder" and f.get("d_mlp") is None:
            words.append("attn_only")
        return "-".join(str(w) for w in words if w is not None)

    @property
    def repro(self) -> str:
        """The call that builds this model again (then ``perturb(model, seed=...)``)."""
        args = ", ".join(f"{key}={value!r}" for key, value in self.fields.items())
        return f"build_{self.kind}({args}, dtype=torch.float64, seed={self.seed})"

    @property
    def spec(self):
        return {"decoder": DecoderSpec, "encoder": EncoderSpec, "encoder_decoder": EncoderDecoderSpec}[self.kind](
            **self.fields
        )

    def build(self):
        """The model in float64, every trainable parameter perturbed (held-at-zero biases stay zero), eval mode."""
        model = KINDS[self.kind](dtype=torch.float64, seed=self.seed, **self.fields)
        return perturb_trainable(model, seed=self.seed + 1)


def perturb_trainable(model, scale: float = 0.3, seed: int = 1):
    """``perturbed.perturb``, but a parameter the design holds at zero (``requires_grad`` off) stays zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator).to(param.dtype) * scale
            if param.requires_grad:
                param.add_(noise)
    return model.eval()


def _shape(rng: random.Random, even_head: bool = False, even_model: bool = False, whole: bool = False) -> dict:
    """A shape of ``SHAPES``: with ``whole``, heads that fill ``d_model`` exactly (an encoder-decoder's rule)."""
    choices = [
        s
        for s in SHAPES
        if not (even_head and (s[2] or s[0] // s[1]) % 2)
        and not (even_model and s[0] % 2)
        and not (whole and s[2] is not None and s[1] * s[2] != s[0])
    ]
    d_model, n_heads, d_head = rng.choice(choices)
    return dict(d_model=d_model, n_heads=n_heads, d_head=d_head)


def _common(rng: random.Random) -> dict:
    """The fields every spec shares: vocabulary, context, eps, activation, embedding scale, init."""
    return dict(
        d_vocab=rng.randint(17, 40),
        n_ctx=rng.choice([N_POS, 8, 16]),
        norm_eps=rng.choice([1e-5, 1e-6, 0.1]),
        activation=rng.choice(sorted(ACTIVATIONS)),
        embed_scale=rng.choice([None, None, 2.0, parts.SQRT_D_MODEL]),
        init_range=rng.choice([0.02, 0.1]),
    )


def _decoder_positions(rng: random.Random, n_heads: int) -> dict:
    positions = rng.choice(parts.POSITIONS)
    out = dict(positions=positions)
    if positions == "rotary":
        out.update(rotary_base=rng.choice([None, 100.0]), rotary_interleaved=rng.choice([None, True, False]))
    elif positions == "alibi" and rng.random() < 0.5:
        out["alibi_slopes"] = tuple(round(rng.uniform(0.05, 1.0), 3) for _ in range(n_heads))
    elif positions == "relative_clipped":
        out["max_distance"] = rng.randint(1, 5)
    return out


def _experts(rng: random.Random) -> dict:
    n_experts = rng.randint(2, 4)
    return dict(
        n_experts=n_experts,
        top_k=rng.randint(1, n_experts),
        router_bias=rng.random() < 0.5,
        expert_mlp=rng.choice(parts.EXPERT_MLPS),
        renormalize=rng.random() < 0.7,
    )


# --- the fields the builder gains later (issue 46): each a function of the rng and the fields drawn so far --------
# A field is drawn only where DecoderSpec has it; None leaves the builder's default.
def _kv_heads(rng, f):
    return rng.choice([None] + [k for k in range(1, f["n_heads"]) if f["n_heads"] % k == 0])


def _block_kind(rng, f):  # which of the pre-norm blocks: plain, parallel (GPT-NeoX) or with output norms (Gemma 2)
    if f["placement"] != "pre" or f["d_mlp"] is None:
        return None
    return rng.choice([None, "parallel", "post_norms" if f["norm"] != "none" else None])


def _layer_types(rng, f):
    if not f["causal"] or rng.random() < 0.5:
        return None
    return rng.choice([None, tuple(rng.choice(parts.LAYER_TYPES) for _ in range(f["n_layers"]))])


def _window(rng, f):
    types = f.get("layer_types")
    if types is not None and "sliding_attention" not in types:
        return None
    return rng.randint(1, 4) if types is not None or (f["causal"] and rng.random() < 0.3) else None


def _d_head(f) -> int:
    return f["d_head"] or f["d_model"] // f["n_heads"]


def _sliding(f) -> bool:
    return f.get("sliding_window") is not None


LATER_DECODER_FIELDS: dict[str, Callable[[random.Random, dict], object]] = {
    "n_key_value_heads": _kv_heads,
    "parallel_residual": lambda rng, f: _block_kind(rng, f) == "parallel" or None,
    "post_norms": lambda rng, f: (not f.get("parallel_residual") and _block_kind(rng, f) == "post_norms") or None,
    "qk_norm": lambda rng, f: rng.choice([None, None, "per_head", "all_heads"]),
    "layer_types": _layer_types,
    "sliding_window": _window,
    "rotary_dim": lambda rng, f: (
        rng.choice([None, *range(2, _d_head(f) + 1, 2)]) if f["positions"] == "rotary" else None
    ),
    "rotary_base_local": lambda rng, f: (
        rng.choice([None, 50.0]) if f["positions"] == "rotary" and _sliding(f) else None
    ),
    "attn_softcap": lambda rng, f: rng.choice([None, None, 5.0, 50.0]),
    "final_softcap": lambda rng, f: rng.choice([None, None, 10.0, 30.0]),
}


def _later_fields(rng: random.Random, drawn: dict) -> dict:
    known = {field.name for field in fields(DecoderSpec)}
    out = {}
    for name, draw in LATER_DECODER_FIELDS.items():
        if name in known:
            value = draw(rng, {**drawn, **out})
            if value is not None:
                out[name] = value
    return out


def draw_decoder(rng: random.Random) -> dict:
    f = dict(_shape(rng), n_layers=rng.randint(1, 3), **_common(rng))
    f.update(_decoder_positions(rng, f["n_heads"]))
    if f["positions"] == "rotary":  # rotary turns pairs of a head's dimensions
        f.update(_shape(rng, even_head=True))
    if f["positions"] == "alibi" and "alibi_slopes" in f:
        f["alibi_slopes"] = tuple(round(rng.uniform(0.05, 1.0), 3) for _ in range(f["n_heads"]))
    if f["positions"] == "sinusoidal_interleaved":  # sines and cosines in pairs
        f.update(_shape(rng, even_model=True))
    f["norm"] = rng.choice(list(parts.NORMS))
    f["placement"] = "pre" if f["norm"] == "none" else rng.choice(PLACEMENTS)
    f["final_norm"] = rng.random() < 0.7
    f["causal"] = rng.random() < 0.8
    mlp = rng.choice(["plain", "plain", "gated", "experts", "none"])
    if mlp == "none" and f["placement"] != "pre":
        mlp = "plain"
    f["d_mlp"] = None if mlp == "none" else rng.randint(6, 20)
    f["gated_mlp"] = mlp == "gated"
    f["experts"] = _experts(rng) if mlp == "experts" else None
    f["attn_scale"] = rng.choice([None, None, 1.0, 0.3])
    for bias in ("attn_bias", "mlp_bias", "readout_bias"):
        f[bias] = rng.random() < 0.7
    f.update(_later_fields(rng, f))
    return f


def draw_encoder(rng: random.Random) -> dict:
    positions = rng.choice(parts.ADDED_POSITIONS)
    return dict(
        _shape(rng, even_model=positions == "sinusoidal_interleaved"),
        n_layers=rng.randint(1, 3),
        d_mlp=rng.randint(6, 20),
        **_common(rng),
        n_token_types=rng.randint(1, 3),
        norm=rng.choice(["layer", "layer_unbiased", "rms"]),
        positions=positions,
        embed_norm=rng.random() < 0.7,
        mlm_head=rng.random() < 0.8,
        pooler=rng.random() < 0.3,
    )


def draw_encoder_decoder(rng: random.Random) -> dict:
    positions = rng.choice(parts.ENCODER_DECODER_POSITIONS)
    f = dict(
        _shape(rng, even_model=positions == "sinusoidal_interleaved", whole=True),
        n_layers=rng.randint(1, 2),
        n_decoder_layers=rng.randint(1, 2),
        d_mlp=rng.randint(6, 20),
        **_common(rng),
        norm=rng.choice(["layer", "layer_unbiased", "rms"]),
        placement=rng.choice(parts.PLACEMENTS),
        final_norm=rng.random() < 0.7,
        positions=positions,
        attn_scale=rng.choice([None, None, 1.0, 0.3]),
        separate_embeddings=rng.random() < 0.3,
        attn_bias=rng.random() < 0.7,
        mlp_bias=rng.random() < 0.7,
        readout_bias=rng.random() < 0.7,
    )
    if positions == "learned":
        f["share_positions"] = rng.random() < 0.5
    if positions == "relative_bucketed":
        f["n_buckets"] = rng.choice([None, 6, 8])
        f["max_distance"] = rng.choice([None, 8, 12]) if f["n_buckets"] is not None else None
    if f["separate_embeddings"] and rng.random() < 0.5:
        f["d_vocab_source"] = rng.randint(17, 40)
    return f


DRAW = {"decoder": draw_decoder, "encoder": draw_encoder, "encoder_decoder": draw_encoder_decoder}


def draw_spec(seed: int, kind: str | None = None) -> RandomSpec:
    """The spec of ``seed`` (of ``kind``, or a kind drawn by ``KIND_WEIGHTS``); the builder validates it here, so a
    draw the builder refuses is a bug of this generator and raises."""
    rng = random.Random(seed)
    if kind is None:
        kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    drawn = RandomSpec(kind, DRAW[kind](rng), seed)
    drawn.spec  # noqa: B018  (validated now: a refusal here names the field the generator got wrong)
    return drawn


def draw_specs(n: int, seed: int = 0, kind: str | None = None) -> list[RandomSpec]:
    """``n`` specs, the same for the same ``seed``: spec ``i`` is ``draw_spec(seed * 100_003 + i)``."""
    return [draw_spec(seed * 100_003 + i, kind) for i in range(n)]


def prompts(drawn: RandomSpec, model) -> dict:
    """A clean/corrupted pair of two prompts of ``N_POS`` tokens (differing in three positions), the answers the
    metric reads (``answers``: right and wrong, one per prompt), and, for an encoder-decoder, (source, target)
    pairs. Seeded by the spec."""
    g = torch.Generator().manual_seed(drawn.seed)
    d_vocab = model.cfg.d_vocab
    if drawn.kind == "encoder_decoder":
        cfg = model.cfg
        special = {cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id}
        source_vocab = cfg.source_vocab
        source = _ids(g, (2, N_POS), source_vocab, special)
        target = _ids(g, (2, 4), d_vocab, special)
        target[:, 0] = cfg.decoder_start_token_id
        corrupted_source, corrupted_target = source.clone(), target.clone()
        corrupted_source[:, [1, 3]] = _ids(g, (2, 2), source_vocab, special)
        corrupted_target[0, 2] = _ids(g, (1,), d_vocab, special)[0]
        clean, corrupted = (source, target), (corrupted_source, corrupted_target)
    else:
        clean = _ids(g, (2, N_POS), d_vocab, set())
        corrupted = clean.clone()  # the last token too: every identity then compares values away from zero
        corrupted[:, [1, 3, N_POS - 1]] = _ids(g, (2, 3), d_vocab, set())
    # the metric reads two entries of the output: logits, or an encoder's hidden states where it has no MLM head
    width = model.cfg.d_model if drawn.kind == "encoder" and not drawn.fields["mlm_head"] else d_vocab
    right = torch.randint(0, width, (2,), generator=g)
    wrong = (right + torch.randint(1, width, (2,), generator=g)) % width  # never the right one: a zero difference
    answers = right, wrong
    return dict(clean=clean, corrupted=corrupted, answers=answers)


def _ids(g: torch.Generator, shape: tuple, vocab: int, avoid: set) -> torch.Tensor:
    """Random ids in ``[0, vocab)`` none of which is in ``avoid`` (special ids an encoder-decoder reads as such)."""
    allowed = torch.tensor([i for i in range(vocab) if i not in avoid])
    return allowed[torch.randint(0, len(allowed), shape, generator=g)]


__all__ = ["LATER_DECODER_FIELDS", "N_POS", "RandomSpec", "draw_spec", "draw_specs", "perturb_trainable", "prompts"]

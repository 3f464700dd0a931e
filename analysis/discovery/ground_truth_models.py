"""The ground-truth models' weights, written by hand (``ground_truth``'s docstring says what each computes).

Every model is a norm-free decoder (``norm="none"``, no final norm, ``attn_scale=1``) whose residual
stream is cut into named subspaces: ``tok`` (the token, one-hot, from ``W_E``), ``pos`` (the
position, one-hot, from ``W_pos``), and the subspaces the circuit writes (``prev``, ``out``,
``moved``, ``feat``). The circuit's heads and experts are zeroed and then written; the read-out
``W_U`` reads ``out`` (or ``feat``) as the answer's logit. Every other part keeps its seeded random
init (``BACKGROUND`` standard deviation): background heads and MLPs whose small effects are real.

An attention score of ``SHARP`` (20) against 0 leaves ``e^-20`` of the pattern elsewhere: hard attention.
"""

import torch
from torch import Tensor

from interp_transformer.builder import build_decoder

from .ground_truth_types import GroundTruth
from .metrics import logit_diff_per_row

SHARP = 20.0  # attention score of the intended key: every other key gets about e^-20 of the pattern
BACKGROUND = 0.1  # std of the random weights of every part outside the circuit
N_PROMPTS = 8
LENGTH = 5  # prompt length: BOS, three words, a last token


def _decoder(dtype, seed: int, **fields):
    """A norm-free decoder of random (background) weights, its embeddings and read-out cleared for the layout."""
    model = build_decoder(
        norm="none", final_norm=False, attn_scale=1.0, activation="relu", positions="learned", n_ctx=8,
        init_range=BACKGROUND, seed=seed, dtype=dtype, name="ground-truth", **fields,
    )  # fmt: skip
    with torch.no_grad():
        for name in ("embed.W_E", "pos_embed.W_pos", "unembed.b_U"):
            _weight(model, name).zero_()
    return model


def _weight(module, name: str) -> torch.Tensor:
    """The tensor ``module`` stores under ``name`` (grouped keys and values are stored as ``_W_K``/``_W_V``),
    writable in place."""
    state = module.state_dict(keep_vars=True)
    if name not in state:
        head, _, last = name.rpartition(".")
        name = f"{head}._{last}" if head else f"_{last}"
    return state[name].data


def _one_hot_inputs(model, tok: int, pos: int) -> None:
    """``W_E[v, tok + v] = 1`` and ``W_pos[i, pos + i] = 1``."""
    W_E, W_pos = _weight(model, "embed.W_E"), _weight(model, "pos_embed.W_pos")
    W_E[:, tok : tok + W_E.shape[0]] = torch.eye(W_E.shape[0], dtype=W_E.dtype)
    W_pos[:, pos : pos + W_pos.shape[0]] = torch.eye(W_pos.shape[0], dtype=W_pos.dtype)


def _clear_head(model, layer: int, head: int, group: int) -> dict[str, torch.Tensor]:
    """Zeroes query head ``head`` (and its key/value head ``group``) of block ``layer``; returns its weights by name."""
    weights = {}
    for name, index in (("W_Q", head), ("b_Q", head), ("W_K", group), ("b_K", group), ("W_V", group), ("b_V", group)):
        weights[name] = _weight(model.blocks[layer].attn, name)[index]
        weights[name].zero_()
    weights["W_O"] = _weight(model.blocks[layer].attn, "W_O")[head]
    weights["W_O"].zero_()
    return weights


def _copy_prompts(seed: int, V: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A copy task's words ``x`` and their corrupted ``other``, and the prompts ``BOS x y z END``, clean and with ``x``
    replaced by ``other``."""
    x, y, z, other = _draws(seed + 1, V - 1, 4).unbind(-1)
    return x, other, _prompts(x, y, z, V - 1), _prompts(other, y, z, V - 1)


def _prompts(*words) -> Tensor:
    """``[N_PROMPTS, 1 + len(words)]``: ``BOS`` (token 0), then each of ``words`` (``[N_PROMPTS]`` ids, or one id for
    every prompt)."""
    columns = [torch.full((N_PROMPTS,), word) if isinstance(word, int) else word for word in words]
    return torch.stack([torch.zeros(N_PROMPTS, dtype=torch.long), *columns], dim=1)


def _attend_by_position(head: dict, pos: int, query_at: int, key_at: int) -> None:
    """The head's query at position ``query_at`` scores the key at ``key_at`` ``SHARP``, every other 0."""
    head["W_Q"][pos + query_at, 0] = SHARP
    head["W_K"][pos + key_at, 0] = 1.0


def _copy_token(head: dict, tok: int, to: int, n_tokens: int, scale: float) -> None:
    """The head's OV writes ``scale`` times the attended token's one-hot into the subspace at ``to``."""
    for v in range(n_tokens):
        head["W_V"][tok + v, v] = 1.0
        head["W_O"][v, to + v] = scale


def _read_out(model, at: int, n_tokens: int) -> None:
    """``W_U`` reads the subspace at ``at`` as the logits, one dimension per token (its other rows stay random)."""
    W_U = _weight(model, "unembed.W_U")
    W_U[at : at + n_tokens] = torch.eye(n_tokens, dtype=W_U.dtype)


def _copy_truth(name: str, model, seed: int, V: int, out: int, edges: tuple, notes: str) -> GroundTruth:
    """A copy task's ``GroundTruth``: ``W_U`` reads the subspace at ``out``; the prompts ``BOS X Y Z END`` predict
    ``X``, corrupted with another ``X``."""
    _read_out(model, out, V)
    x, other, clean, corrupted = _copy_prompts(seed, V)
    return GroundTruth(name, "copy", model, clean, corrupted, logit_diff_per_row(x, other), edges, notes)


def _draws(seed: int, n_tokens: int, k: int, low: int = 1) -> torch.Tensor:
    """``[N_PROMPTS, k]`` distinct tokens from ``[low, n_tokens)`` per prompt (seeded)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n_tokens - low, generator=generator)[:k] + low for _ in range(N_PROMPTS)])


@torch.no_grad()
def induction(dtype=torch.float64, seed: int = 0) -> GroundTruth:
    """``BOS A B C A`` predicts ``B``; corrupted ``BOS D B C E`` (the first ``A`` and the query both changed) has no
    match. Subspaces tok [0, 8), pos [8, 16), prev [16, 24), out [24, 32)."""
    V, tok, pos, prev, out = 8, 0, 8, 16, 24
    model = _decoder(dtype, seed, d_model=32, n_layers=2, n_heads=2, d_head=8, d_mlp=8, d_vocab=V)
    _one_hot_inputs(model, tok, pos)
    previous = _clear_head(model, 0, 0, 0)  # L0H0: the previous token's one-hot into prev
    for i in range(1, 8):
        previous["W_Q"][pos + i, i] = SHARP
        previous["W_K"][pos + i - 1, i] = 1.0
    _copy_token(previous, tok, prev, V, 1.0)
    inducing = _clear_head(model, 1, 0, 0)  # L1H0: query = current token, key = previous token (K-composition)
    for v in range(V):
        inducing["W_Q"][tok + v, v] = SHARP
        inducing["W_K"][prev + v, v] = 1.0
    _copy_token(inducing, tok, out, V, 4.0)
    _read_out(model, out, V)
    a, b, c, d, e = _draws(seed + 1, V, 5).unbind(-1)
    clean, corrupted = _prompts(a, b, c, a), _prompts(d, b, c, e)
    edges = (("input", "L0K0.v"), ("L0H0", "L1K0.k"), ("input", "L1H0.q"), ("L1H0", "logits"))
    notes = (
        "Each of the four edges is needed (an AND): the previous-token head's value reads the first A, its output "
        "reaches the induction head's keys (K-composition), the query reads the last A, and the induction head's "
        "OV writes B. The value of the induction head is not in it: the token it attends to (B) is the same in both."
    )
    return GroundTruth("induction", "induction", model, clean, corrupted, logit_diff_per_row(b, c), edges, notes)


@torch.no_grad()
def copy_gqa(dtype=torch.float64, seed: int = 0) -> GroundTruth:
    """``BOS X Y Z END`` predicts ``X``; corrupted: another ``X``. Four query heads share two key/value heads;
    L1H2 (key/value head 1, shared with L1H3) copies. Subspaces tok [0, 8), pos [8, 16), out [16, 24)."""
    V, tok, pos, out = 8, 0, 8, 16
    model = _decoder(dtype, seed, d_model=24, n_layers=2, n_heads=4, n_key_value_heads=2, d_head=8, d_mlp=8, d_vocab=V)
    _one_hot_inputs(model, tok, pos)
    mover = _clear_head(model, 1, 2, 1)
    _attend_by_position(mover, pos, LENGTH - 1, 1)
    _copy_token(mover, tok, out, V, 4.0)
    edges = (("input", "L1K1.v"), ("L1H2", "logits"))
    notes = (
        "The copied word reaches L1H2 through the values of its key/value head (L1K1.v, shared with L1H3, whose "
        "random output map makes a small background effect of its own); the query and key read positions only, the "
        "same in both prompts."
    )
    return _copy_truth("copy-gqa", model, seed, V, out, edges, notes)


@torch.no_grad()
def mlp_moe(dtype=torch.float64, seed: int = 0) -> GroundTruth:
    """``BOS X Y Z END`` predicts ``YES`` when ``X`` is big (4-6), ``NO`` when small (1-3); corrupted: a small ``X``.
    MLP0 is a mixture of two experts, one per token (top 1): the router sends the last position to expert 0, which
    computes the feature, and the others to expert 1 (random). Subspaces tok [0, 10), pos [10, 18), moved [18, 28),
    feat 28."""
    V, tok, pos, moved, feat, yes, no, end = 10, 0, 10, 18, 28, 7, 8, 9
    experts = dict(n_experts=2, top_k=1)
    model = _decoder(dtype, seed, d_model=32, n_layers=2, n_heads=2, d_head=10, d_mlp=4, d_vocab=V, experts=experts)
    _one_hot_inputs(model, tok, pos)
    mover = _clear_head(model, 0, 0, 0)
    _attend_by_position(mover, pos, LENGTH - 1, 1)
    _copy_token(mover, tok, moved, V, 1.0)
    router = _weight(model.blocks[0].mlp, "W_router")
    router.zero_()
    router[pos + LENGTH - 1, 0] = 5.0
    router[pos : pos + LENGTH - 1, 1] = 5.0
    expert = {name: _weight(model.blocks[0].mlp.experts[0], name) for name in ("W_in", "b_in", "W_out", "b_out")}
    for weight in expert.values():
        weight.zero_()
    for v in range(1, 7):  # neuron 0 fires on a big token, neuron 1 on a small one
        big = 1.0 if v >= 4 else -1.0
        expert["W_in"][moved + v, 0], expert["W_in"][moved + v, 1] = big, -big
    expert["W_out"][0, feat], expert["W_out"][1, feat] = 2.0, -2.0
    W_U = _weight(model, "unembed.W_U")
    W_U[feat] = 0.0
    W_U[feat, yes], W_U[feat, no] = 1.0, -1.0
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(4, 7, (N_PROMPTS,), generator=generator)
    small = torch.randint(1, 4, (N_PROMPTS,), generator=generator)
    y, z = torch.randint(1, 7, (2, N_PROMPTS), generator=generator)
    clean, corrupted = _prompts(x, y, z, end), _prompts(small, y, z, end)
    edges = (("input", "L0K0.v"), ("L0H0", "MLP0"), ("MLP0.E0", "logits"))
    notes = (
        "Two steps: L0H0 moves the first word to the last position, expert 0 turns it into the big-or-small feature "
        "(a ReLU: no linear read of the moved token gives it), the read-out reads the feature. Expert 1 runs on every "
        "other position and reaches the metric only through the background."
    )
    return GroundTruth("mlp-moe", "big-or-small", model, clean, corrupted, logit_diff_per_row(yes, no), edges, notes)


@torch.no_grad()
def distractor(dtype=torch.float64, seed: int = 0) -> GroundTruth:
    """``BOS X Y Z END`` predicts ``X`` through L0H0's OV (scale 2); L0H1 and L0H2 attend to the same word and write
    it +10 and -10 times: they cancel. Subspaces tok [0, 8), pos [8, 16), out [16, 24)."""
    V, tok, pos, out = 8, 0, 8, 16
    model = _decoder(dtype, seed, d_model=24, n_layers=2, n_heads=3, d_head=8, d_mlp=8, d_vocab=V)
    _one_hot_inputs(model, tok, pos)
    for head, scale in ((0, 2.0), (1, 10.0), (2, -10.0)):
        weights = _clear_head(model, 0, head, head)
        _attend_by_position(weights, pos, LENGTH - 1, 1)
        _copy_token(weights, tok, out, V, scale)
    edges = (("input", "L0K0.v"), ("L0H0", "logits"))
    notes = (
        "L0H1 and L0H2 have five times the true head's write each and cancel exactly: ablating both (the complement "
        "of the circuit) changes nothing, ablating either alone moves the metric by 40. Per-edge scores, patching "
        "one edge at a time included, credit them; only a joint view does not."
    )
    return _copy_truth("distractor", model, seed, V, out, edges, notes)


BUILDERS = {"induction": induction, "copy-gqa": copy_gqa, "mlp-moe": mlp_moe, "distractor": distractor}

__all__ = ["BUILDERS", "copy_gqa", "distractor", "induction", "mlp_moe"]

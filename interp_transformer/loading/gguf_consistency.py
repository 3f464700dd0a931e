"""A GGUF file's header checked against its tensors, before any config or model is built from it.

llama.cpp's metadata repeats what the tensor shapes already say: ``embedding_length`` is
``token_embd``'s width, ``block_count`` the number of ``blk.N`` blocks, ``head_count`` times
the head size the rows of ``attn_q``, ``feed_forward_length`` the columns of ``ffn_down`` ...
A header that disagrees with its tensors is a damaged or edited file. Built as it stands it
fails deep inside ``transformers`` (its config validators raise their own error class), or,
for a ``block_count`` of 10^9, builds layers for minutes before any shape is compared.
``check_header`` compares every field the reader takes from the metadata with what the
tensors imply, and raises a ``ValueError`` naming the file, the field, its value and the
value the tensors imply. It reads only the tensor table (names and shapes).

What the tensors cannot say is not checked here: ``context_length`` (but for GPT-2's
``position_embd``), norm epsilons, rotary bases and scaling, sliding windows, and GPT-2's
head count (its fused q/k/v has ``3 * d_model`` rows whatever the count).
"""

import builtins
import itertools
from typing import Any

from interp_transformer.families.gguf_entry import BLOCK_NAME, metadata_int
from interp_transformer.loading.gguf_format import GGUFHeader

_LISTED = 10  # block numbers and tensor names listed in a message


def _listing(items: list) -> str:
    return str(items) if len(items) <= _LISTED else f"{str(items[:_LISTED])[:-1]}, ...] ({len(items)} in all)"


class _Header:
    """The metadata and tensor shapes of one file, and errors that name them."""

    def __init__(self, header: GGUFHeader, arch: str):
        self.path, self.metadata, self.tensors, self.arch = header.path, header.metadata, header.tensors, arch

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.metadata

    def int(self, name: str, default: int | None = None) -> int:
        return metadata_int(self.metadata, self.key(name), default)

    def shape(self, tensor: str) -> tuple[builtins.int, ...] | None:  # int is the method above in this class
        info = self.tensors.get(tensor)
        return None if info is None else info.shape

    def contradiction(self, name: str, value: Any, evidence: str, implied: builtins.int | None = None) -> ValueError:
        hint = "" if implied is None else f"; the tensors imply {name}={implied}"
        return ValueError(
            f"{self.path}: GGUF metadata {self.key(name)}={value!r} contradicts the tensors: {evidence}{hint}"
        )


def _quotient(total: int, part: int) -> int | None:
    return total // part if part and total % part == 0 else None


def check_header(header: GGUFHeader, arch: str) -> None:
    """``ValueError`` naming the first metadata field of ``header`` that its tensor shapes contradict.

    Checks the blocks first (``block_count`` against the ``blk.N`` present, numbered
    ``0 .. N-1``, each holding the same tensors), so an absurd count is refused at once;
    then the widths, heads and head size, MLP and expert widths, and GPT-2's positions.
    Fields the file lacks are left to the reader, which names a missing required one.
    """
    file = _Header(header, arch)
    _check_blocks(file)
    hidden = _check_embedding(file)
    if hidden is not None:
        _check_attention(file, hidden)
    _check_feed_forward(file)
    _check_experts(file)
    positions = file.shape("position_embd.weight")
    if positions is not None and file.has("context_length") and file.int("context_length") != positions[0]:
        evidence = f"position_embd.weight has {positions[0]} rows, one per position"
        raise file.contradiction("context_length", file.int("context_length"), evidence, positions[0])


def _check_blocks(file: _Header) -> None:
    blocks: dict[str, set[str]] = {}
    for name in file.tensors:
        match = BLOCK_NAME.fullmatch(name)
        if match:
            blocks.setdefault(match.group(1), set()).add(f"{match.group(2)}.{match.group(3)}")
    odd = sorted(number for number in blocks if str(int(number)) != number)
    if odd:
        raise ValueError(f"{file.path}: blocks are numbered blk.0, blk.1, ...; the file holds blk.{odd[0]}")
    numbers = sorted(int(number) for number in blocks)
    if numbers != list(range(len(numbers))):
        present = set(numbers)
        missing = list(itertools.islice((i for i in range(numbers[-1]) if i not in present), _LISTED))
        raise ValueError(
            f"{file.path}: the file's {len(numbers)} blocks must be numbered from 0 without gaps, as blocks "
            f"blk.0 .. blk.{len(numbers) - 1}, but it holds {_listing(numbers)}; missing {missing}"
        )
    count = file.int("block_count")
    if count != len(numbers):
        held = {0: "no blk.N tensors", 1: "one block, blk.0"}.get(
            len(numbers), f"blocks blk.0 .. blk.{len(numbers) - 1}"
        )
        raise file.contradiction("block_count", count, f"the file holds {held}", len(numbers))
    every = set().union(*blocks.values())
    for number in map(str, numbers):
        lacking = sorted(every - blocks[number])
        if lacking:
            holder = next(str(other) for other in numbers if lacking[0] in blocks[str(other)])
            raise ValueError(
                f"{file.path}: blk.{number} lacks {_listing(lacking)}, which blk.{holder} holds: every block of a "
                "GGUF model holds the same tensors"
            )


def _check_embedding(file: _Header) -> int | None:
    """``d_model``, checked against ``token_embd``, and the vocabulary size; None without ``token_embd`` (the
    reader names it)."""
    embed = file.shape("token_embd.weight")
    if embed is None:
        return None
    hidden = file.int("embedding_length")
    if hidden != embed[-1]:
        evidence = f"token_embd.weight has shape {list(embed)}, one row of d_model values per token"
        raise file.contradiction("embedding_length", hidden, evidence, embed[-1])
    vocab = file.metadata.get(file.key("vocab_size"), embed[0])
    if vocab != embed[0]:
        raise file.contradiction("vocab_size", vocab, f"token_embd.weight has {embed[0]} rows, one per token", embed[0])
    return hidden


def _check_attention(file: _Header, hidden: int) -> None:
    """``head_count``, ``head_count_kv``, ``key_length`` and ``value_length`` against the rows of ``attn_q`` /
    ``attn_k`` / ``attn_v`` (or the fused ``attn_qkv`` and the columns of ``attn_output``) and ``attn_q_norm``."""
    heads = file.int("attention.head_count")
    kv_heads = file.int("attention.head_count_kv", heads)
    query, key, value = (file.shape(f"blk.0.attn_{part}.weight") for part in ("q", "k", "v"))
    fused, output, q_norm = (file.shape(f"blk.0.{part}.weight") for part in ("attn_qkv", "attn_output", "attn_q_norm"))
    # n_heads * d_head: the query rows, or the output projection's columns where q/k/v are fused
    query_width = query[0] if query else (output[-1] if output else None)
    query_what = "blk.0.attn_q.weight has {} rows" if query else "blk.0.attn_output.weight has {} columns"
    # where the file says d_head other than through key_length: the q/k norms' length, or the rotary dimensions
    # (all of each head rotates in every architecture read here)
    if q_norm is not None:
        witness, witness_what = q_norm[0], f"blk.0.attn_q_norm.weight has {q_norm[0]} entries, one per head dimension"
    elif file.has("rope.dimension_count") and not file.has("attention.key_length"):
        witness = file.int("rope.dimension_count")
        witness_what = f"{file.key('rope.dimension_count')}={witness} rotates every dimension of a head"
    else:
        witness, witness_what = None, ""
    implied_heads = _quotient(query_width, witness) if query_width and witness else None

    if file.has("attention.key_length"):
        d_head = file.int("attention.key_length")
        source = f"d_head={d_head} ({file.key('attention.key_length')})"
        if q_norm is not None and q_norm[0] != d_head:
            raise file.contradiction("attention.key_length", d_head, witness_what, q_norm[0])
    else:
        if hidden % heads:
            evidence = (
                f"without {file.key('attention.key_length')} a head has embedding_length / head_count dimensions, "
                f"and {hidden} is no multiple of {heads}"
            )
            raise file.contradiction("attention.head_count", heads, evidence, implied_heads)
        d_head = hidden // heads
        source = f"d_head = embedding_length {hidden} / head_count {heads} = {d_head} (the file has no key_length)"
    # the rows holding keys (and values, where fused): n_kv_heads * d_head each
    if key is not None:
        kv_rows, kv_parts, kv_what = key[0], 1, f"blk.0.attn_k.weight has {key[0]} rows, n_kv_heads × d_head"
    elif fused is not None:
        kv_what = f"blk.0.attn_qkv.weight has {fused[0]} rows, (n_heads + 2 n_kv_heads) × d_head"
        kv_rows, kv_parts = fused[0] - heads * d_head, 2
    else:
        kv_rows, kv_parts, kv_what = None, 1, ""
    fits = query_width in (None, heads * d_head) and kv_rows in (None, kv_parts * kv_heads * d_head)
    # a rotary dimension count other than d_head with a header that fits the tensors is a partial rotary, refused
    # by the reader as such; with one that does not, the head count is what is off
    if not file.has("attention.key_length") and witness not in (None, d_head) and (q_norm is not None or not fits):
        raise file.contradiction("attention.head_count", heads, f"{source}, but {witness_what}", implied_heads)
    if query_width not in (None, heads * d_head):
        evidence = f"{query_what.format(query_width)}, n_heads × d_head with {source}"
        raise file.contradiction("attention.head_count", heads, evidence, _quotient(query_width, d_head))
    if kv_rows not in (None, kv_parts * kv_heads * d_head):
        implied = _quotient(kv_rows, kv_parts * d_head)
        raise file.contradiction("attention.head_count_kv", kv_heads, f"{kv_what} with {source}", implied)
    if value is not None and file.has("attention.value_length"):
        d_value = file.int("attention.value_length")
        if value[0] != kv_heads * d_value:
            evidence = f"blk.0.attn_v.weight has {value[0]} rows, n_kv_heads={kv_heads} × d_head"
            raise file.contradiction("attention.value_length", d_value, evidence, _quotient(value[0], kv_heads))


def _check_feed_forward(file: _Header) -> None:
    down = file.shape("blk.0.ffn_down.weight")
    if down is not None and file.has("feed_forward_length"):
        width = file.int("feed_forward_length")
        if width != down[-1]:
            evidence = f"blk.0.ffn_down.weight has shape {list(down)}, one column per MLP neuron"
            raise file.contradiction("feed_forward_length", width, evidence, down[-1])


def _check_experts(file: _Header) -> None:
    router, experts = file.shape("blk.0.ffn_gate_inp.weight"), file.shape("blk.0.ffn_down_exps.weight")
    shared = file.shape("blk.0.ffn_down_shexp.weight")
    if router is not None and file.has("expert_count") and file.int("expert_count") != router[0]:
        evidence = f"blk.0.ffn_gate_inp.weight (the router) has {router[0]} rows, one per expert"
        raise file.contradiction("expert_count", file.int("expert_count"), evidence, router[0])
    if experts is not None and file.has("expert_feed_forward_length"):
        width = file.int("expert_feed_forward_length")
        if width != experts[-1]:
            evidence = f"blk.0.ffn_down_exps.weight has shape {list(experts)} (experts, d_model, expert width)"
            raise file.contradiction("expert_feed_forward_length", width, evidence, experts[-1])
    if shared is not None and file.has("expert_shared_feed_forward_length"):
        width = file.int("expert_shared_feed_forward_length")
        if width != shared[-1]:
            evidence = f"blk.0.ffn_down_shexp.weight has shape {list(shared)}, one column per shared-expert neuron"
            raise file.contradiction("expert_shared_feed_forward_length", width, evidence, shared[-1])


__all__ = ["check_header"]

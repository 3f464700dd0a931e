"""The gallery's classic designs written from scratch in plain PyTorch: the references ``test_gallery`` checks against.

None of these knows about ``interp_transformer``. Reused from elsewhere: nanoGPT and the
Annotated-Transformer decoder (``own_model_references``), the post-norm decoder of
``nn.TransformerEncoderLayer``s (``test_toy_architecture``). Written here:

- ``PostNormGPT``: nanoGPT's parts with the original Transformer's block order, no final norm;
- ``TorchEncoderLM``: a bidirectional ``nn.TransformerEncoderLayer`` stack with a linear MLM read-out,
  pre-norm (with a final norm) or post-norm (without), and ``TorchCausalStack``: the post-norm one,
  causal, with ``nn.TransformerEncoder``'s final norm;
- ``TinyBert``: token, position and segment embeddings, their LayerNorm, post-norm layers, BERT's MLM head;
- ``TorchSeq2Seq``: ``nn.Transformer`` between sinusoidal embeddings, one shared token embedding or one per side
  (each of its own vocabulary), or one learned position table read by both sides;
- ``ScratchT5``: T5's encoder-decoder: pre-RMSNorm blocks without biases, unscaled scores, no positions but a
  bucketed relative bias per stack;
- ``ScratchDecoder``: a pre-norm decoder whose norm, attention and MLP are given as parts, with the parts
  ``RMSNorm``, ``RotaryEmbedding``, ``SwiGLU``, ``RouterMoE``, ``ALiBiBias`` and ``ClippedRelativeBias``;
- ``arena``'s ``DemoTransformer``: ARENA's transformer from scratch, its weights named ``W_Q``, ``W_in``, ...

Fixed tables (sinusoids, rotary angles) are computed as stored checkpoints compute them: the
sinusoids in float64 and kept in float32, the rotary angles in float32.
"""

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .own_model_references import CausalSelfAttention, NanoLayerNorm, NanoMLP


def sinusoid_table(n_ctx: int, d_model: int, interleaved: bool) -> torch.Tensor:
    """``sin``/``cos`` of ``p * 10000^(-2i/d_model)``: alternating, or all sines then all cosines (float32)."""
    angles = torch.arange(n_ctx, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model
    )
    if interleaved:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(n_ctx, d_model)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return table.float()


def causal_mask(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool))


# --- GPT-2 with post-norm blocks ---------------------------------------------------------------------------------
class PostNormBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn, self.ln_1 = CausalSelfAttention(config), NanoLayerNorm(config.n_embd, bias=True)
        self.mlp, self.ln_2 = NanoMLP(config), NanoLayerNorm(config.n_embd, bias=True)

    def forward(self, x):
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class PostNormGPT(nn.Module):
    """nanoGPT's embeddings, attention and MLP in post-norm blocks, read out by an untied ``lm_head``."""

    def __init__(self, config):
        super().__init__()
        self.wte, self.wpe = (
            nn.Embedding(config.vocab_size, config.n_embd),
            nn.Embedding(config.block_size, config.n_embd),
        )
        self.h = nn.ModuleList([PostNormBlock(config) for _ in range(config.n_layer)])
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(x)


# --- stacks of nn.TransformerEncoderLayer ------------------------------------------------------------------------
class TorchEncoderLM(nn.Module):
    """Masked language model: learned positions, bidirectional layers, a final norm when pre-norm, a linear head."""

    def __init__(self, vocab=23, n_ctx=12, d_model=16, n_heads=4, d_mlp=32, n_layers=2, norm_first=True):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(n_ctx, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, d_mlp, 0.0, "gelu", batch_first=True, norm_first=norm_first)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class TorchCausalStack(nn.Module):
    """A post-norm stack with a final norm: ``nn.TransformerEncoder(..., norm=LayerNorm)`` under a causal mask."""

    def __init__(self, vocab=23, n_ctx=12, d_model=16, n_heads=4, d_mlp=32, n_layers=2, eps=1e-6):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(n_ctx, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_mlp, 0.0, batch_first=True, layer_norm_eps=eps)
        self.stack = nn.TransformerEncoder(layer, n_layers, norm=nn.LayerNorm(d_model, eps), enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], dtype=x.dtype)
        return self.head(self.stack(x, mask=mask, is_causal=True))


class TinyBert(nn.Module):
    """BERT: summed token, position and segment embeddings, their LayerNorm, post-norm layers, the MLM head."""

    def __init__(self, vocab=23, n_ctx=12, d_model=16, n_heads=4, d_mlp=32, n_layers=2, eps=1e-12):
        super().__init__()
        self.word, self.position, self.segment = (nn.Embedding(n, d_model) for n in (vocab, n_ctx, 2))
        self.embed_norm = nn.LayerNorm(d_model, eps)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, d_mlp, 0.0, "gelu", eps, batch_first=True)
            for _ in range(n_layers)
        )
        self.dense, self.head_norm, self.decoder = (
            nn.Linear(d_model, d_model),
            nn.LayerNorm(d_model, eps),
            nn.Linear(d_model, vocab),
        )

    def forward(self, tokens, attention_mask, token_type_ids):
        x = self.word(tokens) + self.position(torch.arange(tokens.shape[1])) + self.segment(token_type_ids)
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=attention_mask == 0)
        return self.decoder(self.head_norm(F.gelu(self.dense(x))))


class TorchSeq2Seq(nn.Module):
    """``nn.Transformer`` (its encoder's and decoder's final norms included) between scaled token embeddings plus
    one sinusoidal table, and a linear read-out; one token embedding for both sides, or one each."""

    def __init__(
        self,
        vocab=23,
        n_ctx=12,
        d_model=16,
        n_heads=4,
        d_mlp=32,
        norm_first=False,
        separate=False,
        interleaved=False,
        source_vocab=None,
        learned=False,
    ):
        super().__init__()
        self.src_embed = nn.Embedding(source_vocab or vocab, d_model)
        self.tgt_embed = nn.Embedding(vocab, d_model) if separate else self.src_embed
        self.pos = nn.Embedding(n_ctx, d_model) if learned else None  # one table, read by both sides
        if not learned:
            self.register_buffer("pe", sinusoid_table(n_ctx, d_model, interleaved))
        with warnings.catch_warnings():  # a pre-norm encoder takes no nested tensors, and says so
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(
                d_model, n_heads, 2, 2, d_mlp, 0.0, batch_first=True, norm_first=norm_first
            )
        self.out, self.scale = nn.Linear(d_model, vocab), math.sqrt(d_model)

    def positions(self, n):
        return self.pos(torch.arange(n)) if self.pos is not None else self.pe[:n]

    def forward(self, source, target):
        src = self.src_embed(source) * self.scale + self.positions(source.shape[1])
        tgt = self.tgt_embed(target) * self.scale + self.positions(target.shape[1])
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1], dtype=src.dtype)
        return self.out(self.transformer(src, tgt, tgt_mask=mask, tgt_is_causal=True))


# --- T5's encoder-decoder -----------------------------------------------------------------------------------------
def t5_bucket(relative_position, bidirectional, n_buckets, max_distance):
    """Mesh TensorFlow's bucket of each ``key - query`` distance: exact below ``max_exact``, logarithmic above,
    the keys after the query in the upper half when bidirectional."""
    buckets = 0
    if bidirectional:
        n_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * n_buckets
        relative_position = relative_position.abs()
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = n_buckets // 2
    large = (
        max_exact
        + (
            torch.log(relative_position.float() / max_exact)
            / math.log(max_distance / max_exact)
            * (n_buckets - max_exact)
        ).long()
    )
    large = torch.min(large, torch.full_like(large, n_buckets - 1))
    return buckets + torch.where(relative_position < max_exact, relative_position, large)


class T5Bias(nn.Module):
    """One stack's table: a learned number per head and bucket, ``[1, head, query, key]``."""

    def __init__(self, n_heads, n_buckets, max_distance, bidirectional):
        super().__init__()
        self.table = nn.Embedding(n_buckets, n_heads)
        self.n_buckets, self.max_distance, self.bidirectional = n_buckets, max_distance, bidirectional

    def forward(self, n):
        position = torch.arange(n)
        relative = position[None, :] - position[:, None]
        buckets = t5_bucket(relative, self.bidirectional, self.n_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1)[None]


class T5Attention(nn.Module):
    """No biases, no 1/sqrt(d_head): ``softmax(q k^T + bias [+ causal mask]) v``; keys from ``memory`` if given."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.n_heads = n_heads

    def forward(self, x, memory=None, bias=None, causal=False):
        memory = x if memory is None else memory
        batch, n, _ = x.shape

        def heads(t):
            return t.view(batch, t.shape[1], self.n_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(memory)), heads(self.v(memory))
        scores = q @ k.transpose(-2, -1)
        if bias is not None:
            scores = scores + bias
        if causal:
            scores = scores.masked_fill(~causal_mask(n), float("-inf"))
        return self.o((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, n, -1))


class T5EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_mlp):
        super().__init__()
        self.norm1, self.attn, self.norm2 = RMSNorm(d_model), T5Attention(d_model, n_heads), RMSNorm(d_model)
        self.mlp = gelu_mlp(d_model, d_mlp, bias=False, activation=nn.ReLU())

    def forward(self, x, bias):
        x = x + self.attn(self.norm1(x), bias=bias)
        return x + self.mlp(self.norm2(x))


class T5DecoderLayer(T5EncoderLayer):
    def __init__(self, d_model, n_heads, d_mlp):
        super().__init__(d_model, n_heads, d_mlp)
        self.cross, self.norm3 = T5Attention(d_model, n_heads), RMSNorm(d_model)

    def forward(self, x, memory, bias):
        x = x + self.attn(self.norm1(x), bias=bias, causal=True)
        x = x + self.cross(self.norm2(x), memory)
        return x + self.mlp(self.norm3(x))


class ScratchT5(nn.Module):
    """T5: one token embedding, no positions, a bucketed relative bias per stack shared by its layers, pre-RMSNorm
    blocks without biases, unscaled scores, a final RMSNorm per stack, an untied read-out without bias."""

    def __init__(self, vocab=23, d_model=16, n_heads=4, d_mlp=32, n_layers=2, n_buckets=8, max_distance=20):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.encoder_bias = T5Bias(n_heads, n_buckets, max_distance, bidirectional=True)
        self.decoder_bias = T5Bias(n_heads, n_buckets, max_distance, bidirectional=False)
        self.encoder = nn.ModuleList(T5EncoderLayer(d_model, n_heads, d_mlp) for _ in range(n_layers))
        self.decoder = nn.ModuleList(T5DecoderLayer(d_model, n_heads, d_mlp) for _ in range(n_layers))
        self.encoder_norm, self.decoder_norm = RMSNorm(d_model), RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, source, target):
        x, bias = self.embed(source), self.encoder_bias(source.shape[1])
        for layer in self.encoder:
            x = layer(x, bias)
        memory = self.encoder_norm(x)
        y, bias = self.embed(target), self.decoder_bias(target.shape[1])
        for layer in self.decoder:
            y = layer(y, memory, bias)
        return self.head(self.decoder_norm(y))


# --- a pre-norm decoder of given parts ---------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d_model)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RotaryEmbedding(nn.Module):
    """Rotate the two halves of each head by ``p * base^(-2i/d_head)``; angles and cos/sin in float32."""

    def __init__(self, d_head, base=10000.0):
        super().__init__()
        self.inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2).float() / d_head))  # float32, not a buffer

    def forward(self, x):  # [batch, head, pos, d_head]
        angles = torch.arange(x.shape[2]).float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        first, second = x.chunk(2, dim=-1)
        return x * angles.cos().to(x.dtype) + torch.cat([-second, first], dim=-1) * angles.sin().to(x.dtype)


class ALiBiBias(nn.Module):
    """``-slope[h] * |i - j|``, ``[head, query, key]``."""

    def __init__(self, slopes):
        super().__init__()
        self.register_buffer("slopes", torch.tensor(slopes))

    def forward(self, n):
        position = torch.arange(n)
        return -self.slopes[:, None, None] * (position[:, None] - position[None, :]).abs()


class ClippedRelativeBias(nn.Module):
    """A learned number per head and key offset ``j - i``, the offset clipped to ``[-max_distance, max_distance]``."""

    def __init__(self, n_heads, max_distance):
        super().__init__()
        self.table, self.max_distance = nn.Embedding(2 * max_distance + 1, n_heads), max_distance

    def forward(self, n):
        position = torch.arange(n)
        offset = (position[None, :] - position[:, None]).clamp(-self.max_distance, self.max_distance)
        return self.table(offset + self.max_distance).permute(2, 0, 1)


class SelfAttention(nn.Module):
    """Four linear maps; ``softmax(q k^T * scale + bias)`` under a causal mask, over rotated q and k if asked."""

    def __init__(self, d_model, n_heads, bias=True, scale=None, score_bias=None, rotary=None):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=bias) for _ in range(4))
        self.n_heads, self.score_bias, self.rotary = n_heads, score_bias, rotary
        self.scale = 1 / math.sqrt(d_model // n_heads) if scale is None else scale

    def forward(self, x):
        batch, n, _ = x.shape
        q, k, v = (t(x).view(batch, n, self.n_heads, -1).transpose(1, 2) for t in (self.q, self.k, self.v))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        scores = q @ k.transpose(-2, -1) * self.scale
        if self.score_bias is not None:
            scores = scores + self.score_bias(n)
        pattern = scores.masked_fill(~causal_mask(n), float("-inf")).softmax(dim=-1)
        return self.o((pattern @ v).transpose(1, 2).reshape(batch, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_mlp):
        super().__init__()
        self.gate, self.up, self.down = (
            nn.Linear(*shape, bias=False) for shape in ((d_model, d_mlp),) * 2 + ((d_mlp, d_model),)
        )

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class RouterMoE(nn.Module):
    """Softmax over every expert, the top k kept and renormalised; each expert Linear-GELU-Linear."""

    def __init__(self, d_model, d_mlp, n_experts=4, top_k=2):
        super().__init__()
        self.router, self.top_k = nn.Linear(d_model, n_experts), top_k
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model)) for _ in range(n_experts)
        )

    def forward(self, x):
        weights, chosen = self.router(x).softmax(dim=-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for number, expert in enumerate(self.experts):
            weight = (weights * (chosen == number)).sum(dim=-1, keepdim=True)
            out = out + weight * expert(x)
        return out


class PreNormLayer(nn.Module):
    def __init__(self, norm1, attn, norm2, mlp):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ScratchDecoder(nn.Module):
    """``head(norm(layers(embed(tokens) [+ pos(positions)])))`` with pre-norm layers built by ``layer()``."""

    def __init__(self, layer, norm, vocab=23, n_ctx=12, d_model=16, n_layers=2, positions=True, head_bias=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(n_ctx, d_model) if positions else None
        self.layers = nn.ModuleList(layer() for _ in range(n_layers))
        self.norm, self.head = norm, nn.Linear(d_model, vocab, bias=head_bias)

    def forward(self, tokens):
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def gelu_mlp(d_model=16, d_mlp=32, bias=True, activation=None):
    return nn.Sequential(
        nn.Linear(d_model, d_mlp, bias=bias), activation or nn.GELU(), nn.Linear(d_mlp, d_model, bias=bias)
    )


# --- ARENA's transformer from scratch ----------------------------------------------------------------------------
class ArenaLayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.w, self.b, self.eps = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model)), eps

    def forward(self, residual):
        residual = residual - residual.mean(-1, keepdim=True)
        return residual / (residual.pow(2).mean(-1, keepdim=True) + self.eps).sqrt() * self.w + self.b


class ArenaAttention(nn.Module):
    IGNORE = -1e5  # ARENA's masked score: exp(-1e5) is 0

    def __init__(self, d_model, n_heads):
        super().__init__()
        d_head = d_model // n_heads
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.randn(n_heads, d_model, d_head) * 0.02) for _ in "qkv")
        self.W_O = nn.Parameter(torch.randn(n_heads, d_head, d_model) * 0.02)
        self.b_Q, self.b_K, self.b_V = (nn.Parameter(torch.zeros(n_heads, d_head)) for _ in "qkv")
        self.b_O = nn.Parameter(torch.zeros(d_model))

    def forward(self, normalized_resid_pre):
        q, k, v = (
            torch.einsum("bpd,hde->bphe", normalized_resid_pre, W) + b
            for W, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V))
        )
        attn_scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])
        attn_scores = attn_scores.masked_fill(~causal_mask(q.shape[1]), self.IGNORE)
        z = torch.einsum("bhqk,bkhe->bqhe", attn_scores.softmax(-1), v)
        return torch.einsum("bqhe,hed->bqd", z, self.W_O) + self.b_O


class ArenaMLP(nn.Module):
    def __init__(self, d_model, d_mlp):
        super().__init__()
        self.W_in, self.b_in = nn.Parameter(torch.randn(d_model, d_mlp) * 0.02), nn.Parameter(torch.zeros(d_mlp))
        self.W_out, self.b_out = nn.Parameter(torch.randn(d_mlp, d_model) * 0.02), nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        return F.gelu(x @ self.W_in + self.b_in, approximate="tanh") @ self.W_out + self.b_out


class ArenaBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_mlp):
        super().__init__()
        self.ln1, self.attn = ArenaLayerNorm(d_model), ArenaAttention(d_model, n_heads)
        self.ln2, self.mlp = ArenaLayerNorm(d_model), ArenaMLP(d_model, d_mlp)

    def forward(self, resid_pre):
        resid_mid = resid_pre + self.attn(self.ln1(resid_pre))
        return resid_mid + self.mlp(self.ln2(resid_mid))


class ArenaDemoTransformer(nn.Module):
    def __init__(self, d_vocab=23, n_ctx=12, d_model=16, n_heads=4, d_mlp=32, n_layers=2):
        super().__init__()
        self.W_E = nn.Parameter(torch.randn(d_vocab, d_model) * 0.02)
        self.W_pos = nn.Parameter(torch.randn(n_ctx, d_model) * 0.02)
        self.blocks = nn.ModuleList(ArenaBlock(d_model, n_heads, d_mlp) for _ in range(n_layers))
        self.ln_final = ArenaLayerNorm(d_model)
        self.W_U, self.b_U = nn.Parameter(torch.randn(d_model, d_vocab) * 0.02), nn.Parameter(torch.zeros(d_vocab))

    def forward(self, tokens):
        residual = self.W_E[tokens] + self.W_pos[: tokens.shape[1]]
        for block in self.blocks:
            residual = block(residual)
        return self.ln_final(residual) @ self.W_U + self.b_U

"""Decoders written from scratch the way tutorials write them, in plain PyTorch: the references of ``test_own_models``.

- ``NanoGPT``: GPT-2 as nanoGPT writes it (a fused ``c_attn``, exact ``nn.GELU``, LayerNorm
  with an optional bias, ``lm_head`` tied to ``wte``).
- ``AnnotatedLM``: a decoder-only language model in the Annotated Transformer's style
  (``Embeddings`` scaled by ``sqrt(d_model)``, interleaved ``PositionalEncoding``, pre-norm
  ``SublayerConnection``s around four-linear ``MultiHeadedAttention`` and a ReLU
  ``PositionwiseFeedForward``, its own LayerNorm dividing by the unbiased std plus eps, a
  final norm and a log-softmax ``Generator``).

The post-norm decoder built from ``nn.TransformerEncoderLayer`` is ``test_toy_architecture``'s
``TorchPostNormDecoder``. None of these knows about ``interp_transformer``.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


# --- nanoGPT ---------------------------------------------------------------------------------------------------
@dataclass
class NanoGPTConfig:
    block_size: int = 16
    vocab_size: int = 50
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    bias: bool = True


class NanoLayerNorm(nn.Module):
    """LayerNorm with an optional bias."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class NanoMLP(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class NanoBlock(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.ln_1 = NanoLayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = NanoLayerNorm(config.n_embd, bias=config.bias)
        self.mlp = NanoMLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([NanoBlock(config) for _ in range(config.n_layer)]),
                ln_f=NanoLayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# --- an Annotated-Transformer-style decoder --------------------------------------------------------------------------
@dataclass
class AnnotatedConfig:
    vocab: int = 50
    d_model: int = 32
    d_ff: int = 64
    h: int = 4
    N: int = 2
    max_len: int = 16


class AnnotatedLayerNorm(nn.Module):
    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.norm = AnnotatedLayerNorm(size)

    def forward(self, x, sublayer):
        return x + sublayer(self.norm(x))


def attention(query, key, value, mask):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h: int, d_model: int):
        super().__init__()
        self.d_k, self.h = d_model // h, h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])

    def forward(self, query, key, value, mask):
        nbatches = query.size(0)
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value))
        ]
        x, self.attn = attention(query, key, value, mask=mask)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](x)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.w_2(self.w_1(x).relu())


class DecoderOnlyLayer(nn.Module):
    def __init__(self, size: int, self_attn, feed_forward):
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.sublayer = nn.ModuleList([SublayerConnection(size) for _ in range(2)])

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Embeddings(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


class Generator(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x):
        return F.log_softmax(self.proj(x), dim=-1)


class AnnotatedLM(nn.Module):
    """``generator(norm(layers(embed(tokens) + pe)))``: log-probabilities of the next token."""

    def __init__(self, config: AnnotatedConfig):
        super().__init__()
        self.embed = nn.Sequential(
            Embeddings(config.d_model, config.vocab), PositionalEncoding(config.d_model, config.max_len)
        )
        self.layers = nn.ModuleList(
            [
                DecoderOnlyLayer(
                    config.d_model,
                    MultiHeadedAttention(config.h, config.d_model),
                    PositionwiseFeedForward(config.d_model, config.d_ff),
                )
                for _ in range(config.N)
            ]
        )
        self.norm = AnnotatedLayerNorm(config.d_model)
        self.generator = Generator(config.d_model, config.vocab)

    def forward(self, tokens):
        mask = torch.tril(torch.ones(tokens.size(1), tokens.size(1), dtype=torch.long, device=tokens.device))[None]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, mask)
        return self.generator(self.norm(x))


def perturb_(module: nn.Module, seed: int, scale: float = 0.2) -> nn.Module:
    """Move every parameter away from its init (in place): zero biases and unit norms would hide a wrong formula."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return module


__all__ = ["AnnotatedConfig", "AnnotatedLM", "NanoGPT", "NanoGPTConfig", "perturb_"]

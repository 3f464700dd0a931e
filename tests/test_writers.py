"""Each block's writer records rebuild what the block adds to the stream, and the one walk splits every family exactly.

The reference is the block itself: the cached output hook of every writer. Rebuilt from the
record alone (its units' writes, its bias write, its output norm with the cached scale), it
must equal that hook at float64 precision, for every block kind the library builds.
"""

import pytest
import torch

from analysis.readouts import attribution
from analysis.readouts import post_norm as encoder_attribution
from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.gptj.recipe import GPTJConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.families.opt.recipe import OPTPostNormConfig
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer, Seq2SeqConfig
from interp_transformer.parts.writers import StreamNorm, Writer, direct_path, direct_path_hooks, read_along

from .perturbed import perturb

SHAPE = dict(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=31, n_ctx=12)
ROTARY = dict(SHAPE, n_key_value_heads=2)
DECODERS = {
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "attn_only": lambda: TransformerConfig(**dict(SHAPE, d_mlp=None)),
    "llama_gqa": lambda: LlamaConfig(**ROTARY),
    "gemma2": lambda: GemmaConfig(**ROTARY, post_norms=True, final_softcap=5.0),
    "gpt_neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
    "gptj_shared_norm": lambda: GPTJConfig(**SHAPE, rotary_dim=2),
    "moe_shared_expert": lambda: MoEConfig(**dict(ROTARY, d_mlp=8), n_experts=4, experts_per_token=2, d_mlp_shared=8),
}
TOKENS = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])


def perturbed(model):
    return perturb(model, scale=0.2)


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request):
    model = perturbed(DemoTransformer(DECODERS[request.param](), dtype=torch.float64, seed=0))
    logits, cache = model.run_with_cache(TOKENS)
    return model, logits, cache


def rebuilt(writer: Writer, cache) -> torch.Tensor:
    """What ``writer`` adds to the stream, from its record alone."""
    at = cache.__getitem__
    part = writer.bias_write(at)
    if writer.units is not None:
        part = writer.units.writes(at(writer.units.hook)).sum(dim=-2) + part
    else:  # a mixture of experts: its experts' outputs weighted by the routing, rebuilt from the cached experts
        mixture = writer.part
        routing = torch.zeros(*TOKENS.shape, mixture.n_experts, dtype=torch.float64)
        routing.scatter_add_(-1, at(mixture.hook_expert_indices.name), at(mixture.hook_routing_weights.name))
        for number, expert in enumerate(mixture.experts):
            part = part + routing[..., number, None] * (at(expert.hook_post.name) @ expert.W_out)
        shared = mixture.shared_expert
        part = part + at(mixture.hook_shared_expert_gate.name) * (at(shared.hook_post.name) @ shared.W_out)
    return writer.to_stream(part, None if writer.output_norm is None else at(writer.scale_hook))


def test_every_writer_record_rebuilds_its_output_hook(decoder):
    model, _, cache = decoder
    if model.has_experts:
        for block in model.blocks:
            block.mlp.use_sparse_experts = False  # every expert's hooks fire on every token
        _, cache = model.run_with_cache(TOKENS)
    checked = 0
    for block in model.blocks:
        for writer in block.writers():
            torch.testing.assert_close(rebuilt(writer, cache), cache[writer.output], rtol=0, atol=1e-12)
            checked += 1
    assert checked == sum(name.endswith(("hook_attn_out", "hook_mlp_out")) for name in cache)


def test_the_walk_splits_the_logit_exactly(decoder):
    model, logits, cache = decoder
    result = attribution.direct_logit_attribution(cache, tokens=3, incorrect_tokens=5, pos=-1)
    uncapped = cache["logits_uncapped"] if model.logit_softcap is not None else logits
    torch.testing.assert_close(result.total(), uncapped[:, -1, 3] - uncapped[:, -1, 5], rtol=0, atol=1e-10)
    assert result.heads.shape == (2, 4, 2)


def test_the_stream_of_a_post_norm_block_names_its_norms():
    model = perturbed(DemoTransformer(OPTPostNormConfig(**SHAPE), dtype=torch.float64, seed=0))
    steps = model.blocks[0].stream()
    assert [s.sublayer if isinstance(s, Writer) else s.name for s in steps] == ["attn", "ln1", "mlp", "ln2"]
    assert isinstance(steps[1], StreamNorm) and steps[1].norm is model.blocks[0].ln1


def test_the_walk_on_a_post_norm_stack_reads_the_final_hidden_state():
    """Backwards through every frozen norm: the terms plus the embeddings equal h . d at every position."""
    model = perturbed(DemoTransformer(OPTPostNormConfig(**SHAPE), dtype=torch.float64, seed=0))
    _, cache = model.run_with_cache(TOKENS)
    final = cache[model.hook_names.final_residual_name(model.cfg.n_layers)]
    direction = torch.randn(final.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    layers, g = direct_path(model.blocks, direction, cache.__getitem__)
    total = sum(read_along(cache[model.act_name(name)], g) for name in model.hook_names.input_writers)
    for layer in layers:
        total = total + sum(t.whole for t in layer.writers) + sum(layer.norm_biases.values())
    torch.testing.assert_close(total, read_along(final, direction), rtol=0, atol=1e-10)
    assert set(direct_path_hooks(model.blocks)) <= set(cache.keys())


def test_the_encoder_decoder_has_cross_attention_writers_that_read_the_source():
    cfg = Seq2SeqConfig(**SHAPE, n_decoder_layers=2, pad_token_id=1, eos_token_id=2, decoder_start_token_id=3)
    model = EncoderDecoderTransformer(cfg, dtype=torch.float64, seed=0)
    writers = model.decoder.blocks[0].writers()
    assert [(w.sublayer, w.reads_source, w.units.letter) for w in writers] == [
        ("attn", False, "H"),
        ("cross_attn", True, "C"),
        ("mlp", False, "N"),
    ]
    assert model.has_cross_attention and not DemoTransformer(TransformerConfig(**SHAPE)).has_cross_attention


def test_the_encoder_split_is_the_same_walk():
    """The post-norm encoder's exact split is direct_path too: its heads are the walk's head units."""
    from .encoder_helpers import random_mlm

    model = random_mlm()[0]
    _, cache = model.run_with_cache(TOKENS % model.cfg.d_vocab)
    hidden = cache[model.hook_names.final_residual_name(model.cfg.n_layers)]
    result = encoder_attribution.encoder_direct_attribution(cache, hidden[0, 0])
    torch.testing.assert_close(result.total(), result.value, rtol=0, atol=1e-10)

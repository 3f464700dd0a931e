"""An architecture defined only here, from the library's parts, reaches every tool with no library edit.

The toy is a post-norm causal decoder, the original Transformer's block order (and
PyTorch's ``nn.TransformerEncoderLayer`` default): ``x = norm1(x + attn(x))``,
``x = norm2(x + mlp(x))``, with learned positions, a causal mask and no final norm.
It is described by a config class, a ``build`` function picking existing parts, its
capabilities and its hook-name table, registered for the test. The reference it is
verified against is PyTorch's own ``nn.TransformerEncoderLayer`` stack.
"""

from dataclasses import dataclass

import einops
import pytest
import torch
from torch import nn

from analysis.report import build_report
from interp_transformer import Capabilities, DemoTransformer
from interp_transformer.families import Architecture, DecoderParts, register, unregister
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames
from interp_transformer.parts import MLP, Attention, Embed, LayerNorm, NoNorm, PosEmbed, PostNormBlock, Unembed
from interp_transformer.verify import verify_against_module


@dataclass(frozen=True)
class PostNormDecoderConfig:
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_head: int = 8
    d_mlp: int = 48
    d_vocab: int = 40
    n_ctx: int = 16
    act_fn: str = "relu"
    layer_norm_eps: float = 1e-5
    init_range: float = 0.02


def build(cfg: PostNormDecoderConfig) -> DecoderParts:
    def block():
        norm = lambda: LayerNorm(cfg.d_model, cfg.layer_norm_eps)  # noqa: E731
        return PostNormBlock(Attention(cfg), norm(), MLP(cfg), norm())

    return DecoderParts(Embed(cfg), PosEmbed(cfg), [block() for _ in range(cfg.n_layers)], NoNorm(), Unembed(cfg))


TOY = Architecture(
    name="toy-post-norm-decoder",
    config_class=PostNormDecoderConfig,
    build=build,
    capabilities=lambda cfg: Capabilities(
        causal=True, norm_placement="post", final_norm=None, read_out="unembed", next_token_logits=True
    ),
    hook_names=HookNames(
        layer_keys={**BLOCK_HOOKS, "normalized_resid_post": "blocks.{layer}.hook_normalized_resid_post"},
        global_keys={"embed": "hook_embed", "pos_embed": "hook_pos_embed"},
        final_residual="blocks.{last}.hook_normalized_resid_post",
    ),
)
CFG = PostNormDecoderConfig()


@pytest.fixture(scope="module")
def toy():
    register(TOY)
    try:
        model = DemoTransformer(CFG, seed=0, dtype=torch.float64)
        with torch.no_grad():  # every weight away from its init, so a dropped bias or norm weight shows
            generator = torch.Generator().manual_seed(1)
            for param in model.parameters():
                param.add_(0.2 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
        yield model
    finally:
        unregister(TOY)


TOKENS = torch.tensor([[1, 7, 3, 9, 7, 3, 9, 2], [5, 4, 5, 4, 5, 4, 5, 4]])


class TorchPostNormDecoder(nn.Module):
    """The same model in plain PyTorch: ``nn.TransformerEncoderLayer`` blocks with a causal mask."""

    def __init__(self, cfg: PostNormDecoderConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.layers = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(
                    cfg.d_model,
                    cfg.n_heads,
                    cfg.d_mlp,
                    dropout=0.0,
                    activation="relu",
                    batch_first=True,
                    norm_first=False,
                    layer_norm_eps=cfg.layer_norm_eps,
                )
                for _ in range(cfg.n_layers)
            ]
        )
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.unembed(x)


def reference_of(model: DemoTransformer) -> TorchPostNormDecoder:
    """Our weights in PyTorch's layout: ``in_proj_weight`` is ``[(q k v) (head_index d_head), d_model]``."""
    reference = TorchPostNormDecoder(CFG).to(torch.float64)
    with torch.no_grad():
        reference.embed.weight.copy_(model.W_E)
        reference.pos.weight.copy_(model.W_pos)
        for block, layer in zip(model.blocks, reference.layers):
            attn = block.attn
            layer.self_attn.in_proj_weight.copy_(
                einops.rearrange(
                    torch.stack([attn.W_Q, attn.W_K, attn.W_V]),
                    "qkv head_index d_model d_head -> (qkv head_index d_head) d_model",
                )
            )
            layer.self_attn.in_proj_bias.copy_(
                einops.rearrange(
                    torch.stack([attn.b_Q, attn.b_K, attn.b_V]), "qkv head_index d_head -> (qkv head_index d_head)"
                )
            )
            layer.self_attn.out_proj.weight.copy_(
                einops.rearrange(attn.W_O, "head_index d_head d_model -> d_model (head_index d_head)")
            )
            layer.self_attn.out_proj.bias.copy_(attn.b_O)
            layer.linear1.weight.copy_(block.mlp.W_in.T)
            layer.linear1.bias.copy_(block.mlp.b_in)
            layer.linear2.weight.copy_(block.mlp.W_out.T)
            layer.linear2.bias.copy_(block.mlp.b_out)
            for ours, theirs in ((block.ln1, layer.norm1), (block.ln2, layer.norm2)):
                theirs.weight.copy_(ours.w)
                theirs.bias.copy_(ours.b)
        reference.unembed.weight.copy_(model.W_U.T)
        reference.unembed.bias.copy_(model.b_U)
    return reference


HOOK_MAP = {"hook_embed": "embed", "hook_pos_embed": "pos"}
for _layer in range(CFG.n_layers):
    HOOK_MAP.update(
        {
            f"blocks.{_layer}.hook_attn_out": f"layers.{_layer}.self_attn",
            f"blocks.{_layer}.ln1.hook_normalized": f"layers.{_layer}.norm1",
            f"blocks.{_layer}.mlp.hook_post": f"layers.{_layer}.linear2:input",
            f"blocks.{_layer}.hook_mlp_out": f"layers.{_layer}.linear2",
            f"blocks.{_layer}.hook_normalized_resid_post": f"layers.{_layer}",
        }
    )


@pytest.fixture
def slow_path_attention():
    """PyTorch's fused encoder-layer kernel skips the submodules whose outputs we compare: turn it off."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


def test_the_toy_is_built_from_parts_and_names_its_hooks(toy):
    assert toy.architecture is TOY and not toy.capabilities.additive_residual
    names = list(toy.hook_dict)
    assert "blocks.1.hook_normalized_resid_post" in names and "ln_final.hook_scale" not in names
    assert toy.act_name("normalized_resid_post", -1) == "blocks.1.hook_normalized_resid_post"


def test_verified_hook_by_hook_against_pytorchs_own_layers(toy, slow_path_attention):
    reference = reference_of(toy)
    report = verify_against_module(toy, reference, TOKENS, HOOK_MAP)
    assert report.within_tolerance, str(report)
    assert {row.hook for row in report.rows} == set(HOOK_MAP) | {"logits"}
    assert report.logits_max_diff < 1e-10
    with torch.no_grad():
        reference.layers[1].norm1.bias[3] += 0.1  # a real difference is found, and where
    broken = verify_against_module(toy, reference, TOKENS, HOOK_MAP)
    assert not broken.ok and broken.first_divergence == "blocks.1.ln1.hook_normalized"


def test_the_cache_tools_follow_its_capabilities(toy):
    _, cache = toy.run_with_cache(TOKENS)
    stack, labels = cache.accumulated_resid(return_labels=True)
    assert labels[-1] == "final_post" and torch.equal(stack[-1], cache["blocks.1.hook_normalized_resid_post"])
    for call in (
        cache.decompose_resid,
        lambda: cache.accumulated_resid(apply_ln=True),
        lambda: cache.logit_attrs(stack, 3),
    ):
        with pytest.raises(ValueError, match="post-norm"):
            call()
    heads = cache.stack_head_results(layer=1)  # each head's write still has its meaning
    torch.testing.assert_close(heads.sum(0) + toy.blocks[0].attn.b_O, cache["attn_out", 0], rtol=0, atol=1e-10)
    from interp_transformer.models import processing

    with pytest.raises(ValueError, match="post-norm"):
        processing.fold_ln(toy)


def test_the_report_shows_what_applies_and_says_what_does_not(toy):
    report = build_report(toy, TOKENS[:1], title="toy")
    keys = [section.key for section in report.sections]
    assert keys == [
        "model",
        "tokens",
        "interpretation",
        "omitted",
        "attention",
        "detectors",
        "circuits",
        "composition",
        "neurons",
    ]
    whats = [part["what"] for part in report["omitted"].data.parts]
    assert whats == [
        "next-token prediction, logit lens and direct logit attribution",
        "direct logit effect of the most active neuron (W_out W_U)",
    ]
    assert "post-LayerNorm" in report["omitted"].data.parts[0]["why"]
    assert report["detectors"].data.repeated_half_loss is not None  # causal, with next-token logits
    assert "induction" in report["detectors"].data.random
    assert "<section" in report.to_html()

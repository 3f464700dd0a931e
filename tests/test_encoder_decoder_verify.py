"""Encoder-decoders hook by hook against their references, with a padded source batch.

BART and Marian against Hugging Face (random configs, every parameter perturbed), in
float32 and float64; the pre-LayerNorm Transformer against PyTorch's own
``nn.Transformer(norm_first=True)``, into which our weights are copied.
"""

import math

import einops
import pytest
import torch
from torch import nn

from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer, Seq2SeqConfig
from interp_transformer.verify import verify_against_hf, verify_against_module

from .encoder_decoder_helpers import DECODER_INPUT, FAMILIES, SOURCE, SOURCE_MASK, converted, inputs

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}
RTOL = {torch.float32: 1e-6, torch.float64: 0.0}  # float32: T5's unscaled scores reach ~100, where 1e-4 is 1 ulp
NOT_MAPPED = ("hook_attn_scores",)  # Hugging Face masks with the dtype's minimum, not -inf: the scores differ there


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_hook_and_the_logits_match_hugging_face(family, dtype):
    ours, hf = converted(family, dtype)
    source, mask, decoder_input = inputs(family)
    report = verify_against_hf(
        ours,
        hf,
        source,
        attention_mask=mask,
        decoder_input=decoder_input,
        atol=TOLERANCE[dtype],
        rtol=RTOL[dtype],
        float64_recheck=False,
    )
    assert report.within_tolerance, report.first_divergence
    compared = {row.hook for row in report.rows}
    unmapped = sorted(name for name in ours.hook_dict if name not in compared)
    assert all(name.endswith(NOT_MAPPED) for name in unmapped), unmapped
    assert "logits" in compared and "decoder.blocks.1.cross_attn.hook_pattern" in compared
    assert report.real_positions == int(mask.sum())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_broken_conversion_is_caught(family):
    ours, hf = converted(family, torch.float64)
    source, mask, decoder_input = inputs(family)
    broken = EncoderDecoderTransformer(ours.cfg, dtype=torch.float64)
    broken.load_state_dict(ours.state_dict())
    with torch.no_grad():
        broken.decoder.blocks[1].cross_attn.W_V[0, 0, 0] += 1e-3  # a weight that reads the source
    report = verify_against_hf(
        broken, hf, source, attention_mask=mask, decoder_input=decoder_input, float64_recheck=False
    )
    assert report.first_divergence == "decoder.blocks.1.cross_attn.hook_v"


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_changes_no_real_token(family):
    ours, _ = converted(family, torch.float64)
    source, mask, decoder_input = inputs(family)
    padded = ours(source, decoder_input, attention_mask=mask)
    for row in range(source.shape[0]):
        length = int(mask[row].sum())
        alone = ours(source[row : row + 1, :length], decoder_input[row : row + 1])
        torch.testing.assert_close(padded[row : row + 1], alone, atol=1e-12, rtol=0)


# ---- the pre-LayerNorm Transformer against PyTorch's nn.Transformer ------------------------------

SEQ2SEQ = Seq2SeqConfig(
    d_model=32,
    n_layers=2,
    n_decoder_layers=2,
    n_heads=4,
    d_head=8,
    d_mlp=48,
    d_vocab=50,
    n_ctx=24,
    pad_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=3,
)


def original_positions(n_pos: int, d_model: int) -> torch.Tensor:
    """Vaswani et al.'s table: ``PE[p, 2i] = sin(p / 10000^(2i/d))``, ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``."""
    table = torch.zeros(n_pos, d_model, dtype=torch.float64)
    for p in range(n_pos):
        for i in range(d_model // 2):
            table[p, 2 * i] = math.sin(p / 10000 ** (2 * i / d_model))
            table[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / d_model))
    return table


class TorchTransformer(nn.Module):
    """Token embedding * sqrt(d_model) + positions, ``nn.Transformer(norm_first=True)``, a linear read-out."""

    def __init__(self, model: EncoderDecoderTransformer, decoder_input: torch.Tensor, source_mask: torch.Tensor):
        super().__init__()
        cfg = model.cfg
        self.transformer = nn.Transformer(
            cfg.d_model,
            cfg.n_heads,
            cfg.n_layers,
            cfg.n_decoder_layers,
            cfg.d_mlp,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            layer_norm_eps=cfg.layer_norm_eps,
        )
        self.W_E, self.W_U, self.b_U = (nn.Parameter(t.detach().clone()) for t in (model.W_E, model.W_U, model.b_U))
        self.positions = original_positions(cfg.n_ctx, cfg.d_model).to(torch.float32)
        self.decoder_input, self.padding = decoder_input, source_mask == 0
        self.to(torch.float64)
        with torch.no_grad():
            for ours, theirs in ((model.encoder, self.transformer.encoder), (model.decoder, self.transformer.decoder)):
                for block, layer in zip(ours.blocks, theirs.layers):
                    attentions = [(block.attn, layer.self_attn)]
                    if hasattr(layer, "multihead_attn"):
                        attentions.append((block.cross_attn, layer.multihead_attn))
                    for attn, mha in attentions:
                        qkv = [
                            einops.rearrange(w, "head_index d_model d_head -> (head_index d_head) d_model")
                            for w in (attn.W_Q, attn.W_K, attn.W_V)
                        ]
                        mha.in_proj_weight.copy_(torch.cat(qkv))
                        mha.in_proj_bias.copy_(torch.cat([b.flatten() for b in (attn.b_Q, attn.b_K, attn.b_V)]))
                        mha.out_proj.weight.copy_(
                            einops.rearrange(attn.W_O, "head_index d_head d_model -> d_model (head_index d_head)")
                        )
                        mha.out_proj.bias.copy_(attn.b_O)
                    norms = ("ln1", "ln2", "ln3") if hasattr(layer, "norm3") else ("ln1", "ln2")
                    for ours_norm, theirs_norm in zip(norms, ("norm1", "norm2", "norm3")):
                        getattr(layer, theirs_norm).weight.copy_(getattr(block, ours_norm).w)
                        getattr(layer, theirs_norm).bias.copy_(getattr(block, ours_norm).b)
                    layer.linear1.weight.copy_(block.mlp.W_in.T)
                    layer.linear1.bias.copy_(block.mlp.b_in)
                    layer.linear2.weight.copy_(block.mlp.W_out.T)
                    layer.linear2.bias.copy_(block.mlp.b_out)
                theirs.norm.weight.copy_(ours.ln_final.w)
                theirs.norm.bias.copy_(ours.ln_final.b)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_E[tokens] * math.sqrt(self.W_E.shape[1]) + self.positions[: tokens.shape[1]].to(self.W_E.dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n_target = self.decoder_input.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(n_target, dtype=self.W_E.dtype)
        hidden = self.transformer(
            self.embed(tokens),
            self.embed(self.decoder_input),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=self.padding,
            memory_key_padding_mask=self.padding,
        )
        return hidden @ self.W_U + self.b_U


def torch_hook_map(cfg) -> dict[str, str]:
    mapping = {
        "encoder.ln_final.hook_normalized": "transformer.encoder.norm",
        "decoder.ln_final.hook_normalized": "transformer.decoder.norm",
        "encoder.blocks.0.hook_resid_pre": "transformer.encoder.layers.0:input",
        "decoder.blocks.0.hook_resid_pre": "transformer.decoder.layers.0:input",
    }
    for stack, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        for layer in range(n_layers):
            ours, theirs = f"{stack}.blocks.{layer}.", f"transformer.{stack}.layers.{layer}."
            mapping.update(
                {
                    ours + "ln1.hook_normalized": theirs + "norm1",
                    ours + "ln2.hook_normalized": theirs + "norm2",
                    ours + "hook_attn_out": theirs + "self_attn",
                    ours + "mlp.hook_pre": theirs + "linear1",
                    ours + "mlp.hook_post": theirs + "linear2:input",
                    ours + "hook_mlp_out": theirs + "linear2",
                    ours + "hook_resid_post": theirs.rstrip("."),
                }
            )
            if stack == "decoder":
                mapping.update(
                    {
                        ours + "ln3.hook_normalized": theirs + "norm3",
                        ours + "hook_cross_attn_out": theirs + "multihead_attn",
                    }
                )
    return mapping


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_the_pre_ln_transformer_matches_pytorchs_nn_transformer():
    model = EncoderDecoderTransformer(SEQ2SEQ, dtype=torch.float64, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    reference = TorchTransformer(model, DECODER_INPUT, SOURCE_MASK)
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused layer kernels skip the submodules the hooks read
    try:
        report = verify_against_module(
            model,
            reference,
            SOURCE,
            torch_hook_map(SEQ2SEQ),
            attention_mask=SOURCE_MASK,
            decoder_input=DECODER_INPUT,
            atol=1e-10,
            rtol=0.0,
            float64_recheck=False,
        )
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    assert report.within_tolerance, report.first_divergence
    assert len(report.rows) == len(torch_hook_map(SEQ2SEQ)) + 1


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_directory_loads_the_same_model(family, tmp_path):
    from interp_transformer.loading import from_pretrained

    ours, hf = converted(family, torch.float64)
    hf.save_pretrained(tmp_path)  # safetensors; tied tensors (and Marian's sinusoids) are not written
    loaded = from_pretrained(tmp_path, dtype=torch.float64)
    assert loaded.cfg.replace(name="") == ours.cfg.replace(name="")
    for name, tensor in ours.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name

"""Write the SAELens parity fixtures of interp_transformer.sae, with SAELens itself.

Runs inside the venv made by ``benchmarks/saelens_env.sh`` (SAELens pins a
TransformerLens whose typeguard cannot live beside interp_transformer's), so it
never imports interp_transformer. The tests read what it writes, and need no
SAELens::

    benchmarks/saelens_env.sh
    .venv-saelens/bin/python benchmarks/saelens_parity.py [--out tests/data/saelens]

What it writes, each SAE with random weights drawn from a fixed seed:

``<case>/cfg.json``, ``<case>/sae_weights.safetensors``
    One SAE of each architecture and normalization mode, saved by SAELens' own
    ``save_model`` (cfg format 6.x). Two ``legacy_*`` cases hold a flat config
    of the pre-6.0 format, written here the way old SAELens releases wrote it,
    which SAELens itself reads back (``SAE.load_from_disk``) to produce the
    expected outputs.
``<case>/expected.safetensors``
    ``x`` (the input), ``feature_acts = encode(x)``, ``decoded = decode(encode(x))``,
    ``decoded_edit = decode(encode(x) * edit_mask)`` (a few features zeroed, so
    decoding is checked away from the encoder's own output), ``edit_mask`` and
    ``forward = sae(x)``. ``encode`` runs again before each ``decode``: SAELens
    keeps the normalization statistics of the last ``encode`` for ``decode``.
``splice/expected.safetensors``, ``manifest.json``
    A tiny random ``HookedSAETransformer`` (its parameters filled, in sorted name
    order, from ``torch.Generator().manual_seed(MODEL_SEED)``, so that the tests
    rebuild the same weights in interp_transformer's model) run with some of the
    SAEs above spliced in: logits and cached SAE activations per case.

Sizes are small (d_in 16, d_sae 24) so that the fixtures stay a few KB each.
"""

import argparse
import importlib.metadata
import json
import shutil
import sys
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

warnings.filterwarnings("ignore")  # SAELens warns about model_from_pretrained_kwargs and deprecations

from sae_lens import (  # noqa: E402
    SAE,
    GatedSAE,
    GatedSAEConfig,
    HookedSAETransformer,
    JumpReLUSAE,
    JumpReLUSAEConfig,
    StandardSAE,
    StandardSAEConfig,
    TopKSAE,
    TopKSAEConfig,
)
from sae_lens.saes import (  # noqa: E402
    AbsTopKSAE,
    AbsTopKSAEConfig,
    JumpReLUSkipTranscoder,
    JumpReLUSkipTranscoderConfig,
    JumpReLUTranscoder,
    JumpReLUTranscoderConfig,
    SkipTranscoder,
    SkipTranscoderConfig,
    Transcoder,
    TranscoderConfig,
)
from sae_lens.saes.sae import SAEMetadata  # noqa: E402
from transformer_lens import HookedTransformerConfig  # noqa: E402

D_IN, D_SAE, D_OUT_OTHER = 16, 24, 12
# The model the SAEs splice into: d_model = D_IN, n_heads * d_head = D_IN (for hook_z).
MODEL_CFG = dict(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=32, d_vocab=20, n_ctx=8, act_fn="gelu_new")
MODEL_SEED = 1234
TRAINING_KWARGS = {"center_writing_weights": False}  # what SAELens' trainer records for a HookedTransformer

CLASSES = {
    "standard": (StandardSAE, StandardSAEConfig),
    "gated": (GatedSAE, GatedSAEConfig),
    "topk": (TopKSAE, TopKSAEConfig),
    "abstopk": (AbsTopKSAE, AbsTopKSAEConfig),
    "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig),
    "transcoder": (Transcoder, TranscoderConfig),
    "skip_transcoder": (SkipTranscoder, SkipTranscoderConfig),
    "jumprelu_transcoder": (JumpReLUTranscoder, JumpReLUTranscoderConfig),
    "jumprelu_skip_transcoder": (JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig),
}

# name -> (architecture, config fields, metadata, seed). Transcoders read ln2's output and
# write the MLP's output; SAELens refuses apply_b_dec_to_input for them.
TRANSCODER_HOOKS = {"hook_name": "blocks.0.ln2.hook_normalized", "hook_name_out": "blocks.0.hook_mlp_out"}
RESID_PRE_1, RESID_MID_1 = {"hook_name": "blocks.1.hook_resid_pre"}, {"hook_name": "blocks.1.hook_resid_mid"}
RESID_POST_0, RESID_POST_1 = {"hook_name": "blocks.0.hook_resid_post"}, {"hook_name": "blocks.1.hook_resid_post"}
CASES = {
    "standard": ("standard", {}, RESID_PRE_1, 1),
    "standard_no_b_dec_in": ("standard", {"apply_b_dec_to_input": False}, RESID_PRE_1, 2),
    "standard_constant_norm": ("standard", {"normalize_activations": "constant_norm_rescale"}, RESID_PRE_1, 3),
    "standard_layer_norm": ("standard", {"normalize_activations": "layer_norm"}, RESID_PRE_1, 4),
    "standard_expected_average": ("standard", {"normalize_activations": "expected_average_only_in"}, RESID_PRE_1, 5),
    "standard_hook_z": ("standard", {"reshape_activations": "hook_z"}, {"hook_name": "blocks.0.attn.hook_z"}, 6),
    "gated": ("gated", {}, RESID_MID_1, 7),
    "gated_layer_norm": ("gated", {"normalize_activations": "layer_norm"}, RESID_MID_1, 8),
    "topk": ("topk", {"k": 4}, RESID_POST_0, 9),
    "topk_rescaled": ("topk", {"k": 4, "rescale_acts_by_decoder_norm": True}, RESID_POST_0, 10),
    "topk_constant_norm": ("topk", {"k": 5, "normalize_activations": "constant_norm_rescale"}, RESID_POST_0, 11),
    "abstopk": ("abstopk", {"k": 4}, RESID_POST_0, 12),
    "jumprelu": ("jumprelu", {}, RESID_POST_1, 13),
    "jumprelu_layer_norm": ("jumprelu", {"normalize_activations": "layer_norm"}, RESID_POST_1, 14),
    "transcoder": ("transcoder", {"d_out": D_OUT_OTHER, "apply_b_dec_to_input": False}, TRANSCODER_HOOKS, 15),
    "transcoder_constant_norm": (
        "transcoder",
        {"d_out": D_IN, "apply_b_dec_to_input": False, "normalize_activations": "constant_norm_rescale"},
        TRANSCODER_HOOKS,
        16,
    ),
    "skip_transcoder": ("skip_transcoder", {"d_out": D_IN, "apply_b_dec_to_input": False}, TRANSCODER_HOOKS, 17),
    "jumprelu_transcoder": (
        "jumprelu_transcoder",
        {"d_out": D_IN, "apply_b_dec_to_input": False},
        TRANSCODER_HOOKS,
        18,
    ),
    "jumprelu_skip_transcoder": (
        "jumprelu_skip_transcoder",
        {"d_out": D_OUT_OTHER, "apply_b_dec_to_input": False},
        TRANSCODER_HOOKS,
        19,
    ),
}
# Pre-6.0 flat configs: (architecture written, extra flat fields, seed).
LEGACY_CASES = {
    "legacy_standard": ({"activation_fn_str": "relu", "normalize_activations": False}, 20),
    "legacy_topk": ({"activation_fn": "topk", "activation_fn_kwargs": {"k": 4}, "normalize_activations": "none"}, 21),
}


def randomize(sae, architecture: str, generator: torch.Generator) -> None:
    """Fill every parameter with random values, in sorted name order.

    Weights ~ N(0, 1/d_in) so pre-activations are O(1); biases ~ N(0, 0.3^2);
    JumpReLU thresholds ~ U(0, 1) so that some features pass and some do not;
    gated r_mag ~ N(0, 0.1^2); W_skip ~ N(0, 0.1^2).
    """
    with torch.no_grad():
        for name, param in sorted(sae.named_parameters()):
            shape = param.shape
            if name == "threshold":
                value = torch.rand(shape, generator=generator)
            elif name == "r_mag" or name == "W_skip":
                value = 0.1 * torch.randn(shape, generator=generator)
            elif name.startswith("W_"):
                value = torch.randn(shape, generator=generator) / shape[0] ** 0.5
            else:
                value = 0.3 * torch.randn(shape, generator=generator)
            param.copy_(value.to(param.dtype))


def make_input(cfg_fields: dict, generator: torch.Generator) -> torch.Tensor:
    """``[2, 3, d_in]`` (or ``[2, 3, n_heads, d_head]`` for hook_z), scaled and shifted so normalization matters."""
    if cfg_fields.get("reshape_activations") == "hook_z":
        shape = (2, 3, MODEL_CFG["n_heads"], MODEL_CFG["d_head"])
    else:
        shape = (2, 3, D_IN)
    return 3.0 * torch.randn(shape, generator=generator) + 0.5


def expected_outputs(sae, x: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        feature_acts = sae.encode(x)
        decoded = sae.decode(feature_acts)
        edit_mask = (torch.rand(feature_acts.shape[-1], generator=generator) > 0.25).to(feature_acts.dtype)
        decoded_edit = sae.decode(sae.encode(x) * edit_mask)
        forward = sae(x)
    return {
        "x": x,
        "feature_acts": feature_acts,
        "decoded": decoded,
        "edit_mask": edit_mask,
        "decoded_edit": decoded_edit,
        "forward": forward,
    }


def build_sae(name: str):
    architecture, fields, metadata, seed = CASES[name]
    sae_class, cfg_class = CLASSES[architecture]
    meta = SAEMetadata(
        model_name="tiny-random",
        prepend_bos=True,
        context_size=MODEL_CFG["n_ctx"],
        model_from_pretrained_kwargs=dict(TRAINING_KWARGS),
        **metadata,
    )
    cfg = cfg_class(d_in=D_IN, d_sae=D_SAE, metadata=meta, **fields)
    sae = sae_class(cfg)
    randomize(sae, architecture, torch.Generator().manual_seed(seed))
    return sae.eval(), fields, seed


def write_case(out: Path, name: str) -> dict:
    sae, fields, seed = build_sae(name)
    folder = out / name
    sae.save_model(folder)
    generator = torch.Generator().manual_seed(1000 + seed)
    x = make_input(fields, generator)
    save_file(expected_outputs(sae, x, generator), str(folder / "expected.safetensors"))
    return {"architecture": CASES[name][0], "fields": fields, "seed": seed}


def write_legacy_case(out: Path, name: str) -> dict:
    """A pre-6.0 flat config, read back by SAELens itself to produce the expected outputs."""
    extra, seed = LEGACY_CASES[name]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        "W_enc": torch.randn(D_IN, D_SAE, generator=generator) / D_IN**0.5,
        "b_enc": 0.3 * torch.randn(D_SAE, generator=generator),
        "W_dec": torch.randn(D_SAE, D_IN, generator=generator) / D_SAE**0.5,
        "b_dec": 0.3 * torch.randn(D_IN, generator=generator),
        "scaling_factor": torch.ones(D_SAE),  # old releases stored this; all ones means "unused"
    }
    save_file(tensors, str(folder / "sae_weights.safetensors"))
    cfg = {
        "model_name": "tiny-random",
        "hook_point": "blocks.1.hook_resid_pre",
        "hook_point_layer": 1,
        "hook_point_head_index": None,
        "d_in": D_IN,
        "d_sae": D_SAE,
        "dtype": "torch.float32",
        "device": "cpu",
        "context_size": MODEL_CFG["n_ctx"],
        "prepend_bos": True,
        "apply_b_dec_to_input": True,
        "finetuning_scaling_factor": False,
        "sae_lens_training_version": "3.13.0",
        "dataset_path": "tiny",
        **extra,
    }
    (folder / "cfg.json").write_text(json.dumps(cfg, indent=1))
    sae = SAE.load_from_disk(folder)
    x = make_input({}, torch.Generator().manual_seed(1000 + seed))
    save_file(
        expected_outputs(sae.eval(), x, torch.Generator().manual_seed(2000 + seed)),
        str(folder / "expected.safetensors"),
    )
    return {"architecture": sae.cfg.architecture(), "legacy": True, "seed": seed}


def build_model() -> HookedSAETransformer:
    cfg = HookedTransformerConfig(**MODEL_CFG, normalization_type="LN", positional_embedding_type="standard")
    model = HookedSAETransformer(cfg).eval()
    generator = torch.Generator().manual_seed(MODEL_SEED)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            leaf = name.rsplit(".", 1)[-1]
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if leaf == "w" else (0.3 * noise if leaf.startswith("W_") else 0.1 * noise))
    return model


def splice_cases(model: HookedSAETransformer) -> tuple[dict, dict]:
    """Logits (and cached SAE activations) of the model with SAEs spliced in, per case."""
    tokens = torch.tensor([[0, 5, 7, 3, 11, 2, 19], [0, 4, 4, 9, 0, 13, 6]])
    ablate = 3  # the feature zeroed through hook_sae_acts_post

    def zero_feature(acts, hook):
        acts = acts.clone()
        acts[..., ablate] = 0.0
        return acts

    saes = {name: build_sae(name)[0] for name in CASES}
    out: dict[str, torch.Tensor] = {"tokens": tokens, "clean_logits": model(tokens)}
    cases = {}

    def record(case: str, sae_name: str, use_error_term: bool, edit: bool = False, exclude=False, cache: bool = True):
        sae = saes[sae_name]
        write_hook = sae.cfg.metadata.hook_name_out or sae.cfg.metadata.hook_name
        acts_name = f"{write_hook}.hook_sae_acts_post"
        with torch.no_grad(), model.saes(saes=[sae], use_error_term=use_error_term, exclude_special_tokens=exclude):
            hooks = [(acts_name, zero_feature)] if edit else []
            with model.hooks(fwd_hooks=hooks):
                logits, cache_ = model.run_with_cache(tokens, names_filter=lambda n: "hook_sae" in n)
        out[f"{case}.logits"] = logits
        if cache:
            for key in ("hook_sae_acts_post", "hook_sae_output"):
                out[f"{case}.{key}"] = cache_[f"{write_hook}.{key}"]
        cases[case] = {
            "sae": sae_name,
            "use_error_term": use_error_term,
            "ablate_feature": ablate if edit else None,
            "exclude_special_tokens": exclude,
            "cache_prefix": write_hook,
        }

    record("resid", "standard", use_error_term=False)
    record("resid_error_ablate", "standard", use_error_term=True, edit=True)
    record("resid_error_clean", "standard_layer_norm", use_error_term=True)
    record("hook_z", "standard_hook_z", use_error_term=False)
    record("hook_z_error_ablate", "standard_hook_z", use_error_term=True, edit=True)
    record("transcoder", "jumprelu_transcoder", use_error_term=False)
    record("skip_transcoder_error_ablate", "skip_transcoder", use_error_term=True, edit=True)
    record("topk_exclude_bos", "topk", use_error_term=False, exclude=[0])
    record("gated_error_ablate", "gated", use_error_term=True, edit=True)
    return out, cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "data" / "saelens"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    torch.set_num_threads(1)
    for stale in list(out.glob("*")) if out.is_dir() else []:
        if stale.is_dir():
            shutil.rmtree(stale)
    out.mkdir(parents=True, exist_ok=True)

    manifest = {
        "versions": {name: importlib.metadata.version(name) for name in ("sae-lens", "transformer-lens", "torch")},
        "cases": {name: write_case(out, name) for name in CASES},
    }
    manifest["cases"].update({name: write_legacy_case(out, name) for name in LEGACY_CASES})

    model = build_model()
    expected, cases = splice_cases(model)
    (out / "splice").mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in expected.items()}, str(out / "splice" / "expected.safetensors"))
    manifest["splice"] = {
        "model_cfg": MODEL_CFG,
        "model_seed": MODEL_SEED,
        "model_parameters": sorted(name for name, _ in model.named_parameters()),
        "cases": cases,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(
        f"wrote {len(CASES) + len(LEGACY_CASES)} SAE fixtures and {len(cases)} splice cases to {out}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

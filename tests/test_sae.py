"""SAEs in SAELens' format: the math equals SAELens' (fixtures it wrote), loading is strict and safe."""

import json
import shutil

import einops
import pytest
import torch
from safetensors.torch import load_file, save_file

from interp_transformer.loading import CheckpointError
from interp_transformer.sae import ARCHITECTURES, SAE, SAEConfig

from .sae_helpers import FIXTURES, MANIFEST, SAE_CASES, fixture_sae, random_sae

PARITY_TOLERANCE = 1e-6


# --------------------------------------------------------------------------- parity with SAELens


@pytest.mark.parametrize("case", SAE_CASES)
def test_encode_decode_forward_equal_saelens(case):
    sae = fixture_sae(case)
    expected = load_file(FIXTURES / case / "expected.safetensors")
    x = expected["x"]
    with torch.no_grad():
        feature_acts = sae.encode(x)
        decoded = sae.decode(feature_acts)
        sae.encode(x)
        decoded_edit = sae.decode(feature_acts * expected["edit_mask"])
        forward = sae(x)
    for name, ours in (
        ("feature_acts", feature_acts),
        ("decoded", decoded),
        ("decoded_edit", decoded_edit),
        ("forward", forward),
    ):
        assert ours.shape == expected[name].shape, name
        assert (ours - expected[name]).abs().max() <= PARITY_TOLERANCE, name
    assert (feature_acts != 0).any() and (feature_acts == 0).any()  # a case where sparsity is exercised


def test_every_architecture_has_a_saelens_fixture():
    covered = {case["architecture"] for case in MANIFEST["cases"].values()}
    assert covered == set(ARCHITECTURES)
    normalizations = {
        case.get("fields", {}).get("normalize_activations", "none") for case in MANIFEST["cases"].values()
    }
    assert normalizations == {"none", "expected_average_only_in", "constant_norm_rescale", "layer_norm"}


def test_config_fields_are_read_from_both_generations():
    topk = fixture_sae("topk_rescaled").cfg
    assert (topk.architecture, topk.k, topk.rescale_acts_by_decoder_norm, topk.hook_name) == (
        "topk",
        4,
        True,
        "blocks.0.hook_resid_post",
    )
    transcoder = fixture_sae("transcoder").cfg
    assert (transcoder.d_in, transcoder.d_out, transcoder.hook_name_out) == (16, 12, "blocks.0.hook_mlp_out")
    assert transcoder.model_from_pretrained_kwargs == {"center_writing_weights": False}
    legacy = fixture_sae("legacy_topk").cfg  # flat pre-6.0 config: hook_point, activation_fn "topk"
    assert (legacy.architecture, legacy.k, legacy.hook_name, legacy.context_size) == (
        "topk",
        4,
        "blocks.1.hook_resid_pre",
        8,
    )
    assert fixture_sae("standard_hook_z").cfg.reshape_activations == "hook_z"


def test_legacy_config_defaults_follow_saelens():
    cfg = SAEConfig.from_dict(
        {"d_in": 4, "d_sae": 8, "hook_point": "blocks.0.attn.hook_z", "normalize_activations": True}
    )
    assert (cfg.architecture, cfg.reshape_activations, cfg.normalize_activations, cfg.apply_b_dec_to_input) == (
        "standard",
        "hook_z",
        "expected_average_only_in",
        True,
    )


# --------------------------------------------------------------------------- the math, against references


def test_standard_sae_is_relu_of_an_affine_map():
    sae = random_sae("standard", apply_b_dec_to_input=True)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        acts = torch.relu((x - sae.b_dec) @ sae.W_enc + sae.b_enc)
        assert torch.allclose(sae.encode(x), acts, atol=1e-6)
        assert torch.allclose(sae(x), acts @ sae.W_dec + sae.b_dec, atol=1e-6)


def test_jumprelu_zeroes_features_below_their_threshold():
    sae = random_sae("jumprelu")
    x = torch.randn(50, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        acts = sae.encode(x)
    gated_off = (pre > 0) & (pre <= sae.threshold)
    assert gated_off.any()  # the threshold matters in this case
    assert torch.equal(acts, torch.where(pre > sae.threshold, pre, torch.zeros_like(pre)))


def test_topk_keeps_the_relu_of_the_k_largest_pre_activations():
    sae = random_sae("topk", k=3)
    x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        sae.b_enc.sub_(torch.linspace(0, 3, 24))  # some positions then have fewer than k positive pre-activations
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        acts = sae.encode(x)
    kth_largest = pre.topk(3, dim=-1).values[..., -1:]
    assert torch.equal(acts, torch.where(pre >= kth_largest, pre.relu(), torch.zeros_like(pre)))
    assert ((pre >= kth_largest) & (pre < 0)).any()  # the ReLU matters here


def test_hook_z_sae_flattens_heads_like_a_plain_sae_on_the_flattened_input():
    hook_z = random_sae("standard", hook_name="blocks.0.attn.hook_z", reshape_activations="hook_z")
    plain = SAE(hook_z.cfg.replace(reshape_activations="none"), dict(hook_z.state_dict()))
    z = torch.randn(2, 5, 4, 4, generator=torch.Generator().manual_seed(4))  # [batch, pos, head_index, d_head]
    flat = einops.rearrange(z, "batch pos head_index d_head -> batch pos (head_index d_head)")
    with torch.no_grad():
        assert torch.equal(hook_z.encode(z), plain.encode(flat))
        out = hook_z(z)
        assert out.shape == z.shape
        assert torch.equal(
            out,
            einops.rearrange(plain(flat), "batch pos (head_index d_head) -> batch pos head_index d_head", head_index=4),
        )


def test_decode_needs_the_statistics_of_the_last_encode():
    sae = fixture_sae("standard_layer_norm")
    x = torch.randn(2, 3, 16)
    acts = sae.encode(x)
    sae.decode(acts)
    with pytest.raises(ValueError, match="call encode"):
        sae.decode(acts)  # SAELens, too, uses the statistics once
    sae.encode(x)
    with pytest.raises(ValueError, match="batch shape"):
        sae.decode(acts[:1])


def test_fold_activation_norm_scaling_factor_reads_unscaled_input_as_it_read_scaled_input():
    sae = random_sae("standard", normalize_activations="expected_average_only_in")
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before_acts, before_out = sae.encode(2.5 * x), sae(2.5 * x)
        sae.fold_activation_norm_scaling_factor(2.5)
        assert sae.cfg.normalize_activations == "none"
        assert torch.allclose(sae.encode(x), before_acts, atol=1e-5)
        assert torch.allclose(sae(x), before_out / 2.5, atol=1e-5)


def test_wrong_input_width_is_refused_with_the_expected_shape():
    sae = random_sae("standard")
    with pytest.raises(ValueError, match=r"d_in=16.*\[2, 15\]"):
        sae.encode(torch.zeros(2, 15))
    with pytest.raises(ValueError, match="d_sae=24"):
        sae.decode(torch.zeros(2, 16))
    with pytest.raises(TypeError, match="floating-point"):
        sae(torch.zeros(2, 16, dtype=torch.long))


def test_hook_points_fire_in_order_and_carry_saelens_names():
    sae = random_sae("standard")
    fired = []
    with sae.hooks([(lambda name: True, lambda t, hook: fired.append(hook.name))]):
        sae(torch.randn(2, 16))
    assert fired == ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_output"]


# --------------------------------------------------------------------------- loading: strict and safe


@pytest.fixture
def folder(tmp_path):
    target = tmp_path / "sae"
    shutil.copytree(FIXTURES / "jumprelu", target)
    return target


def _rewrite_weights(folder, change):
    tensors = load_file(folder / "sae_weights.safetensors")
    change(tensors)
    save_file(tensors, str(folder / "sae_weights.safetensors"))


def test_missing_unexpected_and_mis_shaped_tensors_are_listed(folder):
    def damage(tensors):
        del tensors["threshold"]
        tensors["W_dec"] = tensors["W_dec"][:, :15].contiguous()
        tensors["stray"] = torch.zeros(3)

    _rewrite_weights(folder, damage)
    listed = (
        r"missing 1 tensor\(s\): threshold.*unexpected 1 tensor\(s\): stray"
        r".*W_dec expected \[24, 16\] received \[24, 15\]"
    )
    with pytest.raises(CheckpointError, match=listed):
        SAE.load(folder)


def test_unknown_architecture_lists_the_known_ones(folder):
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["architecture"] = "jumprelu_v2"
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unknown SAE architecture 'jumprelu_v2'.*'standard', 'gated', 'topk'"):
        SAE.load(folder)


class _RunsCode:
    """Unpickling this object would create a file: the classic malicious checkpoint."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_unsafe_pickle_is_refused_without_running_its_code(folder, tmp_path):
    marker = tmp_path / "code_ran"
    tensors = load_file(folder / "sae_weights.safetensors")
    (folder / "sae_weights.safetensors").unlink()
    torch.save({**tensors, "evil": _RunsCode(marker)}, folder / "sae_weights.pt")
    with pytest.raises(ValueError, match="refusing to load"):
        SAE.load(folder)
    assert not marker.exists()
    torch.load(folder / "sae_weights.pt", weights_only=False)  # the payload is live: an unsafe load runs it
    assert marker.exists()
    torch.save(tensors, folder / "sae_weights.pt")  # a plain state dict in a pickle loads
    assert torch.equal(SAE.load(folder).threshold, tensors["threshold"])


def test_corrupt_and_missing_files_give_clear_errors(folder, tmp_path):
    weights = folder / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt"):
        SAE.load(folder)
    weights.unlink()
    with pytest.raises(ValueError, match="no SAE weights"):
        SAE.load(folder)
    (folder / "cfg.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        SAE.load(folder)
    with pytest.raises(ValueError, match="no cfg.json"):
        SAE.load(tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"architecture": "transcoder", "d_out": 16, "apply_b_dec_to_input": True},
            "apply_b_dec_to_input must be false",
        ),
        ({"normalize_activations": "covariance_whitening"}, "fold it first"),
        ({"architecture": "batchtopk"}, "training checkpoint"),
        ({"d_sae": 0}, "d_sae must be a positive int"),
        ({"architecture": "topk", "k": 30}, "k=30 must be at most d_sae=24"),
        ({"reshape_activations": "hook_z"}, "needs a hook_z hook"),
    ],
)
def test_invalid_configs_are_refused(change, message):
    metadata = {"hook_name": "blocks.0.hook_resid_pre", "sae_lens_version": "6.1.0"}
    cfg = {"architecture": "standard", "d_in": 16, "d_sae": 24, "metadata": metadata}
    with pytest.raises(ValueError, match=message):
        SAEConfig.from_dict({**cfg, **change})


def test_legacy_leftovers_are_read_as_saelens_reads_them():
    base = fixture_sae("jumprelu")
    tensors = {name: t.detach().clone() for name, t in base.state_dict().items()}
    tensors["log_threshold"] = tensors.pop("threshold").log()
    tensors["scaling_factor"] = torch.ones(24)
    sae = SAE.from_dict(base.cfg, tensors)
    assert torch.allclose(sae.threshold, base.threshold)
    with pytest.raises(ValueError, match="scaling_factor"):
        SAE.from_dict(base.cfg, {**tensors, "scaling_factor": torch.full((24,), 2.0)})
    with pytest.raises(ValueError, match="tanh-relu"):
        SAEConfig.from_dict(
            {"d_in": 4, "d_sae": 8, "hook_point": "blocks.0.hook_resid_pre", "activation_fn_str": "tanh-relu"}
        )


def test_save_then_load_round_trips_in_format_6(tmp_path):
    sae = fixture_sae("standard_hook_z")
    sae.register_buffer("sparsity", torch.linspace(-5, 0, 24), persistent=False)
    sae.save(tmp_path / "copy")
    cfg = json.loads((tmp_path / "copy" / "cfg.json").read_text())
    assert int(cfg["metadata"]["sae_lens_version"].split(".")[0]) >= 6 and cfg["architecture"] == "standard"
    loaded = SAE.load(tmp_path / "copy")
    assert loaded.cfg == sae.cfg and loaded.cfg.metadata == sae.cfg.metadata
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in sae.state_dict().items())
    assert torch.equal(loaded.sparsity, sae.sparsity)
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == [
        "cfg.json",
        "sae_weights.safetensors",
        "sparsity.safetensors",
    ]


def test_dtype_override_casts_the_weights(tmp_path):
    sae = SAE.load(FIXTURES / "gated", dtype="float64")
    assert sae.W_enc.dtype == torch.float64 and sae.cfg.dtype == torch.float64
    assert sae.encode(torch.randn(2, 16)).dtype == torch.float64
    moved = fixture_sae("gated").to(torch.float64)  # nn.Module.to: the SAE then runs in float64
    assert moved(torch.randn(2, 16)).dtype == torch.float64
    assert SAE.load(moved.save(tmp_path / "f64")).cfg.dtype == torch.float64

"""The configuration of an SAE or transcoder, read from SAELens' ``cfg.json`` (both generations).

SAELens writes two generations of ``cfg.json``:

format 6.x (``metadata.sae_lens_version`` >= 6)
    Model-independent fields at the top level (``architecture``, ``d_in``,
    ``d_sae``, ``dtype``, ``apply_b_dec_to_input``, ``normalize_activations``,
    ``reshape_activations``; ``k`` and ``rescale_acts_by_decoder_norm`` for
    top-k; ``d_out`` for transcoders) and everything about the model the SAE was
    trained on in ``metadata`` (``hook_name``, ``hook_name_out``,
    ``hook_head_index``, ``model_name``, ``prepend_bos``, ``context_size``,
    ``model_from_pretrained_kwargs``, ...).
older (no version, or one below 6)
    One flat dict: ``hook_point`` for ``hook_name`` (``hook_point_head_index``
    for ``hook_head_index``), ``activation_fn_str`` / ``activation_fn``
    (``"topk"`` with ``activation_fn_kwargs.k`` means a top-k SAE), and
    ``normalize_activations`` possibly a bool (``True`` meant
    ``expected_average_only_in``). Read as SAELens' ``handle_pre_6_0_config``
    reads it, except that an activation function SAELens 6 would silently
    replace by ReLU (``"tanh-relu"``, say) is refused.

Defaults are SAELens' dataclass defaults (``dtype="float32"``,
``apply_b_dec_to_input=True``, ``normalize_activations="none"``,
``reshape_activations="none"``, ``k=100``, ``d_out=768``): a field a file does
not write means what it means to SAELens. Fields SAELens does not know are
ignored, as SAELens ignores them.
"""

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from interp_transformer.sae.architectures import ARCHITECTURES, UNSUPPORTED_ARCHITECTURES, architecture_named

# Input normalizations SAELens runs at inference (see normalization.py for the math).
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
RESHAPES = ("none", "hook_z")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# The metadata keys SAELens keeps when it converts a pre-6.0 flat config.
LEGACY_METADATA_KEYS = (
    "model_name",
    "hook_name",
    "model_class_name",
    "hook_head_index",
    "model_from_pretrained_kwargs",
    "prepend_bos",
    "exclude_special_tokens",
    "neuronpedia_id",
    "context_size",
    "seqpos_slice",
    "dataset_path",
    "sae_lens_version",
    "sae_lens_training_version",
    "hook_name_out",
    "hook_head_index_out",
    "hf_hook_name",
    "hf_hook_name_out",
)
LEGACY_RENAMES = {
    "hook_point": "hook_name",
    "hook_point_head_index": "hook_head_index",
    "activation_fn_str": "activation_fn",
}
# written as metadata.sae_lens_version when a config carries none: SAELens reads it as format 6
FORMAT_VERSION = "6.0.0"


def parse_dtype(value: Any) -> torch.dtype:
    """``"float32"``, ``"torch.float32"`` or a ``torch.dtype`` -> the ``torch.dtype``."""
    if isinstance(value, torch.dtype):
        if value not in DTYPES.values():
            raise ValueError(f"SAE dtype must be one of {list(DTYPES)}, got {value}")
        return value
    name = value[len("torch.") :] if isinstance(value, str) and value.startswith("torch.") else value
    if name not in DTYPES:
        raise ValueError(f"SAE dtype must be one of {list(DTYPES)} (optionally 'torch.'-prefixed), got {value!r}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)


def _format_major(raw: Mapping[str, Any]) -> int | None:
    """The major SAELens version that wrote ``raw``, or None when it does not say."""
    metadata = raw.get("metadata")
    version = raw.get("sae_lens_version") or (
        metadata.get("sae_lens_version") if isinstance(metadata, Mapping) else None
    )
    if not version:
        return None
    try:
        return int(str(version).split(".")[0])
    except ValueError as error:
        raise ValueError(f"sae_lens_version must look like '6.1.0', got {version!r}") from error


def is_legacy_format(raw: Mapping[str, Any]) -> bool:
    """True for a pre-6.0 flat config (SAELens' rule: no version, or a version below 6).

    A config without a version but with a ``metadata`` mapping is read as format 6:
    SAELens would read it as flat and lose the metadata.
    """
    major = _format_major(raw)
    if major is None:
        return not isinstance(raw.get("metadata"), Mapping)
    return major < 6


def upgrade_legacy_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A pre-6.0 flat config rewritten in the 6.x layout (what SAELens' ``handle_pre_6_0_config`` does)."""
    flat = {LEGACY_RENAMES.get(key, key): value for key, value in raw.items()}
    activation = flat.get("activation_fn", "relu")
    architecture = flat.get("architecture", "standard")
    upgraded: dict[str, Any] = {}
    if activation == "topk":
        k = (flat.get("activation_fn_kwargs") or {}).get("k")
        if k is None:
            raise ValueError("a pre-6.0 config with activation_fn 'topk' needs activation_fn_kwargs.k")
        architecture, upgraded["k"] = "topk", k
    elif activation != "relu":
        raise ValueError(
            f"pre-6.0 config with activation_fn {activation!r}: only 'relu' and 'topk' can be read "
            "(SAELens 6 would run ReLU in its place)"
        )
    if flat.get("finetuning_scaling_factor"):
        raise ValueError(
            "pre-6.0 config with finetuning_scaling_factor=true: the decoder scaling it implies is not part "
            "of the format any more (SAELens 6 cannot load it either); fold it into W_dec first"
        )
    normalize = flat.get("normalize_activations")
    if isinstance(normalize, bool):
        normalize = "expected_average_only_in" if normalize else "none"
    hook_name = flat.get("hook_name") or ""
    upgraded.update(
        architecture=architecture,
        normalize_activations=normalize if normalize is not None else "none",
        apply_b_dec_to_input=flat.get("apply_b_dec_to_input", True),
        reshape_activations=flat.get("reshape_activations", "hook_z" if "hook_z" in hook_name else "none"),
        metadata={key: flat[key] for key in LEGACY_METADATA_KEYS if key in flat},
    )
    for key in ("d_in", "d_sae", "d_out", "dtype", "rescale_acts_by_decoder_norm"):
        if key in flat:
            upgraded[key] = flat[key]
    return upgraded


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"SAE config field {name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class SAEConfig:
    """What an SAE is: its architecture, sizes, input handling, and the model it was trained on.

    ``d_out`` is the width of what the SAE writes: ``d_in`` for an SAE, the
    output hook's width for a transcoder. ``metadata`` holds SAELens'
    ``metadata`` dict as read (the properties below give the fields splicing uses).
    """

    architecture: str  # one of ARCHITECTURES
    d_in: int  # width of the activation read (n_heads * d_head for hook_z SAEs)
    d_sae: int  # number of features
    d_out: int  # width of the activation written (d_in unless a transcoder)
    dtype: torch.dtype = torch.float32  # dtype the weights are stored and run in
    apply_b_dec_to_input: bool = True  # subtract b_dec from the input before encoding
    normalize_activations: str = "none"  # one of NORMALIZATIONS
    reshape_activations: str = "none"  # "hook_z": flatten [.., head_index, d_head] to d_in and back
    k: int | None = None  # features kept per position (top-k architectures only)
    rescale_acts_by_decoder_norm: bool = False  # top-k: rank features by pre * |W_dec[f]|
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        arch = architecture_named(self.architecture)
        for name in ("d_in", "d_sae", "d_out"):
            _positive_int(name, getattr(self, name))
        if not arch.transcoder and self.d_out != self.d_in:
            raise ValueError(
                f"a {self.architecture} SAE writes what it reads: d_out={self.d_out} must equal d_in={self.d_in}"
            )
        if self.normalize_activations not in NORMALIZATIONS:
            raise ValueError(
                f"normalize_activations must be one of {list(NORMALIZATIONS)}, got {self.normalize_activations!r}"
                + (
                    " (a whitening SAELens folds into the weights at the end of training: fold it first)"
                    if self.normalize_activations == "covariance_whitening"
                    else ""
                )
            )
        if self.reshape_activations not in RESHAPES:
            raise ValueError(f"reshape_activations must be one of {list(RESHAPES)}, got {self.reshape_activations!r}")
        if arch.top_k:
            if _positive_int("k", self.k) > self.d_sae:
                raise ValueError(f"k={self.k} must be at most d_sae={self.d_sae}")
        elif self.k is not None or self.rescale_acts_by_decoder_norm:
            raise ValueError(f"k and rescale_acts_by_decoder_norm belong to top-k SAEs, not to {self.architecture!r}")
        if arch.transcoder and self.apply_b_dec_to_input:
            raise ValueError("apply_b_dec_to_input must be false for a transcoder: its b_dec lives in the output space")
        if arch.transcoder and self.reshape_activations != "none":
            raise ValueError("transcoders do not reshape activations: reshape_activations must be 'none'")
        hook_name = self.hook_name
        if self.reshape_activations == "hook_z" and hook_name is not None and not hook_name.endswith("_z"):
            raise ValueError(f"reshape_activations='hook_z' needs a hook_z hook, got hook_name={hook_name!r}")
        if not isinstance(self.metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, got {type(self.metadata).__name__}")

    # --- the metadata splicing reads --------------------------------------------------
    @property
    def hook_name(self) -> str | None:
        """Where the SAE reads (and, unless a transcoder, writes), e.g. ``blocks.8.hook_resid_pre``."""
        return self.metadata.get("hook_name")

    @property
    def hook_name_out(self) -> str | None:
        """Where a transcoder writes (``None``: the SAE writes at ``hook_name``)."""
        return self.metadata.get("hook_name_out")

    @property
    def hook_head_index(self) -> int | None:
        """The one head an SAE on ``[..., head_index, d_head]`` activations reads, or None."""
        return self.metadata.get("hook_head_index")

    @property
    def model_from_pretrained_kwargs(self) -> dict[str, Any]:
        """Keyword arguments SAELens loads the training model with (see ``sae.processing``)."""
        return dict(self.metadata.get("model_from_pretrained_kwargs") or {})

    @property
    def prepend_bos(self) -> bool | None:
        return self.metadata.get("prepend_bos")

    @property
    def context_size(self) -> int | None:
        return self.metadata.get("context_size")

    @property
    def model_name(self) -> str | None:
        return self.metadata.get("model_name")

    # --- reading and writing ------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "SAEConfig":
        """Read a ``cfg.json`` dict of either generation (see the module docstring)."""
        if not isinstance(raw, Mapping):
            raise TypeError(f"an SAE config must be a dict (the contents of cfg.json), got {type(raw).__name__}")
        cfg = upgrade_legacy_config(raw) if is_legacy_format(raw) else dict(raw)
        missing = [key for key in ("architecture", "d_in", "d_sae") if key not in cfg]
        if missing:
            raise ValueError(f"SAE config is missing {missing}; it has {sorted(cfg)}")
        architecture = cfg["architecture"]
        if not isinstance(architecture, str) or architecture not in ARCHITECTURES:
            architecture_named(architecture)  # raises, naming the known architectures
        arch = ARCHITECTURES[architecture]
        metadata = cfg.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise TypeError(f"SAE config 'metadata' must be a dict, got {type(metadata).__name__}")
        return cls(
            architecture=architecture,
            d_in=cfg["d_in"],
            d_sae=cfg["d_sae"],
            d_out=cfg.get("d_out", 768) if arch.transcoder else cfg["d_in"],
            dtype=parse_dtype(cfg.get("dtype", "float32")),
            apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
            normalize_activations=cfg.get("normalize_activations", "none"),
            reshape_activations=cfg.get("reshape_activations", "none"),
            k=cfg.get("k", 100) if arch.top_k else None,
            rescale_acts_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)) if arch.top_k else False,
            metadata=json.loads(json.dumps(metadata)),  # a private, JSON-plain copy
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``cfg.json`` dict, format 6.x, as SAELens' ``save_model`` writes it."""
        arch = ARCHITECTURES[self.architecture]
        metadata = dict(self.metadata)
        major = _format_major({"metadata": metadata})
        if major is None or major < 6:
            metadata["sae_lens_version"] = FORMAT_VERSION
        out: dict[str, Any] = {
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": dtype_name(self.dtype),
            "device": "cpu",
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "normalize_activations": self.normalize_activations,
            "reshape_activations": self.reshape_activations,
            "metadata": metadata,
        }
        if arch.top_k:
            out.update(k=self.k, rescale_acts_by_decoder_norm=self.rescale_acts_by_decoder_norm)
        if arch.transcoder:
            out["d_out"] = self.d_out
        out["architecture"] = self.architecture
        return out

    def replace(self, **changes) -> "SAEConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        extras = f", k={self.k}" if self.k is not None else ""
        hooks = f", hook_name={self.hook_name!r}" + (
            f", hook_name_out={self.hook_name_out!r}" if self.hook_name_out else ""
        )
        return (
            f"SAEConfig({self.architecture!r}, d_in={self.d_in}, d_sae={self.d_sae}"
            + (f", d_out={self.d_out}" if self.d_out != self.d_in else "")
            + f"{extras}, normalize_activations={self.normalize_activations!r}{hooks})"
        )


__all__ = ["DTYPES", "NORMALIZATIONS", "RESHAPES", "SAEConfig", "UNSUPPORTED_ARCHITECTURES", "parse_dtype"]

"""``HookedTransformerConfig``: TransformerLens' config, field for field, for code written against it.

Unlike ``TransformerConfig`` (frozen, ~10 fields, one architecture), this config is
mutable and carries every field of TransformerLens' ``HookedTransformerConfig``, because
code written for TransformerLens reads and sets them (``model.cfg.default_prepend_bos =
False``, ``cfg.use_attn_result``). The compatibility architecture
(``interp_transformer.compat.architecture``) reads it to pick the parts; fields naming
math this library does not compute are refused there, when a model is built, with a
``ValueError`` saying which.

Defaults are TransformerLens': ``act_fn="relu"``, ``normalization_type="LN"``,
``d_mlp = 4 * d_model``, ``n_heads = d_model // d_head``, ``initializer_range =
0.8 / sqrt(d_model)``, ``attn_scale = sqrt(d_head)``, ``d_vocab_out = d_vocab``.
``d_vocab = -1`` means "from the tokenizer" (``HookedTransformer`` fills it in).

>>> cfg = HookedTransformerConfig(d_model=64, d_head=16, n_layers=2, n_ctx=32, d_vocab=100)
>>> cfg.n_heads, cfg.d_mlp, cfg.n_params, cfg.d_vocab_out
(4, 256, 98304, 100)
"""

import dataclasses
import math
import pprint
import random
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch

from interp_transformer.compat.errors import CompatValueError

# TransformerLens' activation names; "solu_ln"/"gelu_ln" are accepted here and refused when a model is built
SUPPORTED_ACTIVATIONS = (
    "relu",
    "gelu",
    "silu",
    "gelu_new",
    "solu_ln",
    "gelu_fast",
    "gelu_pytorch_tanh",
    "gelu_ln",
    "xielu",
)
NORMALIZATION_TYPES = ("LN", "LNPre", "RMS", "RMSPre", None)
POSITIONAL_EMBEDDING_TYPES = ("standard", "shortformer", "rotary", "alibi")


@dataclass
class HookedTransformerConfig:
    """TransformerLens' model config (see the module docstring); every field has its TransformerLens meaning."""

    d_model: int
    d_head: int
    n_layers: int
    n_ctx: int
    n_heads: int = -1
    d_mlp: int | None = None
    d_vocab: int = -1
    device: str | None = None
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    default_prepend_bos: bool = True
    positional_embedding_type: str = "standard"
    n_key_value_heads: int | None = None
    attn_only: bool = False
    gated_mlp: bool = False
    uses_rms_norm: bool = False
    eps: float = 1e-5
    layer_norm_folding: bool = False
    act_fn: str | None = "relu"
    normalization_type: str | None = "LN"
    num_experts: int | None = None
    experts_per_token: int | None = None
    final_rms: bool = False
    dtype: torch.dtype = torch.float32
    model_name: str = "custom"
    use_attn_scale: bool = True
    attn_scale: float = -1.0
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
    use_qk_norm: bool = False
    use_local_attn: bool = False
    ungroup_grouped_query_attention: bool = False
    original_architecture: str | None = None
    from_checkpoint: bool = False
    checkpoint_index: int | None = None
    checkpoint_label_type: str | None = None
    checkpoint_value: int | None = None
    tokenizer_name: str | None = None
    window_size: int | None = None
    attn_types: list | None = None
    init_mode: str = "gpt2"
    n_devices: int = 1
    attention_dir: str = "causal"
    seed: int | None = None
    initializer_range: float = -1.0
    init_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    d_vocab_out: int = -1
    parallel_attn_mlp: bool = False
    rotary_dim: int | None = None
    n_params: int | None = None
    use_hook_tokens: bool = False
    tokenizer_prepends_bos: bool | None = None
    post_embedding_ln: bool = False
    rotary_base: float | int = 10000
    rotary_base_local: float | int | None = None
    rotary_adjacent_pairs: bool = False
    trust_remote_code: bool = False
    load_in_4bit: bool = False
    use_normalization_before_and_after: bool = False
    attn_scores_soft_cap: float = -1.0
    output_logits_soft_cap: float = -1.0

    def __post_init__(self) -> None:
        self._check_sizes()
        self._fill_run_defaults()
        self._check_choices()
        self._fill_derived_defaults()
        if self.default_prepend_bos not in (True, False):
            raise CompatValueError(
                f"default_prepend_bos must be either True or False, but {self.default_prepend_bos!r} is given"
            )
        self.n_params = self.hidden_weight_count()

    def _check_sizes(self) -> None:
        for name in ("d_model", "d_head", "n_layers", "n_ctx"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CompatValueError(f"{name} must be a positive int, got {value!r}")
        if self.n_heads == -1:
            if self.d_model % self.d_head:
                raise CompatValueError(f"d_model ({self.d_model}) must be divisible by d_head ({self.d_head})")
            self.n_heads = self.d_model // self.d_head

    def _fill_run_defaults(self) -> None:
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.seed is not None:
            self.set_seed_everywhere(self.seed)

    def _check_choices(self) -> None:
        if not self.attn_only and self.act_fn not in SUPPORTED_ACTIVATIONS:
            raise CompatValueError(f"act_fn={self.act_fn!r} must be one of {SUPPORTED_ACTIVATIONS}")
        if self.normalization_type not in NORMALIZATION_TYPES:
            raise CompatValueError(
                f"normalization_type must be one of {NORMALIZATION_TYPES}, got {self.normalization_type!r}"
            )
        if self.positional_embedding_type not in POSITIONAL_EMBEDDING_TYPES:
            raise CompatValueError(
                f"positional_embedding_type must be one of {POSITIONAL_EMBEDDING_TYPES}, got "
                f"{self.positional_embedding_type!r}"
            )
        if self.attention_dir not in ("causal", "bidirectional"):
            raise CompatValueError(f"attention_dir must be 'causal' or 'bidirectional', got {self.attention_dir!r}")
        if self.use_local_attn and (self.window_size is None or self.attn_types is None):
            raise CompatValueError("use_local_attn=True needs window_size and attn_types")
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise CompatValueError("num_experts and experts_per_token come together: set both or neither")

    def _fill_derived_defaults(self) -> None:
        if self.initializer_range < 0:
            self.initializer_range = 0.8 / math.sqrt(self.d_model) if self.init_mode == "gpt2" else 1.0
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        if self.positional_embedding_type == "rotary" and self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.use_attn_scale and self.attn_scale == -1.0:
            self.attn_scale = math.sqrt(self.d_head)

    def hidden_weight_count(self) -> int:
        """TransformerLens' ``n_params``: the attention and MLP weight matrices only (no embeddings, biases or
        norms)."""
        count = self.n_layers * self.d_model * self.d_head * self.n_heads * 4
        if not self.attn_only:
            # d_mlp is set by __post_init__
            per_layer = self.d_model * self.d_mlp * (2 + self.gated_mlp)  # type: ignore[operator]
            if self.num_experts:
                per_layer = (per_layer + self.d_model) * self.num_experts
            count += self.n_layers * per_layer
        return count

    # --- the names our own parts read --------------------------------------------------------------
    @property
    def layer_norm_eps(self) -> float:
        return self.eps

    @property
    def init_range(self) -> float:
        return self.initializer_range

    @property
    def name(self) -> str:
        return self.model_name

    # --- TransformerLens' helpers -------------------------------------------------------------------
    @classmethod
    def unwrap(cls, config: Union[dict, "HookedTransformerConfig"]) -> "HookedTransformerConfig":
        """A config from a dict of its fields, or the config itself."""
        if isinstance(config, dict):
            return cls.from_dict(config)
        if isinstance(config, cls):
            return config
        raise TypeError(f"expected a HookedTransformerConfig or a dict of its fields, got {type(config).__name__}")

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> "HookedTransformerConfig":
        """A config from a dict; unknown keys raise ``TypeError`` naming the closest fields."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(config_dict) - known)
        if unknown:
            import difflib

            close = {key: difflib.get_close_matches(key, known, n=2) for key in unknown}
            raise TypeError(f"HookedTransformerConfig has no fields {unknown}; closest: {close}")
        return cls(**config_dict)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__

    def replace(self, **changes) -> "HookedTransformerConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def is_layer_norm_activation(self) -> bool:
        return self.act_fn is not None and self.act_fn.endswith("_ln")

    @staticmethod
    def set_seed_everywhere(seed: int) -> None:
        """Seed torch, Python's ``random`` and numpy, as TransformerLens does when a config has a seed."""
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)

    def __repr__(self) -> str:
        return "HookedTransformerConfig:\n" + pprint.pformat(self.to_dict())


__all__ = ["HookedTransformerConfig", "NORMALIZATION_TYPES", "POSITIONAL_EMBEDDING_TYPES", "SUPPORTED_ACTIVATIONS"]

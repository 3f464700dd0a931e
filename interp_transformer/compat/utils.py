"""TransformerLens' ``utils``, for code that does ``from transformer_lens import utils``.

Everything here has TransformerLens' name, arguments and meaning; errors are ours
(``ValueError``/``TypeError``/``KeyError`` naming what came, where TransformerLens asserts), the
``ValueError``s and ``KeyError``s also ``AssertionError``s (``compat.errors``).
``get_act_name`` resolves through an explicit table (TransformerLens' compact spellings
``"k6a"``, ``"scale4ln1"`` included), so an unknown name raises ``KeyError`` with the
closest ones instead of building a name no model has.

>>> get_act_name("k", 6, "a"), get_act_name("scale4ln1"), get_act_name("embed")
('blocks.6.attn.hook_k', 'blocks.4.ln1.hook_scale', 'hook_embed')
>>> get_act_name("result", 0), get_act_name("blocks.0.attn.hook_pattern")
('blocks.0.attn.hook_result', 'blocks.0.attn.hook_pattern')
>>> get_act_name("rot_q", 2), get_act_name("normalized", 0, "ln1_post"), get_act_name("scale3ln2_post")
('blocks.2.attn.hook_rot_q', 'blocks.0.ln1_post.hook_normalized', 'blocks.3.ln2_post.hook_scale')
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from interp_transformer.compat.architecture import TOGGLE_HOOKS
from interp_transformer.compat.errors import assertion_compatible
from interp_transformer.compat.losses import (
    get_attention_mask,
    get_cumsum_along_dim,
    lm_accuracy,
    lm_cross_entropy_loss,
    sample_logits,
)
from interp_transformer.compat.utils_init import (
    calc_fan_in_and_fan_out,
    init_kaiming_normal_,
    init_kaiming_uniform_,
    init_xavier_normal_,
    init_xavier_uniform_,
)
from interp_transformer.compat.utils_tensors import (
    composition_scores,
    filter_dict_by_prefix,
    get_corner,
    get_device,
    get_matrix_corner,
    get_nested_attr,
    get_offset_position_ids,
    is_library_available,
    is_lower_triangular,
    is_square,
    remove_batch_dim,
    repeat_along_head_dimension,
    set_nested_attr,
    to_numpy,
    transpose,
)
from interp_transformer.compat.utils_text import (
    USE_DEFAULT_VALUE,
    LocallyOverridenDefaults,
    get_input_with_manually_prepended_bos,
    get_tokenizer_with_bos,
    get_tokens_with_bos_removed,
    keep_single_column,
    override_or_use_default_value,
    test_prompt,
    tokenize_and_concatenate,
)
from interp_transformer.hooks.names import BLOCK_HOOKS, HookNames, split_compact_name
from interp_transformer.hooks.slices import Slice, SliceInput
from interp_transformer.parts.activations import gelu_fast, gelu_new

# every hook name a TransformerLens-compatible model may have
ACT_NAMES = HookNames(
    layer_keys={
        **BLOCK_HOOKS,
        **TOGGLE_HOOKS,
        "rot_q": "blocks.{layer}.attn.hook_rot_q",
        "rot_k": "blocks.{layer}.attn.hook_rot_k",
        "pre_linear": "blocks.{layer}.mlp.hook_pre_linear",
        "attn_scores_uncapped": "blocks.{layer}.attn.hook_attn_scores_uncapped",
    },
    sublayers=("ln1", "ln2", "ln1_post", "ln2_post"),
    global_keys={
        "embed": "hook_embed",
        "pos_embed": "hook_pos_embed",
        "tokens": "hook_tokens",
        "scale": "ln_final.hook_scale",
        "normalized": "ln_final.hook_normalized",
    },
)


@assertion_compatible  # an unknown short name: CompatKeyError (a KeyError, and TransformerLens' AssertionError)
def get_act_name(name: str, layer: int | str | None = None, layer_type: str | None = None) -> str:
    """The full hook name of a short one: ``get_act_name("k", 6, "a") == "blocks.6.attn.hook_k"``.

    A full name (with a ``.`` or starting ``hook_``, and no layer) is returned as is; ``"k6a"``-style
    compact names are read as ``(name, layer, layer_type)``. ``layer_type`` is the norm
    (``"ln1"``, ``"ln2"``) for ``scale``/``normalized``, or TransformerLens' part name
    (``"a"``/``"attn"``, ``"m"``/``"mlp"``, ``"b"``) where the name implies it anyway.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    compact = split_compact_name(name)
    if compact is not None and layer is None:
        name, layer, layer_type = compact
    if isinstance(layer, str) and layer.isdigit():
        layer = int(layer)
    # a layer still a str here is refused by full_name, by name (one place checks layers)
    return ACT_NAMES.full_name(name, layer, layer_type)  # type: ignore[arg-type]


def solu(input: Tensor) -> Tensor:
    """SoLU: ``x * softmax(x)`` over the last axis (the MLP's LayerNorm after it is the MLP's own)."""
    return input * F.softmax(input, dim=-1)


def gelu_pytorch_tanh(input: Tensor) -> Tensor:
    """``torch.nn.functional.gelu(x, approximate="tanh")`` (the same function as ``gelu_new``)."""
    return F.gelu(input, approximate="tanh")


def print_gpu_mem(step_name: str = "") -> None:
    """Print the CUDA memory in use (nothing to print without CUDA)."""
    if torch.cuda.is_available():
        print(f"{step_name} ~ {torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated on GPU.")
    else:
        print("No GPU available")


__all__ = [
    "ACT_NAMES",
    "LocallyOverridenDefaults",
    "Slice",
    "SliceInput",
    "USE_DEFAULT_VALUE",
    "calc_fan_in_and_fan_out",
    "composition_scores",
    "filter_dict_by_prefix",
    "gelu_fast",
    "gelu_new",
    "gelu_pytorch_tanh",
    "get_act_name",
    "get_attention_mask",
    "get_corner",
    "get_cumsum_along_dim",
    "get_device",
    "get_input_with_manually_prepended_bos",
    "get_matrix_corner",
    "get_nested_attr",
    "get_offset_position_ids",
    "get_tokenizer_with_bos",
    "get_tokens_with_bos_removed",
    "init_kaiming_normal_",
    "init_kaiming_uniform_",
    "init_xavier_normal_",
    "init_xavier_uniform_",
    "is_library_available",
    "is_lower_triangular",
    "is_square",
    "keep_single_column",
    "lm_accuracy",
    "lm_cross_entropy_loss",
    "override_or_use_default_value",
    "print_gpu_mem",
    "remove_batch_dim",
    "repeat_along_head_dimension",
    "sample_logits",
    "set_nested_attr",
    "solu",
    "test_prompt",
    "to_numpy",
    "tokenize_and_concatenate",
    "transpose",
]

"""Walk a Hugging Face model's checkpoint tensors and config fields, one at a time, against our loading of it.

For each tensor of a checkpoint (each config field), ``tensor_findings`` (``config_findings``)
changes that one thing, builds the Hugging Face model and loads ours from it. Each change
must end one of two ways: our logits still equal Hugging Face's (the tensor or field is
honoured), or loading refuses it with a ``ValueError`` naming it. A change that loads and
then computes something else is a silent wrong answer, and is returned as a finding.

Everything runs in float64, so "equal" is float64 rounding (``ATOL``), not a tolerance
chosen to pass. Only the logits are compared: the hook-by-hook parity tests already hold
each family's hooks, and a tensor that changes no logit on either side changes nothing.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

ATOL = 1e-8
# string fields and what else they may say
ALTERNATIVES = {
    "hidden_act": ("gelu", "relu", "silu", "gelu_new", "gelu_pytorch_tanh"),
    "hidden_activation": ("gelu", "relu", "silu", "gelu_pytorch_tanh"),
    "activation_function": ("gelu", "relu", "silu", "gelu_new", "swish"),
    "feed_forward_proj": ("relu", "gated-gelu", "gated-silu"),
    "position_embedding_type": ("absolute", "relative_key"),
}
# fields that only say how a Hugging Face forward returns or caches, never what it computes
NOT_MATH = {
    "use_cache",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "use_return_dict",
    "chunk_size_feed_forward",
    "tie_encoder_decoder",
    "is_encoder_decoder",
    "add_cross_attention",
    "is_decoder",
    "dtype",
    "torch_dtype",
    "architectures",
    "transformers_version",
    "model_type",
    "_name_or_path",
    "name_or_path",
    "gradient_checkpointing",
    "problem_type",
    "id2label",
    "label2id",
    "num_labels",
    "finetuning_task",
    "tokenizer_class",
    "prefix",
    "task_specific_params",
    "pruned_heads",
    "cross_attention_hidden_size",
    "output_scores",
    "return_dict_in_generate",
    "use_bfloat16",
    "tf_legacy_loss",
    "classifier_dropout",
    "summary_type",
    "summary_use_proj",
    "summary_activation",
    "summary_proj_to_labels",
    "summary_first_dropout",
    "forced_eos_token_id",
    "forced_bos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
    "bos_token_id",
    "eos_token_id",
    "initializer_range",
    "init_std",
    "initializer_factor",
    "attn_implementation",
}


@dataclass
class Family:
    """One Hugging Face model family: how to build a perturbed float64 model, and how to run it and ours."""

    label: str
    build: Callable[[object], torch.nn.Module]  # config -> perturbed float64 HF model in eval mode
    config: object
    inputs: dict  # keyword arguments of the Hugging Face forward
    ours_logits: Callable[[torch.nn.Module, dict], torch.Tensor]  # (our model, inputs) -> logits


def perturb_all_(model: torch.nn.Module, seed: int, scale: float = 0.2) -> torch.nn.Module:
    """Move every floating tensor of ``model``'s checkpoint away from its init (norm gains, biases, saved tables).

    Only what a checkpoint holds (``state_dict``): buffers a model computes and never saves,
    such as rotary frequencies, stay as the config makes them.
    """
    generator = torch.Generator().manual_seed(seed)
    tensors = {id(t): t for t in model.state_dict(keep_vars=True).values() if t.is_floating_point()}
    with torch.no_grad():
        for tensor in tensors.values():
            tensor.add_(scale * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    return model


def hf_logits(hf_model, inputs: dict) -> torch.Tensor:
    """Hugging Face's logits through the converter's reference run, which keeps a float64 model in float64 throughout
    (a plain forward computes some softmaxes in float32); a plain forward where the reference gives no logits."""
    from interp_transformer.loading import architecture_module

    reference = architecture_module(hf_model.config.model_type).hf_reference_activations
    inputs = dict(inputs)
    tokens = inputs.pop("input_ids")
    if "decoder_input_ids" in inputs:
        inputs["decoder_input"] = inputs.pop("decoder_input_ids")
    with torch.no_grad():
        logits = reference(hf_model, tokens, **inputs).get("logits")
        if logits is None:
            logits = hf_model(tokens, **inputs, return_dict=True).logits
    return logits


def compare(family: Family, hf_model) -> str | None:
    """``None`` when ours matches ``hf_model`` or refuses it by ``ValueError``; else what went wrong."""
    from interp_transformer.loading import from_pretrained

    try:
        reference = hf_logits(hf_model, family.inputs)
    except Exception:  # noqa: BLE001 (a change Hugging Face itself cannot run is not ours to judge)
        return None
    try:
        ours = from_pretrained(hf_model, dtype=torch.float64)
    except (ValueError, TypeError, KeyError) as error:
        return None if str(error) else "refused with an empty message"
    with torch.no_grad():
        got = family.ours_logits(ours, family.inputs)
    if got.shape != reference.shape:
        return f"logits of shape {list(got.shape)}, Hugging Face's {list(reference.shape)}"
    gap = (got - reference).abs().max().item()
    return None if gap <= ATOL * max(1.0, reference.abs().max().item()) else f"logits differ by {gap:.3g}"


def tensor_findings(family: Family, seed: int = 0) -> list[str]:
    """Every checkpoint tensor whose change our loading computes other than Hugging Face does."""
    hf_model = family.build(family.config)
    findings = []
    seen = set()
    for name, tensor in hf_model.state_dict(keep_vars=True).items():
        if not tensor.is_floating_point() or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        original = tensor.detach().clone()
        generator = torch.Generator().manual_seed(seed + len(seen))
        with torch.no_grad():
            tensor.add_(0.5 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
        problem = compare(family, hf_model)
        with torch.no_grad():
            tensor.copy_(original)
        if problem:
            findings.append(f"{family.label}: tensor {name}: {problem}")
    return findings


def mutations(name: str, value) -> list:
    """Other values a config field may plausibly take."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1]
    if isinstance(value, float):
        return [value * 1.5 + 0.01] if math.isfinite(value) else []
    if isinstance(value, str):
        return [other for other in ALTERNATIVES.get(name, ()) if other != value][:2]
    return []


def config_findings(family: Family) -> list[str]:
    """Every config field whose change our loading computes differently from Hugging Face, or silently ignores."""
    findings = []
    fields = family.config.to_dict()
    # fields some transformers release reads, added where the config lacks them (Gemma 1 read hidden_activation)
    absent = {name: None for name in ALTERNATIVES if name not in fields}
    for name, value in sorted({**fields, **absent}.items()):
        if name in NOT_MATH or name.startswith("_"):
            continue
        for other in mutations(name, value) if value is not None else ALTERNATIVES[name][:2] if name in absent else []:
            try:
                config = type(family.config).from_dict({**fields, name: other}, attn_implementation="eager")
                hf_model = family.build(config)
            except Exception:  # noqa: BLE001 (a config Hugging Face refuses is not ours to judge)
                continue
            problem = compare(family, hf_model)
            if problem:
                findings.append(f"{family.label}: config {name}={other!r} (was {value!r}): {problem}")
    return findings


__all__ = ["Family", "compare", "config_findings", "perturb_all_", "tensor_findings"]

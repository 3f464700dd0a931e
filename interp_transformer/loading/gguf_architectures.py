"""The keyword arguments of a GGUF file's ``transformers`` config, from its metadata and tensor shapes.

Which ``general.architecture`` values exist, and what each means in Hugging Face terms, is each family's
GGUF entry (``families/<name>/gguf.py``, a ``families.gguf_entry.GGUFArchitecture``), handed in by the
family's ``register(...)`` line: ``families.gguf_architectures()`` is the table.
"""

from collections.abc import Mapping
from typing import Any

from interp_transformer.families import gguf_architectures
from interp_transformer.families.gguf_entry import metadata_float, metadata_int, rope_parameters

# config field -> tokenizer.ggml key of the special token ids a config carries
SPECIAL_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "padding_token_id"}


def hf_config_fields(metadata: Mapping[str, Any], tensors: Mapping[str, Any], arch: str, path) -> dict:
    """The keyword arguments of ``arch``'s config class, from the file's metadata and tensor shapes."""
    spec = gguf_architectures()[arch]
    names = set(tensors)
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    hidden = metadata_int(metadata, key("embedding_length"))
    heads = metadata_int(metadata, key("attention.head_count"))
    head_dim = metadata_int(metadata, key("attention.key_length"), hidden // heads)
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path} has no token_embd.weight, so the vocabulary size is unknown")
    vocab = tensors["token_embd.weight"].shape[0]  # vocab_size, where the file has it, agrees (gguf_consistency)
    token_ids = {name: metadata.get(f"tokenizer.ggml.{gguf}") for name, gguf in SPECIAL_TOKEN_IDS.items()}
    for name, token_id in token_ids.items():
        if token_id is not None and (not isinstance(token_id, int) or not 0 <= token_id < vocab):
            raise ValueError(
                f"GGUF metadata tokenizer.ggml.{SPECIAL_TOKEN_IDS[name]}={token_id!r} must be a token id "
                f"in [0, {vocab})"
            )
    common = dict(
        name_or_path=path.stem,
        vocab_size=vocab,
        # llama.cpp writes output.weight only when the unembedding is not the embedding matrix
        tie_word_embeddings="output.weight" not in names,
        **token_ids,
    )
    if spec.config_fields is not None:
        return {**common, **spec.config_fields(metadata, arch)}
    feed_forward = None  # an all-expert file may leave out the width of a dense MLP it does not have
    if spec.feed_forward_fallback is not None and key("feed_forward_length") not in metadata:
        feed_forward = metadata_int(metadata, key(spec.feed_forward_fallback))
    fields = dict(
        **common,
        hidden_size=hidden,
        intermediate_size=metadata_int(metadata, key("feed_forward_length"), feed_forward),
        num_hidden_layers=metadata_int(metadata, key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=metadata_int(metadata, key("attention.head_count_kv"), heads),
        head_dim=head_dim,
        rms_norm_eps=metadata_float(metadata, key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=metadata_int(metadata, key("context_length")),
        rope_parameters=rope_parameters(metadata, arch, head_dim),
        **{name: any(tensor.endswith(suffix) for tensor in names) for name, suffix in spec.flags_from_tensors},
    )
    if spec.extra_fields is not None:
        fields.update(spec.extra_fields(metadata, arch))
    return fields


__all__ = ["SPECIAL_TOKEN_IDS", "hf_config_fields"]

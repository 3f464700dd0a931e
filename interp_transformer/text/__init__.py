"""Text in and out: tokenizers, the text methods every model has, prompts and generation.

==================  ===================================================================
``tokens``          tokenize, pad with a mask, decode; the offline GPT-2 tokenizer
``gpt2_tokenizer``  GPT-2's byte-level BPE, built from its files with no network
``methods``         ``TextMethods`` (written once) and each model's input kind
``prompts``         ``test_prompt``
``generate``        sampling with a key/value cache
==================  ===================================================================
"""

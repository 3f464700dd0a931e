"""Ported from TransformerLens v3.5.1, tests/acceptance/test_hooked_transformer.py: the tests of the classic features
that
need no trained checkpoint (MIT License, see LICENSE-TransformerLens).

Changed: imports, and the model source (tests.compat.hub stand-ins for hub checkpoints).
Not ported: the tests comparing trained checkpoints' losses or other model families with Hugging Face (they need the
hub).
"""

import pytest
import torch

from interp_transformer import HookedTransformer
from ..hub import stand_in, stand_in_no_processing  # noqa: F401  (hub checkpoints stand-ins)


@torch.no_grad()
def test_pos_embed_hook():
    """
    Checks that pos embed hooks:
    - do not permanently change the pos embed
    - can be used to alter the pos embed for a specific batch element
    """
    model = stand_in("gpt2-small")
    initial_W_pos = model.W_pos.detach().clone()

    def remove_pos_embed(z, hook):
        z[:] = 0.0
        return z

    _ = model.run_with_hooks("Hello, world", fwd_hooks=[("hook_pos_embed", remove_pos_embed)])

    # Check that pos embed has not been permanently changed
    assert (model.W_pos == initial_W_pos).all()

    def edit_pos_embed(z, hook):
        sequence_length = z.shape[1]
        z[1, :] = 0.0
        # Check that the second batch element is zeroed
        assert (z[1, :] == 0.0).all()
        # Check that the first batch element is unchanged
        assert (z[0, :] == initial_W_pos[:sequence_length]).all()
        return z

    _ = model.run_with_hooks(
        ["Hello, world", "Goodbye, world"],
        fwd_hooks=[("hook_pos_embed", edit_pos_embed)],
    )


@pytest.mark.parametrize(
    "input_type,return_type",
    [
        ("str", "input"),
        ("str", "str"),
        ("str", "tokens"),
        ("str", "embeds"),
        ("tokens", "input"),
        ("tokens", "str"),
        ("tokens", "tokens"),
        ("tokens", "embeds"),
        ("embeds", "input"),
        ("embeds", "str"),
        ("embeds", "tokens"),
        ("embeds", "embeds"),
    ],
)
def test_different_inputs_for_generation(input_type, return_type, print_output=False, max_new_tokens=3):
    from typing import List

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hooked_llm = stand_in("gpt2", device=device)

    hooked_llm.eval()
    for text_input in [
        "What is the meaning of life?",
        ["AI will destroy world", "AI will save us"],
    ]:
        is_batched = False if isinstance(text_input, str) else True

        tokens_input = hooked_llm.to_tokens(text_input)
        embeddings_input = hooked_llm.embed(tokens_input)

        if input_type == "str":
            model_input = text_input
        elif input_type == "tokens":
            model_input = tokens_input
        elif input_type == "embeds":
            model_input = embeddings_input
        else:
            raise ValueError(f"Unknown input_type: {input_type}")

        output = hooked_llm.generate(
            input=model_input, max_new_tokens=max_new_tokens, return_type=return_type, verbose=False
        )

        if return_type == "str" or (return_type == "input" and input_type == "str"):
            if is_batched:
                assert isinstance(output, List), f"Expected list output but got {type(output)}"
                assert isinstance(output[0], str), f"Expected list of strings but got list of {type(output[0])}"
            else:
                assert isinstance(output, str), f"Expected string output but got {type(output)}"
        elif return_type == "tokens" or (return_type == "input" and input_type == "tokens"):
            assert isinstance(output, torch.Tensor), f"Expected tensor output but got {type(output)}"
            assert output.ndim == 2, f"Expected 2D tensor but got {output.ndim}D"
        elif return_type == "embeds" or (return_type == "input" and input_type == "embeds"):
            assert isinstance(output, torch.Tensor), f"Expected tensor output but got {type(output)}"
            assert output.ndim == 3, f"Expected 3D tensor but got {output.ndim}D"

        if print_output:
            print(f"Input type: {input_type}, return type: {return_type}, output:\n{output}")

    if print_output:
        print()

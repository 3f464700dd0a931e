"""What the redesign added, tried as a user would: bad questions, NaN, empty prompts, wrong widths with checks on
and off, a Ctrl-C inside a forward, a second thread, and random builder specs.

References: the writers' questions against the parts' own classes, the services against the functions they name,
a NaN stream against itself (it must flow through, not be refused), a thread's forward against the main thread's.
"""

import threading

import pytest
import torch

from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.core import services
from interp_transformer.core.shape_checks import ShapeError, shape_checking
from interp_transformer.families.registry import register
from interp_transformer.parts.moe import MixtureOfExperts

from .spec_generator import draw_specs

CFG = TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=32, d_vocab=23, n_ctx=8)


@pytest.fixture(scope="module")
def model():
    return DemoTransformer(CFG, seed=0)


@pytest.mark.parametrize("question", ["reads_sourse", 3, None, ""])
def test_an_unknown_writer_question_is_refused_naming_the_questions(model, question):
    with pytest.raises(KeyError, match=r"question must be one of \('reads_source', 'routes_tokens'\), got"):
        model.writers_that(question)


def test_writers_answer_from_their_parts_over_random_builder_specs():
    """On every drawn model: the writers routing tokens are exactly the mixtures of experts, and a writer reads a
    source exactly in an encoder-decoder's decoder."""
    for drawn in draw_specs(12, seed=41):
        built = drawn.build()
        writers = [writer for block in built.writer_blocks() for writer in block.writers()]
        routing = [writer for writer in writers if isinstance(writer.part, MixtureOfExperts)]
        assert built.writers_that("routes_tokens") == routing, drawn
        assert bool(built.writers_that("reads_source")) == (drawn.kind == "encoder_decoder"), drawn
        assert built.has_experts == bool(routing) and built.has_cross_attention == (drawn.kind == "encoder_decoder")


def test_a_wrong_width_at_a_block_is_named_on_random_decoder_specs():
    for drawn in draw_specs(8, seed=42, kind="decoder"):
        built = drawn.build()
        d_model = built.cfg.d_model
        for enabled in (True, False):
            with shape_checking(enabled), pytest.raises(ShapeError) as error:
                built.blocks[0](torch.zeros(1, 3, d_model + 1))
            first = str(error.value).splitlines()[0]
            assert "'resid_pre'" in first and f"d_model = {d_model + 1}" in first and f"is {d_model}" in first


def test_nan_and_inf_flow_through_the_blocks_and_an_empty_prompt_is_refused(model):
    nan = model.blocks[0](torch.full((1, 3, CFG.d_model), float("nan")))
    assert nan.shape == (1, 3, CFG.d_model) and nan.isnan().all()
    inf = torch.zeros(1, 3, CFG.d_model)
    inf[0, 1, 0] = float("inf")
    out = model.blocks[0](inf)
    # not refused, and not hidden: the inf reaches the output (through the pattern's 0 * inf, as in plain torch,
    # position 0 too)
    assert out.shape == inf.shape and not torch.isfinite(out[0, 1]).all()
    with pytest.raises(ValueError, match=r"tokens must be non-empty, got shape \(1, 0\)"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="sequence of 9 tokens exceeds n_ctx=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_a_ctrl_c_inside_a_block_leaves_no_hook_and_the_grad_mode(model):
    tokens = torch.tensor([[1, 2, 3, 4]])
    expected = model(tokens)

    def interrupt(activation, hook):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_mid", interrupt)])
    assert torch.is_grad_enabled()
    assert all(not point.fwd_hooks and not point.bwd_hooks for point in model.hook_dict.values())
    assert torch.equal(model(tokens), expected)


def test_a_second_thread_runs_the_same_forward_and_services(model):
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    expected = model(tokens)
    results, errors = {}, []

    def work(i):
        try:
            results[i] = (model(tokens), services.service("from_pretrained"), model.writers_that("routes_tokens"))
        except BaseException as error:  # noqa: BLE001  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    from interp_transformer.loading import from_pretrained

    for logits, loader, routing in results.values():
        assert torch.equal(logits, expected) and loader is from_pretrained and routing == []


def test_services_and_register_refuse_bad_input_by_name(model):
    with pytest.raises(KeyError, match=r"no service named \['load'\]; the services are"):
        services.provide(load=print)
    with pytest.raises(TypeError, match="expected an Architecture, got str"):
        register("gpt2")
    from interp_transformer.families import registered

    with pytest.raises(ValueError, match="model must be one of .*received 'banana'"):
        register(registered()[0], model="banana")

"""Ctrl-C and threads in attribution graphs and edge attribution: an interrupt anywhere leaves the model and the
thread as they were, and a second thread training the same model meanwhile gets the gradients it gets alone.

Interrupts are raised without signals, deterministically: each point where a tool changes the model or its
thread's state (a torch hook registered on a part, a ``with`` block entered, the gradient mode switched, a torch
function mode pushed, ``requires_grad_``) makes its change and then raises ``KeyboardInterrupt`` on its n-th call,
as a Ctrl-C landing right after it would; each pass (every forward, every backward) raises at its first, middle
and last hook point. ``n`` runs from 1 until the call completes. The exception, and with it the traceback a REPL
keeps, is held while the model is checked: what only a generator's finaliser would undo counts as left behind.
"""

import contextlib
import copy
import functools
import threading

import pytest
import torch
import torch.nn.functional as F

from analysis.attribution_graphs import ReplacementModel, attribute, attribute_prompts, random_transcoders
from analysis.attribution_graphs.qk import qk_attribution
from analysis.discovery import edge_attribution_patching, logit_diff_per_row
from interp_transformer import TransformerConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.hooks import HookPoint
from interp_transformer.models.processing import fold_ln

from .perturbed import ANSWERS, CLEAN, CORRUPTED, perturbed_decoder
from .perturbed import SMALL_SHAPE as SHAPE
from .test_hooks import assert_no_hooks

PROMPT = torch.tensor([1, 5, 9, 2, 7, 3])


class Interrupt:
    """Raises ``KeyboardInterrupt`` at the ``at``-th point it is told of."""

    def __init__(self, at: int) -> None:
        self.at, self.seen = at, 0

    def tick(self) -> None:
        self.seen += 1
        if self.seen == self.at:
            raise KeyboardInterrupt(f"interrupt at point {self.at}")


def _then_tick(fn, interrupt: Interrupt):
    @functools.wraps(fn)
    def changed_then_interrupted(*args, **kwargs):
        result = fn(*args, **kwargs)
        interrupt.tick()
        return result

    return changed_then_interrupted


def _install(mp: pytest.MonkeyPatch, interrupt: Interrupt, pass_points: set) -> None:
    """Every state change ticks right after it is made; every pass ticks at ``pass_points`` and before each
    backward pass."""
    for owner, name in [
        (torch.nn.Module, "register_forward_pre_hook"),
        (torch.nn.Module, "register_forward_hook"),
        (torch._C, "_set_grad_enabled"),  # no_grad, enable_grad, set_grad_enabled
        (torch._C, "_push_on_torch_function_stack"),  # a torch function mode entered
        (torch.Tensor, "requires_grad_"),
    ]:
        mp.setattr(owner, name, _then_tick(getattr(owner, name), interrupt))
    forward, grad, enter = HookPoint.forward, torch.autograd.grad, contextlib._GeneratorContextManager.__enter__

    def entered(self):
        """A generator ``with`` block of ours (model.hooks, pattern_given, ...) or of torch.func's (a vmap level)."""
        ours = self.gen.gi_frame.f_globals["__name__"].startswith(
            ("interp_transformer", "analysis", "torch._functorch")
        )
        result = enter(self)
        if ours:
            interrupt.tick()
        return result

    mp.setattr(contextlib._GeneratorContextManager, "__enter__", entered)

    def hook_point(self, x):
        if self.name in pass_points:
            interrupt.tick()
        return forward(self, x)

    def backward(*args, **kwargs):
        interrupt.tick()
        return grad(*args, **kwargs)

    mp.setattr(HookPoint, "forward", hook_point)
    mp.setattr(torch.autograd, "grad", backward)


def _pass_points(model, tokens) -> set:
    """The first, a middle and the last hook point a forward pass runs."""
    order = []
    with model.hooks([(lambda name: True, lambda x, hook: order.append(hook.name))]), torch.no_grad():
        model(tokens)
    return {order[0], order[len(order) // 2], order[-1]}


def _state(model) -> dict:
    return {
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "torch hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()],
    }


def _assert_as_before(model, state: dict, tokens, fresh) -> None:
    """No hook left (ours or torch's, on any part), no pattern given, gradients and gradient mode as before, no
    vmap level or torch function mode left, and a forward bit-equal to one before."""
    assert_no_hooks(model)
    assert _state(model) == state
    assert all(m.given_pattern is None for m in model.modules() if hasattr(m, "pattern_given"))
    assert torch.is_grad_enabled()
    assert torch._C._functorch.maybe_current_level() is None
    torch.randn(2).requires_grad_()  # raises inside a vmap level
    assert torch._C._len_torch_function_stack() == 0
    assert torch.equal(model(tokens), fresh)


def interrupted_everywhere(model, call, tokens):
    """``call()`` interrupted at its first point, then at its second, ... until it completes; after each interrupt
    the model is as it was. Returns ``(number of points, the completed call's result)``."""
    state, fresh, points = _state(model), model(tokens), _pass_points(model, tokens)
    at = 0
    while True:
        at += 1
        held = None
        with pytest.MonkeyPatch.context() as mp:
            _install(mp, Interrupt(at), points)
            try:
                result = call()
            except KeyboardInterrupt as error:
                held = error  # its traceback (and every frame in it) stays alive, as a REPL keeps it
        if held is None:
            _assert_as_before(model, state, tokens, fresh)
            return at - 1, result
        try:
            _assert_as_before(model, state, tokens, fresh)
        except AssertionError as failure:
            raise AssertionError(f"after {held!r}: {failure}") from failure
        del held


@pytest.fixture(scope="module")
def model():
    return fold_ln(perturbed_decoder(LlamaConfig(**SHAPE, n_key_value_heads=2), torch.float32))


@pytest.fixture(scope="module")
def transcoders(model):
    return random_transcoders(model, 20, threshold=0.05)


def test_attribute_interrupted_anywhere_leaves_the_model_as_it_was(model, transcoders):
    expected = attribute(model, transcoders, PROMPT, batch_size=8, max_feature_nodes=12)
    points, graph = interrupted_everywhere(
        model, lambda: attribute(model, transcoders, PROMPT, batch_size=8, max_feature_nodes=12), PROMPT[None]
    )
    assert points > 30
    assert torch.equal(graph.adjacency_matrix, expected.adjacency_matrix)


def test_batched_attribution_interrupted_anywhere_leaves_the_model_as_it_was(model, transcoders):
    prompts = [PROMPT[:4], PROMPT[:3]]
    expected = attribute_prompts(model, transcoders, prompts, batch_size=16, max_padding=float("inf"))
    points, graphs = interrupted_everywhere(
        model,
        lambda: attribute_prompts(model, transcoders, prompts, batch_size=16, max_padding=float("inf")),
        PROMPT[None],
    )
    assert points > 30
    assert all(torch.equal(a.adjacency_matrix, b.adjacency_matrix) for a, b in zip(graphs, expected, strict=True))


def test_qk_attribution_interrupted_anywhere_leaves_the_model_as_it_was(model, transcoders):
    where = dict(layer=1, head=2, query_pos=4, key_pos=1)
    points, qk = interrupted_everywhere(
        model, lambda: qk_attribution(model, transcoders, PROMPT, **where), PROMPT[None]
    )
    assert points > 5
    assert abs(float(qk.terms.sum()) - float(qk.score)) < 1e-4


@pytest.mark.parametrize("method", ["EAP", "EAP-IG"])
def test_edge_attribution_interrupted_anywhere_leaves_the_model_as_it_was(method):
    model = perturbed_decoder(TransformerConfig(**SHAPE))
    metric = logit_diff_per_row(*ANSWERS)
    expected = edge_attribution_patching(model, CLEAN, CORRUPTED, metric, method=method, steps=2)
    points, edges = interrupted_everywhere(
        model, lambda: edge_attribution_patching(model, CLEAN, CORRUPTED, metric, method=method, steps=2), CLEAN
    )
    assert points > 10
    assert torch.equal(edges.scores, expected.scores)


def test_reset_hooks_removes_what_an_unfinished_replacement_forward_left(model, transcoders):
    """A ``with replacement.backward_pass(...)`` interrupted between entering and its body leaves its one-row MLP hooks,
    its frozen patterns and its hooks in place (its exit never runs); ``reset_hooks()`` removes them all."""
    state, fresh = _state(model), model(PROMPT[None])
    replacement = ReplacementModel(model, transcoders, PROMPT)
    block = replacement.backward_pass(2)
    block.__enter__()  # never exited, as after a Ctrl-C landing right after it was entered
    try:
        assert _state(model) != state  # its one-row MLP hooks
        model.reset_hooks()
        assert_no_hooks(model)
        assert _state(model) == state
        assert all(m.given_pattern is None for m in model.modules() if hasattr(m, "pattern_given"))
        assert torch.equal(model(PROMPT[None]), fresh)
    finally:
        block.__exit__(None, None, None)  # undoing what reset_hooks already undid changes nothing
    assert torch.equal(model(PROMPT[None]), fresh)


def _train(model, batch, steps: int = 50) -> list[list[torch.Tensor]]:
    """Plain SGD on next-token loss; every step's gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        logits = model(batch)
        F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten()).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return grads


def test_training_while_another_thread_attributes_gets_the_gradients_it_gets_alone(transcoders):
    model = fold_ln(perturbed_decoder(LlamaConfig(**SHAPE, n_key_value_heads=2), torch.float32))
    batch = torch.randint(0, SHAPE["d_vocab"], (4, 8), generator=torch.Generator().manual_seed(0))
    initial = copy.deepcopy(model.state_dict())
    alone = _train(model, batch)
    model.load_state_dict(initial)

    stop, outcomes, failures = threading.Event(), [], []

    def attributing() -> None:
        while not stop.is_set():
            try:
                attribute(model, transcoders, PROMPT, batch_size=4)
                outcomes.append("graph")
            except RuntimeError as error:  # autograd's own refusal: the trainer stepped the weights under it
                if "modified by an inplace operation" not in str(error):
                    failures.append(error)
                    return
                outcomes.append("weights changed")
            except BaseException as error:  # the test reports it
                failures.append(error)
                return

    thread = threading.Thread(target=attributing)
    thread.start()
    try:
        together = _train(model, batch)
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    assert outcomes
    for step, (a, b) in enumerate(zip(alone, together)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {step}"

"""Every tool's documented identity over random builder specs, seeded: held, or refused at the call by name.

A fast seeded set of ``spec_generator`` specs (decoders with every builder part, experts
included, encoders, encoder-decoders), each tool's identity on each (``tool_identities``); a test
is named by its tool and its spec, and a failure says which identity broke and by how much, or
which exception escaped. ``benchmarks/sweep_tool_identities.py --n 500`` runs the same checks
over more specs and writes the table in ``docs/tool_identities.md``.
"""

import functools

import pytest
import torch

from .spec_generator import PLACEMENTS, draw_spec, draw_specs
from .tool_identities import TOOLS, Broken, Refused, call, check, close, make_case, reason_of

N_SPECS = 36  # a few dozen per tool; the whole set takes seconds
SPECS = draw_specs(N_SPECS, seed=46)
# a norm-free decoder and a post-norm mixture of experts in every run, whatever the draw: the two kinds of spec the
# tools once crashed on or refused (issue 46)
FORCED = [
    draw_spec(seed, "decoder")
    for seed in (
        next(s for s in range(10_000) if draw_spec(s, "decoder").fields["norm"] == "none"),
        next(
            s
            for s in range(10_000)
            if draw_spec(s, "decoder").fields["placement"] == "post" and draw_spec(s, "decoder").fields["experts"]
        ),
    )
]
ALL = SPECS + FORCED


@functools.cache
def _case(index: int):
    return make_case(ALL[index])


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("index", range(len(ALL)), ids=[drawn.name for drawn in ALL])
def test_the_tools_identity_holds_or_the_spec_is_refused_by_name(tool, index):
    drawn = ALL[index]
    outcome = check(tool, drawn, _case(index))
    assert outcome.status != "failed", f"{tool} on {drawn.repro}: {outcome.reason}"


def test_the_set_reaches_every_kind_and_part():
    """The fast set is not vacuous: every kind of spec, and the parts that change each tool's path, occur; every
    tool holds on some spec."""
    kinds = {drawn.kind for drawn in ALL}
    assert kinds == {"decoder", "encoder", "encoder_decoder"}
    decoders = [drawn.fields for drawn in ALL if drawn.kind == "decoder"]
    assert any(f["experts"] for f in decoders) and any(f["gated_mlp"] for f in decoders)
    assert any(f["d_mlp"] is None for f in decoders) and any(not f["causal"] for f in decoders)
    assert {f["placement"] for f in decoders} == set(PLACEMENTS)
    assert {f["norm"] for f in decoders} == {"layer", "layer_unbiased", "rms", "none"}
    assert len({f["positions"] for f in decoders}) >= 5


@pytest.mark.parametrize("tool", list(TOOLS))
def test_each_tool_holds_on_some_spec(tool):
    held = [drawn.name for index, drawn in enumerate(ALL) if check(tool, drawn, _case(index)).status == "held"]
    assert held, f"{tool} held on no spec of the fast set: its identity was never checked"


def test_the_generator_is_seeded_and_every_draw_builds():
    assert [d.fields for d in draw_specs(5, seed=3)] == [d.fields for d in draw_specs(5, seed=3)]
    assert [d.fields for d in draw_specs(5, seed=3)] != [d.fields for d in draw_specs(5, seed=4)]
    drawn = SPECS[0]
    model = drawn.build()
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert all(bool((p == 0).all()) for p in frozen)  # a bias the spec leaves out stays zero
    assert all(float(p.detach().abs().max()) > 0.05 for p in model.parameters() if p.requires_grad)


def test_a_refusal_is_read_only_from_the_tools_call_and_an_identity_can_fail():
    """The checker's own verdicts: a named error with a message is a refusal, one without is a failure; another
    exception is a failure; ``close`` breaks on a wrong value and on NaN."""

    def refuses(message):
        raise ValueError(message)

    with pytest.raises(Refused, match="ValueError: d_model=N must be"):
        call(refuses, "d_model=12 must be even")
    with pytest.raises(Broken, match="no message"):
        call(refuses, "")
    with pytest.raises(ZeroDivisionError):
        call(lambda: 1 / 0)
    assert reason_of(KeyError("layer 12 not in [0, 1]")) == "KeyError: layer N not in [...]"
    with pytest.raises(Broken, match="off by"):
        close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-8], dtype=torch.float64), "values")
    with pytest.raises(Broken, match="off by nan"):
        close(torch.tensor([float("nan")]), torch.tensor([1.0]), "values")
    close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-11], dtype=torch.float64), "values")


def test_a_broken_tool_is_a_failure_not_a_refusal(monkeypatch):
    """A tool that returns a wrong number fails its identity; one that raises an AttributeError fails too."""
    from . import tool_identities

    drawn = next(d for d in ALL if d.kind == "decoder" and d.fields["placement"] == "pre" and d.fields["final_norm"])
    index = ALL.index(drawn)
    real = tool_identities.patch_sites_one_by_one
    monkeypatch.setattr(tool_identities, "patch_sites_one_by_one", lambda *a, **k: real(*a, **k) + 1e-6)
    outcome = check("patch_sites", drawn, _case(index))
    assert outcome.status == "failed" and "patch_sites vs patch_sites_one_by_one: off by" in outcome.reason

    def crashes(*args, **kwargs):
        raise AttributeError("'NoNorm' object has no attribute 'hook_normalized'")

    monkeypatch.setattr(tool_identities, "edge_attribution_patching", crashes)
    outcome = check("run_circuit", drawn, _case(index))
    assert outcome.status == "failed" and outcome.reason.startswith("AttributeError: 'NoNorm'")

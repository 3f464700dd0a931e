"""Edge attribution and circuits on encoder-decoders: two streams, joined by cross-attention's keys and values.

Every check is an identity against the model's own runs or gradients, computed here without the graph
(float64, 1e-10; T5's 1e-6, ``ATOL``): each node's edges sum to its attribution-patching score (an encoder
node's through the cross-attention keys and values it reaches), the logits' edges to the decoder's final
stream's and the cross-attention keys' and values' edges to the encoder's final stream's; a circuit of every
edge is the clean run, of none the corrupted run, and cutting one node's edges is patching that node. On a
model with nothing nonlinear every edge's score is patching that one edge, EAP-IG is EAP and the logits' edges
sum to the total effect. Models: T5 v1.1 (pre-RMSNorm, gated MLP, relative positions), BART (post-norm: stream
norms in both stacks) and the shipped ``translate-tiny`` (pre-LN), each with a padded source.
"""

import re
from typing import NamedTuple

import pytest
import torch

from analysis.discovery import (
    SourceTarget,
    build_graph,
    edge_attribution_patching,
    faithfulness_curve,
    load_seq2seq_task,
    logit_diff_per_row,
    run_circuit,
)
from analysis.discovery.report import _patterns, circuit_report
from interp_transformer.families.bart.recipe import BartConfig
from interp_transformer.families.t5.recipe import T5Config
from interp_transformer.models.encoder_decoder.model import EncoderDecoderTransformer
from interp_transformer.pretrained import load_shipped
from interp_transformer.pretrained.translation import encode_numbers

from .perturbed import LinearNorm, perturb

SHAPE = dict(d_model=16, n_layers=2, n_decoder_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=31, n_ctx=12)
TOKENS = dict(pad_token_id=1, eos_token_id=2, decoder_start_token_id=3)
SOURCE = torch.tensor([[5, 6, 7, 8, 9, 2], [11, 12, 13, 2, 1, 1]])
CORRUPTED_SOURCE = torch.tensor([[5, 16, 7, 8, 19, 2], [11, 14, 13, 2, 1, 1]])
TARGET = torch.tensor([[3, 20, 21, 22], [3, 24, 25, 26]])
CORRUPTED_TARGET = torch.tensor([[3, 20, 27, 22], [3, 24, 25, 26]])  # the first pair differs in both streams
CONFIGS = {
    "t5_v1_1": lambda: T5Config(**SHAPE, **TOKENS, gated_mlp=True, act_fn="gelu_new", n_buckets=8, max_distance=12),
    "bart_post_norm": lambda: BartConfig(**SHAPE, **TOKENS),
}
# T5's norms take their mean square in float32 (as T5 was trained and as Hugging Face runs it), so gradients through
# them hold float32's precision in a float64 model too
ATOL = {"t5_v1_1": 1e-6}


class Case(NamedTuple):
    model: EncoderDecoderTransformer
    clean: SourceTarget
    corrupted: SourceTarget
    mask: torch.Tensor | None
    metric: object
    atol: float = 1e-10


def random_case(name: str, model=None) -> Case:
    model = model or perturb(EncoderDecoderTransformer(CONFIGS[name](), dtype=torch.float64, seed=0))
    metric = logit_diff_per_row(torch.tensor([4, 7]), torch.tensor([9, 10]), torch.tensor([3, 2]))
    clean, corrupted = SourceTarget(SOURCE, TARGET), SourceTarget(CORRUPTED_SOURCE, CORRUPTED_TARGET)
    return Case(model, clean, corrupted, (SOURCE != 1).long(), metric, ATOL.get(name, 1e-10))


def translate_tiny_case() -> Case:
    """342605 -> 352605 ("forty" -> "fifty") and 12345 -> 12945, the second source padded; the metric reads the
    digit each corrupted word changes."""
    model = load_shipped("translate-tiny", dtype=torch.float64)
    clean, corrupted = encode_numbers([342605, 12345]), encode_numbers([352605, 12945])
    answer, wrong = clean.decoder_input[[0, 1], [2, 3]], corrupted.decoder_input[[0, 1], [2, 3]]
    metric = logit_diff_per_row(answer, wrong, torch.tensor([1, 2]))
    inputs = [SourceTarget(batch.source, clean.decoder_input) for batch in (clean, corrupted)]
    return Case(model, *inputs, clean.attention_mask, metric)


@pytest.fixture(scope="module", params=sorted(CONFIGS) + ["translate_tiny"])
def case(request):
    return translate_tiny_case() if request.param == "translate_tiny" else random_case(request.param)


@pytest.fixture(scope="module")
def edges(case):
    return edge_attribution_patching(case.model, case.clean, case.corrupted, case.metric, attention_mask=case.mask)


def metric_of(case: Case, inputs: SourceTarget, hooks=()) -> torch.Tensor:
    with torch.no_grad():
        logits = case.model.run_with_hooks(*inputs, fwd_hooks=list(hooks), attention_mask=case.mask)
        return case.metric(logits, torch.arange(2)).double()


def node_site(name: str) -> tuple[str, int | None]:
    """The hook a node writes from and its head (None: the whole activation), read off the node's name."""
    stack = "encoder" if name.startswith("enc.") else "decoder"
    bare = name.removeprefix("enc.")
    if bare == "input":
        return f"{stack}.blocks.0.hook_resid_pre", None
    if bare.startswith("MLP"):
        return f"{stack}.blocks.{bare[3:]}.hook_mlp_out", None
    layer, letter, head = re.fullmatch(r"L(\d+)([HC])(\d+)", bare).groups()
    return f"{stack}.blocks.{layer}.{'attn' if letter == 'H' else 'cross_attn'}.hook_z", int(head)


def attribution_patching(case: Case, hooks: list[str]) -> dict[str, torch.Tensor]:
    """``(clean - corrupt) * dm/dact`` at each hook, at the corrupted run: one forward and backward of our own."""
    _, clean = case.model.run_with_cache(*case.clean, names_filter=hooks, attention_mask=case.mask)
    kept = {}

    def keep(activation, hook):
        kept[hook.name] = activation

    with torch.enable_grad():
        logits = case.model.run_with_hooks(
            *case.corrupted, fwd_hooks=[(hook, keep) for hook in hooks], attention_mask=case.mask
        )
        grads = torch.autograd.grad(case.metric(logits, torch.arange(2)).sum(), [kept[hook] for hook in hooks])
    return {hook: (clean[hook] - kept[hook].detach()) * grad for hook, grad in zip(hooks, grads)}


def test_each_nodes_edges_sum_to_its_attribution_patching_score(case, edges):
    sites = [node_site(name) for name in edges.upstream]
    atp = attribution_patching(case, list(dict.fromkeys(hook for hook, _ in sites)))
    for row, (hook, head) in enumerate(sites):
        values = atp[hook] if head is None else atp[hook][:, :, head]
        expected = values.flatten(1).sum(dim=1)
        torch.testing.assert_close(edges.scores[row].sum(dim=0), expected, rtol=0, atol=case.atol)
    encoder = [row for row, name in enumerate(edges.upstream) if name.startswith("enc.")]
    assert float(edges.scores[encoder].abs().max()) > 1e-3  # the source's corruption reaches the metric


def test_the_final_streams_edges_sum_to_their_attribution_patching_scores(case, edges):
    """Pre-norm stacks: the logits' edges sum to the decoder's final stream's score, the cross-attention keys' and
    values' edges (pulled back through the encoder's final norm) to the encoder's final stream's."""
    if not case.model.capabilities.additive_residual:
        pytest.skip("a post-norm stream is not the sum of the writes")
    n_enc, n_dec = case.model.cfg.n_layers, case.model.cfg.n_decoder_layers
    finals = [f"decoder.blocks.{n_dec - 1}.hook_resid_post", f"encoder.blocks.{n_enc - 1}.hook_resid_post"]
    atp = attribution_patching(case, finals)
    logits = edges.scores[:, edges.readers.index("logits")].sum(dim=0)
    torch.testing.assert_close(logits, atp[finals[0]].flatten(1).sum(dim=1), rtol=0, atol=case.atol)
    keys_and_values = [j for j, name in enumerate(edges.readers) if re.fullmatch(r"L\d+CK\d+\.[kv]", name)]
    assert len(keys_and_values) == 2 * n_dec * case.model.cfg.n_heads
    torch.testing.assert_close(
        edges.scores[:, keys_and_values].sum(dim=(0, 1)), atp[finals[1]].flatten(1).sum(dim=1), rtol=0, atol=case.atol
    )


def test_the_graph_joins_the_streams_only_through_cross_attention(case, edges):
    up, read, edge = edges.upstream.index, edges.readers.index, edges.edge
    encoder_nodes = torch.tensor([name.startswith("enc.") for name in edges.upstream])
    encoder_readers = torch.tensor([name.startswith("enc.") or "CK" in name for name in edges.readers])
    assert not bool(edge[encoder_nodes][:, ~encoder_readers].any())  # no encoder node reads the decoder's stream
    assert not bool(edge[~encoder_nodes][:, encoder_readers].any())  # nothing flows back into the encoder
    assert bool(edge[up("enc.input"), encoder_readers].all()) and bool(edge[up("enc.L1H2")][read("L0CK3.v")])
    assert not edge[up("enc.L1H2"), read("enc.L1H2.q")] and edge[up("enc.L0H2"), read("enc.L1K0.k")]
    assert edges.reads["L0C2"] == ("L0C2.q", "L0CK2.k", "L0CK2.v") and edges.reads["enc.MLP0"] == ("enc.MLP0",)
    assert edge[up("L0H1"), read("L0C3.q")] and edge[up("L0C1"), read("MLP0")] and not edge[up("L0C1"), read("L0C1.q")]
    assert edge[up("input"), read("logits")] and not edge[up("MLP0"), read("MLP0")]
    assert bool((edges.scores[~edge] == 0).all())


@pytest.mark.parametrize("node", ["enc.L1H2", "L0C1", "enc.MLP0", "input"])
def test_a_circuit_of_every_edge_is_clean_of_none_corrupted_and_cutting_a_node_is_patching_it(case, edges, node):
    run = lambda kept, **options: run_circuit(  # noqa: E731
        case.model, case.clean, case.corrupted, case.metric, kept, attention_mask=case.mask, **options
    )
    clean, corrupted = metric_of(case, case.clean), metric_of(case, case.corrupted)
    torch.testing.assert_close(run(edges.edge.clone()), clean, rtol=0, atol=1e-10)
    torch.testing.assert_close(run(torch.zeros_like(edges.edge)), corrupted, rtol=0, atol=1e-10)
    site, head = node_site(node)
    _, cache = case.model.run_with_cache(*case.corrupted, names_filter=[site], attention_mask=case.mask)

    def patch(activation, hook):
        patched = activation.clone()
        where = (slice(None),) * 2 + (() if head is None else (head,))
        patched[where] = cache[site][where]
        return patched

    cut = edges.edge.clone()
    cut[edges.upstream.index(node)] = False
    torch.testing.assert_close(run(cut), metric_of(case, case.clean, [(site, patch)]), rtol=0, atol=1e-10)
    assert float((clean - corrupted).abs().min()) > 1e-3
    assert not torch.allclose(run(torch.zeros_like(edges.edge), ablation="mean"), corrupted)


def linear_encoder_decoder(name: str) -> EncoderDecoderTransformer:
    """A perturbed encoder-decoder made linear in its inputs: norms ``x w + b`` (a post-norm stack's final
    ``NoNorm`` stays), MLP activations the identity (a gated MLP's gate 1), and ``W_Q = W_K = 0`` in self- and
    cross-attention (every query attends uniformly to its keys, whatever the inputs)."""
    model = perturb(EncoderDecoderTransformer(CONFIGS[name](), dtype=torch.float64, seed=0))
    generator = torch.Generator().manual_seed(2)
    d_model = model.cfg.d_model
    with torch.no_grad():
        for stack in (model.encoder, model.decoder):
            for block in stack.blocks:
                for norm in ("ln1", "ln2", "ln3"):
                    if isinstance(getattr(block, norm, None), torch.nn.Module):
                        setattr(block, norm, LinearNorm(d_model, generator, torch.float64))
                for attn in (block.attn, getattr(block, "cross_attn", None)):
                    if attn is not None:
                        attn.W_Q.zero_()
                        attn.stored("W_K").zero_()
                block.mlp.act_fn = torch.ones_like if hasattr(block.mlp, "W_gate") else (lambda x: x)
            for norm in ("ln_final", "embed_ln"):
                if hasattr(getattr(stack, norm, None), "w"):
                    setattr(stack, norm, LinearNorm(d_model, generator, torch.float64))
    model.setup()
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def linear(request):
    case = random_case(request.param, linear_encoder_decoder(request.param))
    return case, edge_attribution_patching(
        case.model, case.clean, case.corrupted, case.metric, attention_mask=case.mask
    )


def test_on_a_linear_model_eap_ig_is_eap_and_sums_to_the_total_effect(linear):
    case, edges = linear
    options = dict(method="EAP-IG", steps=3, attention_mask=case.mask)
    total = metric_of(case, case.clean) - metric_of(case, case.corrupted)
    for ig_on in ("inputs", "activations"):
        ig = edge_attribution_patching(case.model, case.clean, case.corrupted, case.metric, ig_on=ig_on, **options)
        torch.testing.assert_close(ig.scores, edges.scores, rtol=0, atol=1e-10)
        torch.testing.assert_close(ig.scores[:, ig.readers.index("logits")].sum(dim=0), total, rtol=0, atol=1e-10)
    assert float(total.abs().min()) > 0.1


def test_on_a_linear_model_each_edges_score_is_patching_that_edge(linear):
    """``run_circuit`` with the pairs swapped runs the corrupted pair and feeds a dropped edge the clean write."""
    case, edges = linear
    corrupt = metric_of(case, case.corrupted)
    chosen = edges.edge.nonzero().tolist()
    cross = [(i, j) for i, j in chosen if "CK" in edges.readers[j]][::11]  # the encoder into the decoder
    for i, j in chosen[::37] + cross:
        alone = edges.edge.clone()
        alone[i, j] = False
        patched = run_circuit(case.model, case.corrupted, case.clean, case.metric, alone, attention_mask=case.mask)
        torch.testing.assert_close(edges.scores[i, j], patched - corrupt, rtol=0, atol=1e-10)
    assert len(cross) >= 4 and float(edges.scores[[i for i, _ in cross], [j for _, j in cross]].abs().max()) > 1e-3


def test_bad_pairs_are_refused():
    case = random_case("bart_post_norm")
    model, metric, mask = case.model, case.metric, build_graph(case.model).edge_mask()
    with pytest.raises(TypeError, match=r"an encoder-decoder reads \(source, target\) pairs"):
        edge_attribution_patching(model, SOURCE, CORRUPTED_SOURCE, metric, attention_mask=case.mask)
    with pytest.raises(ValueError, match="must have the same \\[batch, key_pos\\] shape"):
        edge_attribution_patching(model, (SOURCE[:, :4], TARGET), (CORRUPTED_SOURCE[:, :3], TARGET), metric)
    with pytest.raises(ValueError, match="the clean target \\(2, 4\\) and the corrupted target \\(2, 3\\)"):
        run_circuit(model, case.clean, (CORRUPTED_SOURCE, TARGET[:, :3]), metric, mask, attention_mask=case.mask)
    with pytest.raises(ValueError, match="clean source: .*padding id 1"):
        edge_attribution_patching(model, case.clean, case.corrupted, metric)  # a padded source needs its mask
    tiny = load_shipped("translate-tiny")
    with pytest.raises(ValueError, match="pair 0: the clean source has 4 real tokens and the corrupted 5"):
        clean, corrupted = (
            ["three hundred forty", "six thousand two hundred"],
            ["three hundred forty two", "six thousand two"],
        )
        edge_attribution_patching(tiny, (clean, None), (corrupted, None), metric)


def test_the_circuit_report_and_faithfulness_curve_run_on_translate_tiny(tmp_path):
    model = load_shipped("translate-tiny")
    rows = [
        dict(source="three hundred forty two", corrupted_source="three hundred fifty two", target="3", answer="4",
             wrong="5"),
        dict(source="twelve thousand", corrupted_source="thirteen thousand", target="1", answer="2", wrong="3"),
        dict(source="six", corrupted_source="nine", target="", answer="6", wrong="9"),
    ]  # fmt: skip
    task = load_seq2seq_task(model, rows, name="digits")
    assert task.attention_mask is not None and task.pos.tolist() == [1, 1, 0]
    clean, corrupted = task.evaluate(model), task.evaluate(model, corrupted=True)
    assert bool((clean > 0).all() and (corrupted < 0).all())  # the model translates both
    edges = edge_attribution_patching(
        model, task.clean, task.corrupted, task.metric, attention_mask=task.attention_mask
    )
    n_edges = int(edges.edge.sum())
    curve = faithfulness_curve(
        model, task.clean, task.corrupted, task.metric, edges, [0, 20, n_edges], attention_mask=task.attention_mask
    )
    torch.testing.assert_close(
        curve.normalized[[0, -1]], torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-5, rtol=0
    )
    report = circuit_report(model, task, steps=2, fraction=0.05)
    data = report["circuit"].data
    assert any(node.startswith("enc.") for node in data.nodes) and data.clean > data.corrupted
    assert [s.key for s in report.sections] == ["circuit", "nodes", "edges", "faithfulness"]
    tokens, patterns = _patterns(model, task, ["L0H1", "L0C2", "enc.L0H0"])  # a click shows a decoder head's
    assert tokens == ["<s>", "3"] and list(patterns) == ["L0H1"] and patterns["L0H1"].shape == (2, 2)
    csv = tmp_path / "digits.csv"
    csv.write_text(
        "source,corrupted_source,target,answer,wrong\nthree hundred forty two,three hundred fifty two,3,4,5\n"
    )
    from analysis.cli import EXIT_OK, EXIT_USAGE, main

    assert main(["circuit", "--model", "translate-tiny", "--task", "ioi"]) == EXIT_USAGE  # a decoder's task

    out = tmp_path / "circuit.html"
    argv = ["circuit", "--model", "translate-tiny", "--task", str(csv), "--steps", "2", "--out", str(out)]
    assert main(argv) == EXIT_OK and out.stat().st_size > 100_000

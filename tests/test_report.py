"""The HTML report: its sections, the numbers behind them, and the page it writes.

Numbers are checked against independent references: the analysis tools called
directly, dense weight products and the model's own forward pass.
"""

from html.parser import HTMLParser

import pytest
import torch
from plotly.offline import get_plotlyjs

from analysis.readouts import attention
from analysis.report import DISPLAY_ORDER, build_report
from analysis.report.sections.circuits import MAX_CIRCUIT_TOKENS
from analysis.report.sections.detectors import RANDOM_BATCH
from analysis.report.sections.interpretation import HEAD_SCORE_THRESHOLD
from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.text.tokens import offline_gpt2_tokenizer

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)

PROMPT = torch.tensor([0, 5, 9, 13, 7, 5, 9, 13, 7, 5])  # repeats, so every detector has targets


@pytest.fixture(scope="module")
def attn_only_report(attn_only_model):
    return build_report(attn_only_model, PROMPT, title="attention-only")


@pytest.fixture(scope="module")
def mlp_report(small_model):
    return build_report(small_model, PROMPT, title="with MLPs")


@pytest.fixture(scope="module")
def gpt2_shaped():
    """GPT-2's vocabulary, context and tokenizer with a narrow random body: every vocab-sized path runs."""
    cfg = TransformerConfig(
        d_model=128, n_layers=3, n_heads=4, d_head=32, d_mlp=512, d_vocab=50257, n_ctx=1024, name="gpt2-shaped"
    )
    return DemoTransformer(cfg, tokenizer=offline_gpt2_tokenizer(), seed=3).eval()


class _Tags(HTMLParser):
    """Every (tag, attributes) of a page, and the text of each script."""

    def __init__(self):
        super().__init__()
        self.tags, self.scripts, self._in_script = [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def _parse(page: str) -> _Tags:
    parser = _Tags()
    parser.feed(page)
    return parser


@pytest.mark.parametrize("report_name", ["attn_only_report", "mlp_report"])
def test_every_section_is_present_in_order(report_name, request):
    report = request.getfixturevalue(report_name)
    assert [section.key for section in report.sections] == list(DISPLAY_ORDER)
    for key in ("attention", "detectors", "circuits", "composition", "attribution"):
        assert report[key].figures, f"section {key} has no figure"
    assert report.summary and all(isinstance(line, str) and line for line in report.summary)
    with pytest.raises(KeyError, match="sections"):
        report["no-such-section"]


def test_neuron_section_is_skipped_with_a_note_for_attention_only(attn_only_report):
    neurons = attn_only_report["neurons"]
    assert neurons.data["skipped"] and not neurons.figures
    assert "attention-only" in neurons.paragraphs[0]


def test_neuron_section_finds_the_most_active_neuron(small_model, mlp_report):
    _, cache = small_model.run_with_cache(PROMPT)
    post = torch.stack([cache["post", layer][0] for layer in range(small_model.cfg.n_layers)])  # [layer, pos, d_mlp]
    best = post.amax(dim=1).flatten().argmax()
    assert mlp_report["neurons"].data["top_neuron"] == divmod(int(best), small_model.cfg.d_mlp)
    assert len(mlp_report["neurons"].figures) == 3


def test_attention_view_holds_every_head_and_shows_one(small_model, mlp_report):
    _, cache = small_model.run_with_cache(PROMPT)
    fig = mlp_report["attention"].figures[0]
    n_layers, n_heads = small_model.cfg.n_layers, small_model.cfg.n_heads
    assert len(fig.data) == n_layers * n_heads
    assert sum(bool(trace.visible) for trace in fig.data) == 1
    buttons = fig.layout.updatemenus[0].buttons
    assert [button.label for button in buttons] == [f"L{l}H{h}" for l in range(n_layers) for h in range(n_heads)]
    for index, trace in enumerate(fig.data):
        expected = cache["pattern", index // n_heads][0, index % n_heads]
        # the page stores 4 decimals
        torch.testing.assert_close(torch.tensor(trace.z, dtype=torch.float32), expected, atol=5.1e-5, rtol=0)


def test_detector_scores_match_the_detectors_run_directly(attn_only_model, attn_only_report):
    data = attn_only_report["detectors"].data
    expected = attention.induction_head_scores(
        attn_only_model, data["seq_len"], RANDOM_BATCH, seed=0, bos=int(PROMPT[0])
    )
    torch.testing.assert_close(data["random"]["induction"], expected)
    _, cache = attn_only_model.run_with_cache(PROMPT)
    torch.testing.assert_close(data["prompt"]["previous_token"], attention.previous_token_scores(cache))


def test_circuits_are_dense_products_on_the_prompts_tokens(small_model, mlp_report):
    data = mlp_report["circuits"].data
    ids = torch.tensor(data["token_ids"])
    assert ids.tolist() == list(dict.fromkeys(PROMPT.tolist()))[:MAX_CIRCUIT_TOKENS]
    W_E, W_U = small_model.W_E[ids], small_model.W_U[:, ids]
    for head in data["heads"]:
        l, h = head["layer"], head["head"]
        qk = W_E @ small_model.W_Q[l, h] @ small_model.W_K[l, h].T @ W_E.T
        ov = W_E @ small_model.W_V[l, h] @ small_model.W_O[l, h] @ W_U
        torch.testing.assert_close(head["qk"], qk, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(head["ov"], ov, atol=1e-5, rtol=1e-4)
        assert head["qk"].shape == (len(ids), len(ids))


def test_logit_lens_final_row_is_the_models_prediction(small_model, mlp_report):
    data = mlp_report["attribution"].data
    probs = small_model(PROMPT)[0].softmax(-1)  # [pos, d_vocab]
    expected = probs[:-1].gather(-1, PROMPT[1:, None])[:, 0]
    torch.testing.assert_close(data["lens_next_token_prob"][-1], expected, atol=1e-5, rtol=1e-4)
    assert data["predicted"] == int(probs[-1].argmax())
    # the direct attributions add up to the logit they explain
    assert data["attribution_total"] == pytest.approx(data["logit"], abs=1e-3)


def test_composition_section_for_one_layer_explains_itself():
    cfg = TransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=None, d_vocab=20, n_ctx=16)
    report = build_report(DemoTransformer(cfg, seed=0), torch.tensor([1, 2, 1, 2]), title="one layer")
    assert not report["composition"].figures
    assert "one layer" in report["composition"].paragraphs[0]


def test_interpretation_names_exactly_the_heads_above_threshold(attn_only_model, attn_only_report):
    scores = attention.induction_head_scores(
        attn_only_model, attn_only_report["detectors"].data["seq_len"], RANDOM_BATCH, seed=0, bos=int(PROMPT[0])
    )
    named = {line.split()[0] for line in attn_only_report.summary if " is an induction head" in line}
    expected = {
        f"L{l}H{h}"
        for l in range(scores.shape[0])
        for h in range(scores.shape[1])
        if scores[l, h] >= HEAD_SCORE_THRESHOLD
    }
    assert named == expected
    if not expected:
        assert any(line.startswith("No induction head") for line in attn_only_report.summary)


def test_html_is_self_contained(mlp_report):
    page = mlp_report.to_html()
    parsed = _parse(page)
    for tag, attrs in parsed.tags:
        for name in ("src", "href", "data"):
            value = attrs.get(name) or ""
            assert not value.startswith(("http://", "https://", "//")), (
                f"<{tag} {name}={value!r}> fetches from the network"
            )
    assert not any(tag == "link" for tag, _ in parsed.tags)
    # plotly.js embedded exactly once, one plot div and one newPlot call per figure, no MathJax
    bundle_head = get_plotlyjs()[:300]
    assert sum(bundle_head in script for script in parsed.scripts) == 1
    n_figures = len(mlp_report.figures)
    assert sum("plotly-graph-div" in (attrs.get("class") or "") for tag, attrs in parsed.tags) == n_figures
    assert page.count("Plotly.newPlot(") == n_figures
    assert "MathJax.Hub.Config" not in page


def test_token_text_is_escaped(attn_only_model):
    labels = ["<script>alert(1)</script>"] + [f"t{i}" for i in range(len(PROMPT) - 1)]
    report = build_report(attn_only_model, PROMPT, title="<b>title</b>", str_tokens=labels)
    page = report.to_html()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>title</b>" not in page


def test_save_writes_the_page(attn_only_report, tmp_path):
    path = attn_only_report.save(tmp_path / "nested" / "report.html")
    assert path.read_text(encoding="utf-8") == attn_only_report.to_html()


def test_gpt2_shaped_model_reports_on_text(gpt2_shaped):
    text = "The cat sat on the mat. The cat sat on the"
    report = build_report(gpt2_shaped, text, title="gpt2-shaped")
    tokens = gpt2_shaped.to_tokens(text)
    assert report["tokens"].data["tokens"] == tokens[0].tolist()
    assert report["tokens"].data["str_tokens"] == gpt2_shaped.to_str_tokens(tokens[0])
    assert [section.key for section in report.sections] == list(DISPLAY_ORDER)
    assert not report["neurons"].data["skipped"]
    # circuits stay on the prompt's distinct tokens, never d_vocab x d_vocab
    n_distinct = len(set(tokens[0].tolist()))
    assert all(head["ov"].shape == (n_distinct, n_distinct) for head in report["circuits"].data["heads"])
    assert report["attribution"].data["predicted"] == int(gpt2_shaped(tokens)[0, -1].argmax())


@pytest.mark.parametrize(
    "tokens, labels, error, match",
    [
        (torch.tensor([[1, 2], [3, 4]]), None, ValueError, "one prompt"),
        (torch.tensor([1, 2, 3]), ["a", "b"], ValueError, "labels"),
        (torch.tensor([1, 2, 99]), None, ValueError, "d_vocab"),
        (torch.tensor([1.0, 2.0]), None, TypeError, "integer"),
    ],
)
def test_bad_input_is_refused(attn_only_model, tokens, labels, error, match):
    with pytest.raises(error, match=match):
        build_report(attn_only_model, tokens, title="bad", str_tokens=labels)


def test_long_prompts_show_the_first_positions_only(attn_only_model, monkeypatch):
    import analysis.report.context as sections

    n_heads = attn_only_model.cfg.n_layers * attn_only_model.cfg.n_heads
    monkeypatch.setattr(sections, "MAX_PATTERN_CELLS", n_heads * 6 * 6)  # room for 6 x 6 patterns
    report = build_report(attn_only_model, PROMPT, title="capped")
    fig = report["attention"].figures[0]
    assert all(len(trace.z) == 6 and len(trace.z[0]) == 6 for trace in fig.data)
    assert any("shows the first 6" in text for text in report["attention"].paragraphs)
    assert all(head["positional_qk"].shape == (6, 6) for head in report["circuits"].data["heads"])

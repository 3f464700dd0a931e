"""A self-contained HTML report of one model on one prompt.

``build_report(model, tokens, title=...)`` runs the model on the prompt with every
hook cached, applies the analysis tools and returns a ``Report``: a list of
``ReportSection`` (the model card, the prompt's tokens, a written interpretation,
attention patterns of every head, head-detector scores, QK/OV circuits of the
top heads, composition scores, MLP neurons, logit lens and direct logit
attribution), each holding its numbers in ``section.data`` (a typed dataclass) and its
plotly figures. ``report.summary`` is the interpretation as lines of text;
``report.save(path)`` writes one HTML file that opens offline: plotly's JavaScript is
embedded once in the page head, and nothing is fetched from the network (no CDN, web
fonts or MathJax).

Which sections a model gets follows its capabilities (``model.capabilities``), one
section per file in ``analysis.report.sections``: the detectors follow its attention
(causal or bidirectional), the logit lens and DLA need logits linear in an additive
residual stream, a bidirectional post-norm model (BERT) gets its sentence embedding's
exact attribution instead, a model with mixtures of experts (``has_experts``) gets its expert
usage and expert attribution, and its expert neurons in place of the MLP neurons, and a
section ``"omitted"`` lists whatever is left out and why.
An encoder-decoder (a writer reads a source: ``model.writers_that("reads_source")``) gets its own sections
(``analysis.report.encoder_decoder``): the translation, cross-attention as source x target
heatmaps, alignment, direct logit attribution through its decoder and cross-attention
heads, and the effect of corrupting each source word.

>>> import torch
>>> from interp_transformer import DemoTransformer, TransformerConfig
>>> cfg = TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=None, d_vocab=20, n_ctx=16)
>>> report = build_report(DemoTransformer(cfg, seed=0), torch.tensor([0, 3, 4, 5, 3, 4, 5]), title="tiny")
>>> [section.key for section in report.sections]  # doctest: +NORMALIZE_WHITESPACE
['model', 'tokens', 'interpretation', 'attention', 'detectors', 'circuits', 'composition', 'neurons', 'attribution']
>>> report["neurons"].paragraphs[0]
'This model is attention-only (d_mlp=None): it has no MLP neurons to show.'
"""

import numbers
from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from .. import _checks
from .context import ReportContext, ReportSection, SectionData
from .encoder_decoder import ENCODER_DECODER_PAGE_ORDER, encoder_decoder_builders, encoder_decoder_inputs
from .page import Report
from .sections.attention_patterns import attention_section
from .sections.circuits import circuits_section
from .sections.composition import composition_section
from .sections.detectors import detectors_section
from .sections.experts import expert_neurons_section, experts_section
from .sections.interpretation import interpretation_section
from .sections.logits import logits_section
from .sections.model_card import model_section
from .sections.neurons import neurons_section
from .sections.omitted import has_output_attribution, omitted_parts, omitted_section
from .sections.output_attribution import output_attribution_section
from .sections.prompt_tokens import tokens_section

# every section, in page order; a model shows those its capabilities give
PAGE_ORDER = (
    "model",
    "tokens",
    "interpretation",
    "omitted",
    "attention",
    "detectors",
    "circuits",
    "composition",
    "experts",
    "neurons",
    "attribution",
)
DISPLAY_ORDER = tuple(key for key in PAGE_ORDER if key not in ("omitted", "experts"))  # a pre-norm decoder's page
# a pre-norm decoder with mixtures of experts
EXPERTS_DISPLAY_ORDER = tuple(key for key in PAGE_ORDER if key != "omitted")
ENCODER_DISPLAY_ORDER = tuple(key for key in PAGE_ORDER if key != "experts")  # a bidirectional post-norm encoder's page
FIRST_TOKEN = "first"  # default ``bos`` of build_report: the prompt's first token


def section_builders(ctx: ReportContext) -> list:
    """``(key, builder)`` of the sections this model gets, in the order they are computed (later ones read earlier)."""
    model = ctx.model
    if model.writers_that("reads_source"):
        return encoder_decoder_builders(ctx)
    builders = [
        ("model", model_section),
        ("tokens", tokens_section),
        ("detectors", detectors_section),
        ("attention", attention_section),
        ("circuits", circuits_section),
        ("composition", composition_section),
    ]
    if model.writers_that("routes_tokens"):  # a mixture's neurons belong to one expert each
        builders += [("experts", experts_section), ("neurons", expert_neurons_section)]
    else:
        builders.append(("neurons", neurons_section))
    if model.capabilities.linear_logits:
        builders.append(("attribution", logits_section))
    elif has_output_attribution(model):
        builders.append(("attribution", output_attribution_section))
    if omitted_parts(ctx):
        builders.append(("omitted", omitted_section))
    return builders + [("interpretation", interpretation_section)]


def _prompt_tokens(model: _checks.AnyModel, tokens) -> Tensor:
    tokens = model.prepare_tokens(tokens)
    if tokens.shape[0] != 1:
        raise ValueError(
            f"build_report takes one prompt: a single text or tokens [pos] / [1, pos], got {tuple(tokens.shape)}"
        )
    return tokens


def _token_labeller(model: _checks.AnyModel):
    if model.tokenizer is None:
        return lambda token_id: str(token_id)
    return lambda token_id: model.to_str_tokens(torch.tensor([token_id]))[0]


@torch.no_grad()
def build_report(
    model: _checks.AnyModel,
    tokens: Int[Tensor, "pos"] | Int[Tensor, "1 pos"] | str,
    *,
    title: str = "interp_transformer report",
    str_tokens: Sequence[str] | None = None,
    metadata: dict | None = None,
    bos: int | None | str = FIRST_TOKEN,
    progress: bool = False,
    decoder_input: Tensor | None = None,
) -> Report:
    """Analyse ``model`` on one prompt and return the ``Report`` (call ``.save(path)`` for the HTML).

    ``tokens``: ``[pos]`` or ``[1, pos]`` ids, or text if the model has a tokenizer.
    ``str_tokens``: one label per token (default: decoded by the tokenizer, else the ids).
    ``metadata``: extra rows for the model card (e.g. ``{"source": "gpt2"}``); a ``"curve"``
    entry with ``steps``, ``first_half_loss`` and ``repeated_half_loss`` is drawn as the
    training curve. ``bos``: token put before the repeated random sequences the head
    detectors run on (default the prompt's first token, which is BOS for text prompts;
    ``None`` for none). ``progress`` shows a progress bar over the sections.

    For a bidirectional model the prompt is one unpadded text (``[CLS] ... [SEP]``) or ids;
    the detectors' random sequences are framed by ``bos`` and the prompt's last token
    (``[SEP]`` for text). For an encoder-decoder the prompt is the source, and
    ``decoder_input [1, target_pos]`` the target the decoder reads (default: its greedy
    translation of the source).
    """
    _checks.check_model(model)
    tokens = _prompt_tokens(model, tokens)
    label = _token_labeller(model)
    if str_tokens is None:
        str_tokens = [label(token_id) for token_id in tokens[0].tolist()]
    str_tokens = _checks.check_labels(str_tokens, tokens.shape[1], "pos")
    if bos == FIRST_TOKEN:
        bos = int(tokens[0, 0])
    elif bos is not None and (isinstance(bos, bool) or not isinstance(bos, numbers.Integral)):
        raise TypeError(f"bos must be a token id, None or {FIRST_TOKEN!r}, got {bos!r}")
    eos = int(tokens[0, -1]) if not model.capabilities.causal and tokens.shape[1] >= 2 else None
    forward = encoder_decoder_inputs(model, tokens, decoder_input)  # {} unless the model has cross-attention
    output, cache = model.run_with_cache(tokens, **forward)
    target = forward.get("decoder_input")
    ctx = ReportContext(
        model,
        tokens,
        str_tokens,
        cache,
        output,
        label,
        bos,
        dict(metadata or {}),
        eos=eos,
        decoder_input=target,
        target_str_tokens=None if target is None else [label(token_id) for token_id in target[0].tolist()],
    )
    for key, builder in tqdm(section_builders(ctx), desc="building report", disable=not progress, unit="section"):
        ctx.sections[key] = builder(ctx)
    order = ENCODER_DECODER_PAGE_ORDER if model.writers_that("reads_source") else PAGE_ORDER
    sections = [ctx.sections[key] for key in order if key in ctx.sections]
    return Report(title, sections, summary=list(ctx.sections["interpretation"].data.lines))


__all__ = [
    "DISPLAY_ORDER",
    "ENCODER_DECODER_PAGE_ORDER",
    "ENCODER_DISPLAY_ORDER",
    "EXPERTS_DISPLAY_ORDER",
    "PAGE_ORDER",
    "Report",
    "ReportContext",
    "ReportSection",
    "SectionData",
    "build_report",
    "section_builders",
]

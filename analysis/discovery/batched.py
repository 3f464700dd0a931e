"""Batched activation patching: many (component, position) sites in one forward pass.

Activation patching runs the model on the corrupted prompts with one site (a head's ``z``,
an attention or MLP output, the residual stream, a neuron; at one position or all) set to
its value on the clean prompts, and reads a metric per prompt. Done one site at a time it
costs one forward per site. Here the corrupted batch is repeated once per site along the
batch axis, row group ``s`` getting site ``s`` patched::

    rows of a chunk = [site 0: prompt 0 .. B-1 | site 1: prompt 0 .. B-1 | ...]
    result[s, b]    = metric(model(corrupted) with site s := clean site s)[b]

so one forward answers a whole chunk of sites. Chunks are sized to a memory budget
(``memory_budget``: bytes of activations one forward may hold; an estimate, see
``rows_per_chunk``) or given (``sites_per_chunk``). Every row is computed exactly as it
is alone: attention never mixes rows and padding is masked, so the result equals
``patch_sites_one_by_one`` (the loop) up to float rounding, and a padded batch gives each
prompt what it gets alone.

Clean and corrupted prompts must pair position by position: pairs whose token lengths
differ are refused, naming the pair. Sites come from ``sites(model, component, ...)``, which
asks each block's writers (``components.writers``) for its heads' and neurons' hooks, so it
works on every decoder and encoder the library loads (grouped-query attention included: a site
is one query head; an encoder's metric reads its masked-LM logits). The metric a row is scored by
(``logit_diff_per_row``) and the check every tool reads it through (``row_values``) are ``metrics``.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .. import _checks
from .metrics import RowMetric, logit_diff_per_row, row_values  # logit_diff_per_row re-exported (__all__)

COMPONENTS = ("heads", "attn_out", "mlp_out", "resid_pre", "resid_mid", "resid_post", "neurons")
DEFAULT_MEMORY_BUDGET = 2**30
STACK_STEPS = ("prepare_inputs", "embed", "enter_stream", "run_blocks", "ln_final", "unembed")  # to start at a block


@dataclass(frozen=True)
class Site:
    """One place to patch: ``activation[:, pos][..., *index]`` of hook ``hook`` (``pos`` None: every position).

    ``layer`` is the block the site is in (-1 for an SAE's features, which sit on a hook).
    """

    hook: str
    layer: int
    index: tuple[int, ...]
    pos: int | None
    label: str


def _positions(positions, n_pos: int | None) -> list[int | None]:
    if positions is None:
        return [None]
    if positions == "each":
        if n_pos is None:
            raise ValueError("positions='each' needs n_pos, the prompts' length")
        return list(range(_checks.count(n_pos, "n_pos", minimum=1)))
    if isinstance(positions, int) and not isinstance(positions, bool):
        return [positions]
    if isinstance(positions, (list, tuple)) and all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
        return list(positions)
    raise ValueError(f"positions must be None (all at once), 'each', an int or a list of ints, got {positions!r}")


def sites(
    model: _checks.AnyModel,
    component: str,
    *,
    positions: None | str | int | Sequence[int] = None,
    n_pos: int | None = None,
    layers: Sequence[int] | None = None,
    units: Sequence[int] | None = None,
) -> list[Site]:
    """The sites of one ``component`` (``COMPONENTS``) in ``layers`` (default all), at ``positions``.

    ``positions``: None patches every position at once; ``"each"`` one site per position (give
    ``n_pos``); an int or a list of ints. ``units`` picks heads (``"heads"``) or neurons
    (``"neurons"``; default every one, which for neurons is many sites).
    """
    _checks.check_model(model)
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {COMPONENTS}, got {component!r}")
    layers = _checks.layer_list(model, layers)
    found = []
    for layer in layers:
        block = model.blocks[layer]
        if component in ("heads", "neurons"):
            writer = block.writer("attn" if component == "heads" else "mlp")
            kind = "head" if component == "heads" else "neuron"
            if writer is None or writer.units is None or writer.units.kind != kind:
                raise ValueError(
                    f"sites({component!r}): block {layer} has no {kind}s to patch "
                    + ("(an attention-only block)" if writer is None else "(a mixture of experts: patch mlp_out)")
                )
            count = writer.units.weight.shape[0]
            chosen = range(count) if units is None else units
            for unit in chosen:
                if not 0 <= unit < count:
                    raise ValueError(f"sites({component!r}): unit {unit} out of range [0, {count}) in block {layer}")
            targets = [(writer.units.hook, (unit,), f"L{layer}{writer.units.letter}{unit}") for unit in chosen]
        else:
            name = model.act_name(component, layer)
            if name not in model.hook_dict:
                raise ValueError(f"sites({component!r}): block {layer} has no {name}")
            targets = [(name, (), f"L{layer} {component}")]
        for hook, index, label in targets:
            for pos in _positions(positions, n_pos):
                found.append(Site(hook, layer, index, pos, label if pos is None else f"{label} @{pos}"))
    return found


def sae_feature_sites(
    model: _checks.AnyModel,
    sae,
    *,
    features: Sequence[int] | None = None,
    positions: None | str | int | Sequence[int] = None,
    n_pos: int | None = None,
) -> list[Site]:
    """Sites of an SAE's (or transcoder's) features, ``<hook>.hook_sae_acts_post[..., feature]``.

    Use them inside ``splice_saes(model, [sae])`` (``use_error_term=True`` keeps the model's own
    output until a feature changes), where the SAE's hook points are the model's: patching a
    feature clean changes what the SAE writes, and through it the rest of the run.
    """
    hook = sae.hook_sae_acts_post.name  # named by the model while the SAE is spliced into it
    if hook is None or model.hook_dict.get(hook) is not sae.hook_sae_acts_post:
        raise ValueError(
            "the SAE's hook_sae_acts_post is not a hook point of this model now: build SAE feature sites inside "
            "splice_saes(model, [sae]), where the SAE's hooks are the model's"
        )
    chosen = range(sae.d_sae) if features is None else features
    found = []
    for feature in chosen:
        if isinstance(feature, bool) or not isinstance(feature, int) or not 0 <= feature < sae.d_sae:
            raise ValueError(f"sae_feature_sites: feature {feature!r} out of range [0, {sae.d_sae})")
        for pos in _positions(positions, n_pos):
            label = f"{sae.hook_name} F{feature}"
            found.append(Site(hook, -1, (feature,), pos, label if pos is None else f"{label} @{pos}"))
    return found


def _paired(model, clean, corrupted, attention_mask) -> tuple[Tensor, Tensor, Tensor | None]:
    """Clean and corrupted ids ``[batch, pos]`` and their one mask, refusing pairs whose token lengths differ."""
    texts = isinstance(clean, str) or (
        isinstance(clean, list) and bool(clean) and all(isinstance(t, str) for t in clean)
    )
    if texts:
        clean, corrupted = (
            [clean] if isinstance(clean, str) else clean,
            [corrupted] if isinstance(corrupted, str) else corrupted,
        )
        if len(clean) != len(corrupted):
            raise ValueError(f"{len(clean)} clean prompts and {len(corrupted)} corrupted ones: they pair one to one")
        for side, texts_ in (("clean", clean), ("corrupted", corrupted)):
            _checks.nonempty_texts(texts_, f"{side} prompt")
        for pair, (a, b) in enumerate(zip(clean, corrupted)):
            n_a, n_b = (model.to_tokens(text).shape[1] for text in (a, b))
            if n_a != n_b:
                raise ValueError(
                    f"pair {pair}: the clean prompt {a!r} is {n_a} tokens and the corrupted {b!r} is {n_b}; positions "
                    "must line up, so each pair must have the same token length"
                )
        if attention_mask is not None:
            raise ValueError("prompts given as text are padded with their own mask: pass token ids to give a mask")
        clean_tm, corrupted_tm = model.to_tokens_and_mask(clean), model.to_tokens_and_mask(corrupted)
        attention_mask = None if bool(clean_tm.attention_mask.all()) else clean_tm.attention_mask
        return clean_tm.tokens, corrupted_tm.tokens, attention_mask
    clean, corrupted = model.prepare_tokens(clean), model.prepare_tokens(corrupted)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean tokens {tuple(clean.shape)} and corrupted tokens {tuple(corrupted.shape)} must have the same "
            "[batch, pos] shape so that positions line up"
        )
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask).to(clean.device)
        if attention_mask.shape != clean.shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, the tokens {tuple(clean.shape)}")
    return clean, corrupted, attention_mask


def rows_per_chunk(model: _checks.AnyModel, n_pos: int, memory_budget: int) -> int:
    """How many rows one forward may hold: ``memory_budget`` over an estimate of one row's activations.

    The estimate per row is ``n_pos * (d_vocab + 16 * d_model + 2 * d_mlp)`` values of the
    model's dtype: the logits, and the residual stream's working set with an MLP's hidden layer.
    """
    n_pos = _checks.count(n_pos, "n_pos", minimum=1)
    memory_budget = _checks.count(memory_budget, "memory_budget", minimum=1)
    return max(1, memory_budget // row_bytes(model, n_pos))


def row_bytes(model: _checks.AnyModel, n_pos: int) -> int:
    """The estimate ``rows_per_chunk`` divides the budget by: one row's activations in bytes."""
    cfg = model.cfg
    itemsize = model.W_E.element_size()
    return n_pos * (cfg.d_vocab + 16 * cfg.d_model + 2 * (getattr(cfg, "d_mlp", None) or 0)) * itemsize


def _check_sites(model, sites_: Sequence[Site], n_pos: int) -> None:
    if not sites_ or not all(isinstance(site, Site) for site in sites_):
        raise ValueError("sites must be a non-empty list of Site (from analysis.discovery.sites)")
    for site in sites_:
        if site.hook not in model.hook_dict:
            raise ValueError(f"site {site.label!r}: this model has no hook {site.hook!r}")
        if site.pos is not None and not -n_pos <= site.pos < n_pos:
            raise ValueError(f"site {site.label!r}: position {site.pos} is outside the prompts' {n_pos} positions")


def _patcher(sites_: Sequence[Site], clean: dict, batch: int):
    """One forward hook per hook name, patching each of its sites' row group from the clean activations."""

    def patch(activation: Tensor, hook) -> Tensor:
        patched = activation.clone()
        for group, site in sites_:
            if site.hook != hook.name:
                continue
            rows = slice(group * batch, (group + 1) * batch)
            where = (slice(None) if site.pos is None else site.pos,) + site.index
            patched[(rows,) + where] = clean[site.hook][(slice(None),) + where]
        return patched

    return patch


def _evaluate(metric: RowMetric, logits: Tensor, prompt: Tensor, tool: str, where=None) -> Tensor:
    return row_values(metric, logits, prompt, tool, where).detach().to(torch.float64)


@torch.no_grad()
def patch_sites(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    sites_: Sequence[Site],
    *,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    sites_per_chunk: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool = True,
) -> Float[Tensor, "site batch"]:
    """``result[s, b]``: the metric on prompt ``b`` with site ``s`` patched clean, many sites per forward.

    ``clean_tokens``/``corrupted_tokens``: ``[batch, pos]`` ids (with one ``attention_mask`` for
    both) or paired texts. ``metric(logits, prompt) -> [rows]`` (``logit_diff_per_row``).
    """
    model, clean, corrupted, mask = _start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    batch, n_pos = clean.shape
    _check_sites(model, sites_, n_pos)
    if sites_per_chunk is None:
        sites_per_chunk = max(1, rows_per_chunk(model, n_pos, memory_budget) // batch)
    sites_per_chunk = _checks.count(sites_per_chunk, "sites_per_chunk", minimum=1)
    clean_acts = _clean_activations(model, clean, mask, sites_)
    order = sorted(range(len(sites_)), key=lambda index: sites_[index].layer)  # chunks of nearby layers
    ordered = [sites_[index] for index in order]
    starts = _block_inputs(model, corrupted, mask)
    results = []
    chunks = range(0, len(ordered), sites_per_chunk)
    for start in tqdm(chunks, desc="patching sites", disable=not progress):
        chunk = list(enumerate(ordered[start : start + sites_per_chunk]))
        n = len(chunk)
        tokens = corrupted.repeat(n, 1)
        chunk_mask = None if mask is None else mask.repeat(n, 1)
        hooks = [(name, _patcher(chunk, clean_acts, batch)) for name in dict.fromkeys(site.hook for _, site in chunk)]
        first = min(site.layer for _, site in chunk)
        logits = _run_from(model, tokens, chunk_mask, hooks, first, starts)
        prompt = torch.arange(batch, device=logits.device).repeat(n)
        where = lambda row, chunk=chunk: f"site {chunk[row // batch][1].label!r}, prompt {row % batch}"  # noqa: E731
        results.append(_evaluate(metric, logits, prompt, "patch_sites", where).reshape(n, batch))
    by_order = torch.cat(results)
    return by_order[torch.tensor(order).argsort()]


def _block_inputs(model, corrupted: Tensor, mask: Tensor | None) -> list[Tensor] | None:
    """The corrupted run's stream entering every block (None where the model is not a decoder stack)."""
    if not all(callable(getattr(model, part, None)) for part in STACK_STEPS):
        return None
    names = [model.act_name("resid_pre", layer) for layer in range(model.cfg.n_layers)]
    kwargs = {} if mask is None else {"attention_mask": mask}
    _, cache = model.run_with_cache(corrupted, names_filter=names, **kwargs)
    return [cache[name] for name in names]


def _run_from(model, tokens: Tensor, mask: Tensor | None, hooks: list, layer: int, starts) -> Tensor:
    """The logits of ``tokens`` with ``hooks``, the blocks before ``layer`` skipped where they cannot differ.

    Every row of a chunk is the corrupted run until its site's block: each row group enters block
    ``layer`` with the corrupted run's stream (computed once), which is what those blocks would give.
    """
    if starts is None or layer <= 0:
        return model.run_with_hooks(tokens, fwd_hooks=hooks, **({} if mask is None else {"attention_mask": mask}))
    with model.hooks(fwd_hooks=hooks):
        ids, layout = model.prepare_inputs(tokens, mask)
        _, layout = model.enter_stream(model.embed(ids), ids, layout)
        repeats = ids.shape[0] // starts[layer].shape[0]
        residual = model.run_blocks(starts[layer].repeat(repeats, 1, 1), layout, slice(layer, None))
        return model.unembed(model.ln_final(residual))


@torch.no_grad()
def patch_sites_one_by_one(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    sites_: Sequence[Site],
    *,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    progress: bool = True,
) -> Float[Tensor, "site batch"]:
    """The reference ``patch_sites`` must equal: one whole forward per site, ``batch`` rows, nothing skipped."""
    model, clean, corrupted, mask = _start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    batch, n_pos = clean.shape
    _check_sites(model, sites_, n_pos)
    clean_acts = _clean_activations(model, clean, mask, sites_)
    kwargs = {} if mask is None else {"attention_mask": mask}
    prompt = torch.arange(batch, device=clean.device)
    rows = []
    for site in tqdm(sites_, desc="patching one site at a time", disable=not progress):
        logits = model.run_with_hooks(
            corrupted, fwd_hooks=[(site.hook, _patcher([(0, site)], clean_acts, batch))], **kwargs
        )
        where = lambda row, site=site: f"site {site.label!r}, prompt {row}"  # noqa: E731
        rows.append(_evaluate(metric, logits, prompt, "patch_sites_one_by_one", where))
    return torch.stack(rows)


def _start(model, clean_tokens, corrupted_tokens, metric, attention_mask):
    _checks.check_model(model)
    if model.writers_that("reads_source"):
        raise ValueError(
            "batched patching runs a decoder on its prompts; an encoder-decoder's source/target patching is "
            "analysis.patching.source"
        )
    if not callable(metric):
        raise TypeError(f"metric must be a callable (logits, prompt) -> [rows], got {type(metric).__name__}")
    clean, corrupted, mask = _paired(model, clean_tokens, corrupted_tokens, attention_mask)
    return model, clean, corrupted, mask


def _clean_activations(model, clean: Tensor, mask: Tensor | None, sites_: Sequence[Site]) -> dict[str, Tensor]:
    names = list(dict.fromkeys(site.hook for site in sites_))
    kwargs = {} if mask is None else {"attention_mask": mask}
    _, cache = model.run_with_cache(clean, names_filter=names, **kwargs)
    return {name: cache[name] for name in names}


def patching_figure(result: Float[Tensor, "site batch"], sites_: Sequence[Site], title: str = "activation patching"):
    """A heatmap of the metric per site, averaged over prompts: one row per unit, one column per position.

    Sites patched at every position at once get the column ``"all"``.
    """
    import plotly.graph_objects as go

    if result.ndim != 2 or result.shape[0] != len(sites_):
        raise ValueError(f"result must be [site, batch] with {len(sites_)} sites, got shape {tuple(result.shape)}")
    mean = result.mean(dim=1)
    rows = list(dict.fromkeys(site.label.split(" @")[0] for site in sites_))
    columns = list(dict.fromkeys("all" if site.pos is None else str(site.pos) for site in sites_))
    grid = torch.full((len(rows), len(columns)), float("nan"), dtype=torch.float64)
    for value, site in zip(mean.tolist(), sites_):
        grid[rows.index(site.label.split(" @")[0]), columns.index("all" if site.pos is None else str(site.pos))] = value
    bound = float(grid.nan_to_num(0).abs().max()) or 1.0
    fig = go.Figure(go.Heatmap(z=grid.numpy(), x=columns, y=rows, colorscale="RdBu", zmid=0, zmin=-bound, zmax=bound))
    fig.update_layout(title=dict(text=title), xaxis_title="position", yaxis_title="site", yaxis_autorange="reversed")
    return fig


__all__ = [
    "COMPONENTS",
    "DEFAULT_MEMORY_BUDGET",
    "RowMetric",
    "Site",
    "logit_diff_per_row",
    "patch_sites",
    "patching_figure",
    "patch_sites_one_by_one",
    "row_bytes",
    "rows_per_chunk",
    "sae_feature_sites",
    "sites",
]

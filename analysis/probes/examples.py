"""What a probe reads: the examples as token ids, one label per probed position, and the activations there.

Every check on a probe's input lives here, where the input enters: labels of another length than the
examples (or than an example's tokens), one class only, a hook that does not exist (``KeyError`` with the
closest names, through the model's own name table), a layer or head out of range, non-finite activations.

Two ways to label (``position``):

- ``"last"``: one label per example, read at its last token (``labels[i]`` for ``examples[i]``);
- ``"all"``: one label per token (``labels[i][p]`` for token ``p`` of example ``i``, BOS included when the
  text is tokenized with one); ``None`` leaves a position out.

A probe site is a hook at a layer (``resid_post`` of block 3: ``[batch, pos, d_model]``, trailing axes
flattened) or, for ``result``, one head's write to the residual stream ``z_h W_O[h]`` (``[batch, pos,
d_model]``), computed on demand from the cached ``z`` and ``W_O`` (DESIGN.md section 3).
"""

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

POSITIONS = ("last", "all")
HEAD_HOOK = "result"  # the short name of each head's write, z_h W_O[h]
# hooks whose second axis is not pos (head_index query_pos key_pos): no activation per token to probe
NOT_PER_TOKEN = ("hook_pattern", "hook_attn_scores")


@dataclass(frozen=True)
class Site:
    """One place a probe reads: a full hook name, its block (None for a hook outside the blocks) and head."""

    hook: str
    layer: int | None
    head: int | None = None

    @property
    def label(self) -> str:
        return self.hook if self.head is None else f"{self.hook}[head {self.head}]"


@dataclass(frozen=True)
class Rows:
    """The probed positions: ``example[r]``, ``pos[r]`` and the class index ``target[r]`` of row ``r``."""

    example: Tensor
    pos: Tensor
    target: Tensor
    classes: tuple
    keys: list  # the label as given, per row (for the control task's types)


def _layer_of(model, name: str):
    """The block whose hook points include ``name`` (None: a hook outside the blocks, such as ``hook_embed``)."""
    for layer, block in enumerate(model.blocks):
        if any(getattr(module, "name", None) == name for module in block.modules()):
            return layer
    return None


def example_tokens(model, examples) -> list[Tensor]:
    """Each example as 1-D token ids: texts go through ``model.to_tokens``, ids through ``prepare_tokens``."""
    if isinstance(examples, Tensor):
        examples = list(examples)
    if isinstance(examples, str) or not isinstance(examples, Sequence):
        raise TypeError(f"examples must be a list of texts or of token-id sequences, got {type(examples).__name__}")
    if not examples:
        raise ValueError("examples is empty: a probe needs labelled examples")
    tokens = []
    for example in examples:
        if isinstance(example, str) and model.tokenizer is None:
            raise TypeError(f"{model.cfg.name} has no tokenizer: give token ids, got the text {example!r:.60}")
        ids = model.to_tokens(example) if isinstance(example, str) else model.prepare_tokens(example)
        tokens.append(ids.reshape(-1))
    return tokens


def label_rows(labels, tokens: list[Tensor], position: str) -> Rows:
    """The rows a probe is trained on, after checking ``labels`` against the examples' lengths."""
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    if isinstance(labels, Tensor):
        labels = labels.tolist()
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(f"labels must be a list, got {type(labels).__name__}")
    if len(labels) != len(tokens):
        raise ValueError(f"got {len(labels)} labels for {len(tokens)} examples: give one per example")
    example, pos, keys = [], [], []
    for i, (label, ids) in enumerate(zip(labels, tokens)):
        if position == "last":
            example.append(i), pos.append(len(ids) - 1), keys.append(_hashable(label, f"labels[{i}]"))
            continue
        if isinstance(label, Tensor):
            label = label.tolist()
        if isinstance(label, str) or not isinstance(label, Sequence):
            raise TypeError(f"position='all' takes one label per token: labels[{i}] is {label!r:.60}")
        if len(label) != len(ids):
            raise ValueError(
                f"labels[{i}] has {len(label)} labels for an example of {len(ids)} tokens (BOS included where the "
                "text is tokenized with one): give one per token, None to leave a token out"
            )
        for p, value in enumerate(label):
            if value is not None:
                example.append(i), pos.append(p), keys.append(_hashable(value, f"labels[{i}][{p}]"))
    classes = _classes(keys)
    index = {value: c for c, value in enumerate(classes)}
    target = torch.tensor([index[key] for key in keys])
    return Rows(torch.tensor(example), torch.tensor(pos), target, classes, keys)


def _hashable(value, where: str) -> Hashable:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if value is None or not isinstance(value, Hashable) or (isinstance(value, float) and value != value):
        raise TypeError(f"{where} must be a class (an int, bool or str), got {value!r:.60}")
    return value


def _classes(keys: list) -> tuple:
    distinct = set(keys)
    if len(distinct) < 2:
        found = f"one class only ({next(iter(distinct))!r})" if distinct else "no labelled position"
        raise ValueError(f"a probe tells classes apart: the labels hold {found}; give at least two classes")
    try:
        return tuple(sorted(distinct))
    except TypeError:  # mixed kinds (1 and "a"): a fixed order all the same
        return tuple(sorted(distinct, key=repr))


def probe_sites(model, hooks, layers=None, heads=None) -> list[Site]:
    """The sites ``hooks`` name: a short name at each of ``layers`` (default: every block), or a full name.

    ``result`` (each head's write) gives one site per head of ``heads`` (default: every head).
    """
    if isinstance(hooks, str):
        hooks = [hooks]
    if not hooks:
        raise ValueError("hooks is empty: name at least one, e.g. ['resid_post']")
    n_layers = model.cfg.n_layers
    layer_list = list(range(n_layers)) if layers is None else [layers] if isinstance(layers, int) else list(layers)
    sites = []
    for hook in hooks:
        if not isinstance(hook, str):
            raise TypeError(f"hook names are str, got {hook!r}")
        if hook in model.hook_dict or "." in hook:
            model.resolve_hook_names([hook])  # KeyError with the closest names for an unknown one
            named = [(hook, _layer_of(model, hook))]
        else:
            # the model's table: KeyError with the closest short names, or naming the layer out of range
            named = [(model.act_name(hook, layer), layer % n_layers) for layer in layer_list]
        for name, layer in named:
            if name.endswith(NOT_PER_TOKEN):
                raise ValueError(f"{name} is indexed [batch, head_index, query_pos, key_pos]: no vector per token")
            if layer is not None and name == model.act_name(HEAD_HOOK, layer):
                sites += [Site(name, layer, head) for head in _heads(model, heads)]
            else:
                sites.append(Site(name, layer))
    return list(dict.fromkeys(sites))


def _heads(model, heads) -> list[int]:
    n_heads = model.cfg.n_heads
    chosen = list(range(n_heads)) if heads is None else [heads] if isinstance(heads, int) else list(heads)
    for head in chosen:
        if isinstance(head, bool) or not isinstance(head, int) or not -n_heads <= head < n_heads:
            raise ValueError(f"head {head!r} is out of range: the model has {n_heads} heads per layer")
    return [head % n_heads for head in chosen]


def _cached_name(model, site: Site) -> str:
    return model.act_name("z", site.layer) if site.head is not None else site.hook


def collect(
    model, tokens: list[Tensor], rows: Rows, sites: list[Site], batch_size: int = 32, progress: bool = True
) -> dict[Site, Tensor]:
    """The activation at each row's position, per site: ``[row, d]`` float32 on the CPU.

    Examples of one length run together (no padding, so no mask to get wrong), ``batch_size`` at a time,
    with only the sites' hooks cached and the forward stopped after the last block a site reads.
    """
    names = sorted({_cached_name(model, site) for site in sites})
    blocks = [site.layer for site in sites]
    stop = None if None in blocks or max(blocks) + 1 >= model.cfg.n_layers else max(blocks) + 1
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(tokens):
        by_length.setdefault(len(ids), []).append(i)
    batches = [group[s : s + batch_size] for group in by_length.values() for s in range(0, len(group), batch_size)]
    per_example = [torch.nonzero(rows.example == i).flatten() for i in range(len(tokens))]
    features: dict[Site, Tensor | None] = dict.fromkeys(sites)
    kwargs = {} if stop is None else {"stop_at_layer": stop}
    for batch in tqdm(batches, desc="caching activations", unit="batch", disable=not progress):
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.stack([tokens[i] for i in batch]), names_filter=names, **kwargs)
            for site in sites:
                acts = _site_activation(cache, site).flatten(2).float().cpu()  # [batch, pos, d]
                if features[site] is None:
                    features[site] = torch.empty(len(rows.target), acts.shape[-1])
                for b, i in enumerate(batch):
                    features[site][per_example[i]] = acts[b, rows.pos[per_example[i]]]
    for site, values in features.items():
        bad = int((~torch.isfinite(values)).sum())
        if bad:
            raise ValueError(
                f"{site.label}: {bad} of {values.numel()} activation values at the probed positions are not finite "
                "(NaN or inf): a probe on them would be meaningless; check the model's weights and inputs"
            )
    return features


def _site_activation(cache, site: Site) -> Tensor:
    if site.head is None:
        return cache[site.hook]
    return cache["result", site.layer][:, :, site.head]  # z_h W_O[h], computed from z


def split_examples(
    n_examples: int, fractions: Sequence[float], seed: int, strata: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Train, validation and test example indices (stratified by ``strata`` where given), seeded."""
    if len(fractions) != 3 or any(not 0 < f < 1 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"split must be three fractions in (0, 1) summing to 1 (train, val, test), got {fractions}")
    generator = torch.Generator().manual_seed(seed)
    groups = (
        [torch.arange(n_examples)]
        if strata is None
        else [torch.nonzero(strata == s).flatten() for s in strata.unique()]
    )
    parts: list[list[Tensor]] = [[], [], []]
    for group in groups:
        group = group[torch.randperm(len(group), generator=generator)]
        n_train = round(fractions[0] * len(group))
        n_val = round(fractions[1] * len(group))
        for part, chunk in zip(parts, (group[:n_train], group[n_train : n_train + n_val], group[n_train + n_val :])):
            part.append(chunk)
    train, val, test = (torch.cat(part).sort().values for part in parts)
    for name, part in (("train", train), ("validation", val), ("test", test)):
        if len(part) == 0:
            raise ValueError(
                f"the {name} split of {n_examples} examples is empty (split {tuple(fractions)}): give more examples"
            )
    return train, val, test


Labels = Sequence | Tensor


def row_types(types, tokens: list[Tensor], rows: Rows, position: str) -> list:
    """The word type of each row, for the control task: ``types`` as given (one per example for
    ``position="last"``, one per token for ``"all"``), else the token id at the row's position."""
    if types is None:
        return [int(tokens[i][p]) for i, p in zip(rows.example.tolist(), rows.pos.tolist())]
    if isinstance(types, str) or not isinstance(types, Sequence):
        raise TypeError(f"types must be a list (one per example, or per token), got {type(types).__name__}")
    if len(types) != len(tokens):
        raise ValueError(f"got {len(types)} types for {len(tokens)} examples: give one per example")
    if position == "last":
        return [_hashable(kind, f"types[{i}]") for i, kind in enumerate(types)]
    for i, (kinds, ids) in enumerate(zip(types, tokens)):
        if isinstance(kinds, str) or not isinstance(kinds, Sequence) or len(kinds) != len(ids):
            raise ValueError(f"types[{i}] must hold one type per token ({len(ids)}), got {kinds!r:.60}")
    return [_hashable(types[i][p], f"types[{i}][{p}]") for i, p in zip(rows.example.tolist(), rows.pos.tolist())]

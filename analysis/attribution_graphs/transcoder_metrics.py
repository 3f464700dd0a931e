"""How good a set of transcoders is, on held-out activations: per layer, the fraction of the MLP output's variance
explained, L0 and dead features; for the whole set, the next-token loss with every MLP replaced.

``transcoder_metrics(model, transcoders, data)`` reads ``data`` (``training.MLPActivations``: each layer's MLP input
and output at the held-out positions, and the held-out contexts' tokens):

- ``variance_explained[o]``: ``1 - sum ||y_o - out_o||^2 / sum ||y_o - mean(y_o)||^2``, with ``out_o`` everything the
  transcoders write to MLP output ``o`` (a cross-layer transcoder's earlier layers included);
- ``l0[l]``: the mean number of layer ``l``'s features active at a position; ``dead_fraction[l]``: the share of
  layer ``l``'s features active at no held-out position;
- ``ce_clean``, ``ce_spliced`` (every MLP output the transcoders' reconstruction, no error term,
  ``interventions.splice_transcoders``), ``ce_zero_ablated`` (every MLP output 0): the mean next-token loss in
  nats over the held-out contexts, the BOS and separator positions left as the model computes them;
  ``ce_recovered = (zero - spliced) / (zero - clean)``.
"""

from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from interp_transformer.core.losses import lm_loss
from interp_transformer.sae.data import keep_mask

from .interventions import splice_transcoders
from .transcoders import transcoder_layers


@dataclass(frozen=True)
class TranscoderMetrics:
    """See the module docstring."""

    variance_explained: list[float]
    l0: list[float]
    dead_fraction: list[float]
    ce_clean: float
    ce_spliced: float
    ce_zero_ablated: float

    @property
    def ce_recovered(self) -> float:
        return (self.ce_zero_ablated - self.ce_spliced) / (self.ce_zero_ablated - self.ce_clean)

    def to_dict(self) -> dict:
        return {**asdict(self), "ce_recovered": self.ce_recovered}

    def summary(self) -> str:
        ev, l0, dead = self.variance_explained, self.l0, self.dead_fraction
        mean = lambda values: sum(values) / len(values)  # noqa: E731
        return (
            f"variance explained {mean(ev):.3f} (layers {min(ev):.3f}..{max(ev):.3f}), L0 {mean(l0):.1f}, "
            f"dead {mean(dead):.1%}; CE clean {self.ce_clean:.3f}, spliced {self.ce_spliced:.3f}, MLPs zeroed "
            f"{self.ce_zero_ablated:.3f} nats: {self.ce_recovered:.1%} recovered"
        )


@torch.no_grad()
def transcoder_metrics(model, transcoders, data, batch_size: int = 8, progress: bool = False) -> TranscoderMetrics:
    """``TranscoderMetrics`` of ``transcoders`` on ``data``'s held-out activations and contexts (module docstring)."""
    layers = transcoder_layers(model, transcoders)
    x, y = data.eval_x.to(model.W_E.dtype), data.eval_y.to(model.W_E.dtype)
    outs = [layer.b_dec.expand_as(y[layer.layer]).clone() for layer in layers]
    l0, dead = [], []
    for layer in layers:
        acts = layer.encode(x[layer.layer])
        l0.append(float((acts != 0).sum(-1).double().mean()))
        dead.append(float(((acts != 0).sum(0) == 0).double().mean()))
        for j, o in enumerate(layer.out_layers):
            outs[o] += acts @ layer.decoders[:, j]
    ev = []
    for o, out in enumerate(outs):
        target = y[o].double()
        ev.append(float(1 - (target - out.double()).pow(2).sum() / (target - target.mean(0)).pow(2).sum()))
    totals = torch.zeros(3, dtype=torch.float64)
    writes = [layer.writes for layer in layers]
    batches = data.eval_tokens.split(batch_size)
    for tokens in tqdm(batches, desc="CE loss", disable=not progress, leave=False):
        keep = keep_mask(tokens, data.special_token_ids)

        def zero_kept(act, hook, keep=keep):
            return torch.where(keep[..., None], torch.zeros_like(act), act)

        zero = [(name, zero_kept) for name in writes]
        clean = model(tokens)
        with splice_transcoders(model, transcoders, keep=keep):
            spliced = model(tokens)
        zeroed = model.run_with_hooks(tokens, fwd_hooks=zero)
        totals += torch.tensor([float(lm_loss(logits, tokens)) * len(tokens) for logits in (clean, spliced, zeroed)])
    clean, spliced, zeroed = (totals / len(data.eval_tokens)).tolist()
    return TranscoderMetrics(ev, l0, dead, clean, spliced, zeroed)


__all__ = ["TranscoderMetrics", "transcoder_metrics"]

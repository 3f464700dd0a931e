"""Training per-layer transcoders and a cross-layer transcoder on a model's MLPs, from activations over a corpus.

``train_transcoders(model, source, config)``:

1. **Activations.** The model runs over ``source`` (a corpus or token batches, as
   ``interp_transformer.sae.token_batches`` reads them; ``reference_corpus()`` is a real one every Python
   ships) and keeps, at every position but the BOS and separators, each layer's MLP input (what a
   transcoder reads: the MLP's norm output, ``ln2.hook_normalized``, or the stream before that norm) and
   the MLP's write to the stream (``hook_mlp_out``). Every ``eval_every``-th context is held out.
2. **Scales.** Each layer's inputs and outputs are multiplied by one constant each, so that their mean
   norm is ``sqrt(d_model)`` (one set of hyperparameters then fits every layer and model); the constants
   are folded into the weights at the end, so the saved transcoders read and write raw activations.
3. **TopK features** (Gao et al., 2024, as SAELens and sparsify train them): at each position and layer
   the ``k`` largest pre-activations ``x W_enc + b_enc`` are kept, through a ReLU. Encoder columns and
   decoder rows start as random unit vectors, ``b_dec`` at the mean output; decoder rows are set back to
   unit norm after each step (for a cross-layer transcoder, a feature's writes to all its outputs
   together). A per-layer transcoder's features write their own layer's MLP output; a cross-layer
   transcoder's layer-``l`` features write to every MLP output ``o >= l``, and the loss sums over outputs.
4. **Loss**: the squared error of every output, plus ``aux_coefficient`` times the AuxK loss: the
   ``aux_k`` largest pre-activations of features that have not fired for ``dead_window`` steps
   reconstruct what the live features missed, which brings dead features back where they are useful.
   Adam on shuffled minibatches, the learning rate decaying linearly to 0 over the last 20% of steps.
5. **Metrics** (``transcoder_metrics``) on the held-out positions.

Deterministic for a seed on one machine and thread count.
"""

import math
import time
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.families.validation import check_positive_int
from interp_transformer.sae import SAE
from interp_transformer.sae.data import keep_mask, token_batches
from interp_transformer.sae.processing import ProcessingMismatch

from .clt import CLTConfig, CrossLayerTranscoder
from .transcoders import mlp_slots, relative_hook_name

READS = ("input", "stream")


@dataclass(frozen=True)
class TranscoderTrainingConfig:
    """What to train (``cross_layer``, ``d_transcoder`` features per layer, ``k`` active per position and layer,
    ``reads``: the MLP's ``"input"`` or the ``"stream"`` before its norm) and how (module docstring)."""

    d_transcoder: int = 1024
    k: int = 16
    cross_layer: bool = False
    reads: str = "input"
    max_tokens: int = 60_000  # training and held-out positions together
    context_length: int = 128
    eval_every: int = 10  # every eval_every-th context is held out
    epochs: int = 6
    batch_size: int = 512
    lr: float = 3e-3
    aux_k: int = 64
    aux_coefficient: float = 1 / 32
    dead_window: int = 50  # steps without firing after which a feature counts as dead for AuxK
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_transcoder", "k", "max_tokens", "context_length", "eval_every", "epochs", "batch_size"):
            check_positive_int(f"TranscoderTrainingConfig.{name}", getattr(self, name))
        for name in ("aux_k", "dead_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"TranscoderTrainingConfig.{name} must be an int >= 0, got {value!r}")
        if self.k > self.d_transcoder:
            raise ValueError(f"k must be at most d_transcoder={self.d_transcoder}, got k={self.k}")
        if self.eval_every < 2:
            raise ValueError(
                f"eval_every must be at least 2 (every eval_every-th context is held out), got {self.eval_every}"
            )
        if self.reads not in READS:
            raise ValueError(f"reads must be one of {READS}, got {self.reads!r}")
        for name in ("lr", "aux_coefficient"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"TranscoderTrainingConfig.{name} must be a finite number >= 0, got {value!r}")
        if self.lr == 0:
            raise ValueError("TranscoderTrainingConfig.lr must be > 0, got 0")


@dataclass
class MLPActivations:
    """Every layer's MLP input ``x [layer, n, d_model]`` and output ``y [layer, n, d_model]`` at the kept positions of
    the training contexts, the same for the held-out ones, and the held-out contexts' tokens (for the CE loss)."""

    reads: list[str]
    writes: list[str]
    x: Tensor
    y: Tensor
    eval_x: Tensor
    eval_y: Tensor
    eval_tokens: Tensor  # [n_contexts, pos]
    special_token_ids: tuple[int, ...]
    description: str


def reference_corpus() -> list[str]:
    """A real English corpus that every Python installation ships: the language reference's topics as ``pydoc``
    shows them (``pydoc_data.topics``, about 465,000 characters), one document per topic, in name order."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


@torch.no_grad()
def harvest_mlp_activations(model, source, config: TranscoderTrainingConfig, progress: bool = True) -> MLPActivations:
    """``MLPActivations`` of ``model`` over ``source`` (module docstring, step 1), at most ``config.max_tokens``."""
    slots = mlp_slots(model)
    reads = [slot.inputs[0] if config.reads == "input" else slot.inputs[-1] for slot in slots]
    writes = [slot.output for slot in slots]
    if config.reads == "input" and "fold_ln" not in model.processing:
        raise ProcessingMismatch(
            f"transcoders reading {reads[0]!r} are trained on a model with fold_ln applied (the hook then holds "
            "the pure normalization, as in TransformerLens); apply interp_transformer.models.processing.fold_ln(model)"
            " first"
        )
    batches = token_batches(model, source, batch_size=8, context_length=config.context_length)
    names = set(reads) | set(writes)
    # one buffer each for inputs and outputs, filled in place: training positions from the front, held-out ones from
    # the back, so that no list of pieces is ever joined (which would hold the data twice)
    shape = (len(reads), config.max_tokens, model.cfg.d_model)
    x, y = torch.empty(shape), torch.empty(shape)
    front, back, eval_tokens, context = 0, config.max_tokens, [], 0
    bar = tqdm(total=config.max_tokens, desc="activations", unit="tok", disable=not progress, leave=False)
    for tokens in batches:
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
        keep = keep_mask(tokens, batches.special_token_ids)
        for row in range(tokens.shape[0]):
            held = context % config.eval_every == config.eval_every - 1
            context += 1
            n = min(int(keep[row].sum()), back - front)
            if n == 0:
                continue
            where = slice(back - n, back) if held else slice(front, front + n)
            for buffer, hooks in ((x, reads), (y, writes)):
                for layer, name in enumerate(hooks):
                    values = cache[name][row][keep[row]][:n].float()
                    buffer[layer, where] = values.flip(0) if held else values  # flipped back once, at the end
            if held:
                back -= n
                eval_tokens.append(tokens[row])
            else:
                front += n
            bar.update(n)
        if front == back:
            break
    bar.close()
    if front == 0 or back == config.max_tokens:
        raise ValueError(
            f"the corpus gave {context} contexts: at least eval_every={config.eval_every} are needed, so that one is "
            "held out for the metrics"
        )
    return MLPActivations(
        reads,
        writes,
        x[:, :front],
        y[:, :front],
        x[:, back:].flip(1),  # the held-out positions, in the order they were read
        y[:, back:].flip(1),
        torch.stack(eval_tokens),
        tuple(batches.special_token_ids),
        batches.description,
    )


class _Features(torch.nn.Module):
    """Every layer's TopK features at once, in the scaled space (module docstring, steps 2-4)."""

    def __init__(self, n_layers: int, d_model: int, config: TranscoderTrainingConfig, b_dec: Tensor, generator):
        super().__init__()
        L, D, F = n_layers, d_model, config.d_transcoder
        self.k, self.cross_layer = config.k, config.cross_layer
        W_enc = torch.randn(L, D, F, generator=generator)
        self.W_enc = torch.nn.Parameter(W_enc / W_enc.norm(dim=1, keepdim=True))
        self.b_enc = torch.nn.Parameter(torch.zeros(L, F))
        self.b_dec = torch.nn.Parameter(b_dec.clone())
        n_out = [L - layer if self.cross_layer else 1 for layer in range(L)]
        self.W_dec = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(F, n, D, generator=generator)) for n in n_out]
        )
        self.normalize_decoders()

    @torch.no_grad()
    def normalize_decoders(self) -> None:
        for W in self.W_dec:
            W /= W.flatten(1).norm(dim=1)[:, None, None]

    def pre(self, x: Float[Tensor, "layer n d_model"]) -> Float[Tensor, "layer n d_transcoder"]:
        return torch.baddbmm(self.b_enc[:, None], x, self.W_enc)

    def top_k(self, pre: Tensor, k: int) -> Tensor:
        values, indices = pre.topk(k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, indices, values.relu())

    def decode(
        self, acts: Float[Tensor, "layer n d_transcoder"], bias: bool = True
    ) -> Float[Tensor, "layer n d_model"]:
        """Every MLP output: ``b_dec[o]`` (with ``bias``) plus the writes of each layer's features to it."""
        n, D = acts.shape[1], self.b_dec.shape[1]
        outs = [self.b_dec[o].expand(n, D) if bias else acts.new_zeros(n, D) for o in range(acts.shape[0])]
        for layer, W in enumerate(self.W_dec):
            written = (acts[layer] @ W.flatten(1)).view(n, W.shape[1], D)  # [n, n_out, d_model]
            for j in range(W.shape[1]):
                outs[layer + j] = outs[layer + j] + written[:, j]
        return torch.stack(outs)


def _scales(v: Tensor) -> Tensor:
    """``[layer]``: the constant making each layer's mean norm ``sqrt(d_model)``."""
    return v.shape[-1] ** 0.5 / v.norm(dim=-1).mean(dim=1)


def fit(
    data: MLPActivations, config: TranscoderTrainingConfig, progress: bool = True
) -> tuple[_Features, Tensor, Tensor, list[float]]:
    """``(features, input scales, output scales, loss per step)``: the TopK features trained on ``data``."""
    generator = torch.Generator().manual_seed(config.seed)
    c_in, c_out = _scales(data.x), _scales(data.y)
    L, n, D = data.x.shape
    model = _Features(L, D, config, data.y.mean(dim=1) * c_out[:, None], generator)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.999))
    per_epoch = max(1, n // config.batch_size)
    steps = per_epoch * config.epochs
    decay_from = int(0.8 * steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1.0 if step < decay_from else max(0.0, (steps - step) / max(1, steps - decay_from))
    )
    since_fired = torch.zeros(L, config.d_transcoder, dtype=torch.long)
    losses = []
    bar = tqdm(total=steps, desc="transcoders", disable=not progress, leave=False)
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=generator)
        for step in range(per_epoch):
            rows = order[step * config.batch_size : (step + 1) * config.batch_size]
            xb, yb = data.x[:, rows] * c_in[:, None, None], data.y[:, rows] * c_out[:, None, None]
            pre = model.pre(xb)
            acts = model.top_k(pre, config.k)
            recon = model.decode(acts)
            loss = (yb - recon).pow(2).sum(-1).mean()
            fired = (acts > 0).any(dim=1)
            since_fired = torch.where(fired, 0, since_fired + 1)
            dead = since_fired > config.dead_window
            if config.aux_coefficient > 0 and config.aux_k > 0 and bool(dead.any()):
                k_aux = min(config.aux_k, int(dead.sum(-1).max()))
                dead_pre = pre.masked_fill(~dead[:, None], float("-inf"))
                aux = model.top_k(dead_pre, k_aux).nan_to_num(0.0)
                residual = (yb - recon).detach()
                loss = loss + config.aux_coefficient * (residual - model.decode(aux, bias=False)).pow(2).sum(-1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            model.normalize_decoders()
            losses.append(float(loss.detach()) / L)
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    return model, c_in, c_out, losses


def to_transcoders(features: _Features, c_in: Tensor, c_out: Tensor, data: MLPActivations, config, model):
    """The trained features as raw-space transcoders: one TopK transcoder ``SAE`` per layer (SAELens' format), or a
    ``CrossLayerTranscoder`` (circuit-tracer's layout), the scales folded into the weights."""
    dtype = model.W_E.dtype
    L = len(data.reads)
    W_enc = (features.W_enc.detach() * c_in[:, None, None]).to(dtype)  # [L, D, F]
    b_enc = features.b_enc.detach().to(dtype)
    b_dec = (features.b_dec.detach() / c_out[:, None]).to(dtype)
    if config.cross_layer:
        cfg = CLTConfig(
            n_layers=L,
            d_transcoder=config.d_transcoder,
            d_model=W_enc.shape[1],
            activation="topk",
            k=config.k,
            input_hook=relative_hook_name(model, 0, data.reads[0], "the transcoders' input"),
            output_hook=relative_hook_name(model, 0, data.writes[0], "the transcoders' output"),
        )
        tensors = {"W_enc": W_enc.transpose(1, 2).contiguous(), "b_enc": b_enc, "b_dec": b_dec}
        for layer, W in enumerate(features.W_dec):
            tensors[f"W_dec.{layer}"] = (W.detach() / c_out[layer:, None]).to(dtype)
        return CrossLayerTranscoder(cfg, tensors)
    kwargs = {step: True for step in model.processing if step != "fold_ln"}
    saes = []
    for layer in range(L):
        cfg = {
            "architecture": "topk",
            "d_in": W_enc.shape[1],
            "d_sae": config.d_transcoder,
            "d_out": W_enc.shape[1],
            "k": config.k,
            "apply_b_dec_to_input": False,
            "dtype": str(dtype).removeprefix("torch."),
            "metadata": {
                "hook_name": data.reads[layer],
                "hook_name_out": data.writes[layer],
                "model_from_pretrained_kwargs": kwargs,
                "dataset_path": data.description,
            },
        }
        tensors = {
            "W_enc": W_enc[layer],
            "b_enc": b_enc[layer],
            "W_dec": (features.W_dec[layer].detach()[:, 0] / c_out[layer]).to(dtype),
            "b_dec": b_dec[layer],
        }
        saes.append(SAE.from_dict(cfg, tensors))
    return saes


@dataclass
class TrainedTranscoders:
    """What ``train_transcoders`` gives: ``transcoders`` (a list of SAEs or a ``CrossLayerTranscoder``), their
    ``metrics`` on the held-out positions, the ``config``, the loss per step, and where the data came from."""

    transcoders: object
    metrics: "object"
    config: TranscoderTrainingConfig
    losses: list[float]
    corpus: str
    n_train: int
    n_eval: int
    seconds: float

    def record(self) -> dict:
        """What ``save`` writes to ``training.json``."""
        return {
            "config": asdict(self.config),
            "metrics": self.metrics.to_dict(),
            "corpus": self.corpus,
            "n_train_positions": self.n_train,
            "n_eval_positions": self.n_eval,
            "seconds": round(self.seconds, 1),
            "final_loss": self.losses[-1] if self.losses else None,
        }

    def save(self, folder):
        from .transcoder_files import save_transcoders

        return save_transcoders(self.transcoders, folder, self.record())


def train_transcoders(model, source, config: TranscoderTrainingConfig | None = None, progress: bool = True):
    """``TrainedTranscoders``: per-layer transcoders (or a cross-layer transcoder) trained on ``model``'s MLPs over
    ``source`` (module docstring). The model must have ``fold_ln`` applied when they read the MLP's input."""
    from .transcoder_metrics import transcoder_metrics

    config = TranscoderTrainingConfig() if config is None else config
    start = time.perf_counter()
    data = harvest_mlp_activations(model, source, config, progress)
    features, c_in, c_out, losses = fit(data, config, progress)
    transcoders = to_transcoders(features, c_in, c_out, data, config, model)
    seconds = time.perf_counter() - start
    metrics = transcoder_metrics(model, transcoders, data, progress=progress)
    return TrainedTranscoders(
        transcoders, metrics, config, losses, data.description, data.x.shape[1], data.eval_x.shape[1], seconds
    )


__all__ = [
    "MLPActivations",
    "TrainedTranscoders",
    "TranscoderTrainingConfig",
    "harvest_mlp_activations",
    "reference_corpus",
    "train_transcoders",
]

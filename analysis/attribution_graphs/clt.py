"""``CrossLayerTranscoder``: features that read one layer's MLP input and write to its output and every later one.

For layers ``l = 0 .. n_layers - 1``, with ``x_l [..., d_model]`` what layer ``l``'s features read::

    pre_l  = x_l W_enc[l]^T + b_enc[l]                               [..., d_transcoder]
    acts_l = activation(pre_l)
    out_o  = b_dec[o] + sum over l <= o of acts_l W_dec[l][:, o - l]   [..., d_model]

``out_o`` replaces layer ``o``'s MLP output. The activations:

============  ================================================================================
``relu``      ``relu(pre)``
``jumprelu``  ``pre * (pre > threshold[l])``, as circuit-tracer computes it (for a threshold of
              0 or more the same as SAELens' ``relu(pre) * (pre > threshold)``)
``topk``      ``relu(pre)`` on the ``k`` largest entries of ``pre`` at each position, 0 elsewhere
============  ================================================================================

Files (circuit-tracer's layout, one pair per layer ``i``; no other file):

- ``W_enc_{i}.safetensors``: ``W_enc_{i} [d_transcoder, d_model]``, ``b_enc_{i} [d_transcoder]``,
  ``b_dec_{i} [d_model]``, and ``threshold_{i} [d_transcoder]`` for JumpReLU;
- ``W_dec_{i}.safetensors``: ``W_dec_{i} [d_transcoder, n_layers - i, d_model]``.

The layout says no more than the tensors. What it leaves out (``activation``, ``k``, and the
hooks the features read and write, relative to a block: ``hook_resid_mid``, ``ln2.hook_normalized``,
``hook_mlp_out``) is written into the header metadata of each ``W_enc_{i}.safetensors``, which
circuit-tracer ignores; a folder without it reads as ReLU (JumpReLU where thresholds are stored)
reading ``hook_resid_mid`` and writing ``hook_mlp_out``, circuit-tracer's defaults.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.files import atomic_write
from interp_transformer.core.strict import check_checkpoint, check_finite, state_dict_shapes

from .folder_files import read_metadata, read_tensors

ACTIVATIONS = ("relu", "jumprelu", "topk")


@dataclass(frozen=True)
class CLTConfig:
    """What a cross-layer transcoder is: its sizes, its activation, and where its features read and write."""

    n_layers: int
    d_transcoder: int  # features per layer
    d_model: int
    activation: str = "relu"  # one of ACTIVATIONS
    k: int | None = None  # features kept per position and layer (topk only)
    input_hook: str = "hook_resid_mid"  # what layer l's features read: blocks.{l}.<input_hook>
    output_hook: str = "hook_mlp_out"  # what out_l replaces: blocks.{l}.<output_hook>

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_transcoder", "d_model"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"CLTConfig.{name} must be a positive int, got {value!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"CLTConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.activation == "topk":
            if isinstance(self.k, bool) or not isinstance(self.k, int) or not 0 < self.k <= self.d_transcoder:
                raise ValueError(f"a topk CLT needs 0 < k <= d_transcoder={self.d_transcoder}, got k={self.k!r}")
        elif self.k is not None:
            raise ValueError(f"k belongs to a topk CLT, not to activation={self.activation!r} (got k={self.k})")
        for name in ("input_hook", "output_hook"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or value.startswith("blocks."):
                raise ValueError(
                    f"CLTConfig.{name} is a hook name relative to a block (e.g. 'hook_resid_mid'), got {value!r}"
                )

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter name -> shape, as ``state_dict()`` holds them."""
        L, F, D = self.n_layers, self.d_transcoder, self.d_model
        shapes = {"W_enc": (L, F, D), "b_enc": (L, F), "b_dec": (L, D)}
        shapes.update({f"W_dec.{i}": (F, L - i, D) for i in range(L)})
        if self.activation == "jumprelu":
            shapes["threshold"] = (L, F)
        return shapes

    def metadata(self) -> dict[str, str]:
        """What the file layout does not hold, as safetensors header metadata (strings)."""
        return {
            "activation": self.activation,
            "k": "" if self.k is None else str(self.k),
            "input_hook": self.input_hook,
            "output_hook": self.output_hook,
        }


class CrossLayerTranscoder(nn.Module):
    """A cross-layer transcoder (see the module docstring): ``CrossLayerTranscoder(cfg, tensors)``.

    ``tensors`` holds ``W_enc [n_layers, d_transcoder, d_model]``, ``b_enc [n_layers, d_transcoder]``,
    ``b_dec [n_layers, d_model]``, ``W_dec.{i} [d_transcoder, n_layers - i, d_model]`` and, for
    JumpReLU, ``threshold [n_layers, d_transcoder]``. Missing, unexpected or mis-shaped tensors raise
    one ``CheckpointError`` naming each; NaN or inf, a ``CheckpointError`` naming the tensor.
    """

    def __init__(self, cfg: CLTConfig, tensors: Mapping[str, Tensor]):
        super().__init__()
        if not isinstance(cfg, CLTConfig):
            raise TypeError(f"cfg must be a CLTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        check_checkpoint(state_dict_shapes(tensors), cfg.shapes(), what="the tensors of a cross-layer transcoder")
        for name, tensor in tensors.items():
            if not tensor.is_floating_point():
                raise TypeError(f"CLT tensor {name} must be floating point, got {tensor.dtype}")
            check_finite(name, tensor, "the tensors of a cross-layer transcoder")
        dtypes = {tensor.dtype for tensor in tensors.values()}
        if len(dtypes) != 1:
            raise TypeError(f"the CLT's tensors must share one dtype, got {sorted(map(str, dtypes))}")
        self.W_enc = nn.Parameter(tensors["W_enc"].detach())
        self.b_enc = nn.Parameter(tensors["b_enc"].detach())
        self.b_dec = nn.Parameter(tensors["b_dec"].detach())
        self.W_dec = nn.ParameterList([nn.Parameter(tensors[f"W_dec.{i}"].detach()) for i in range(cfg.n_layers)])
        self.threshold = nn.Parameter(tensors["threshold"].detach()) if cfg.activation == "jumprelu" else None

    @classmethod
    def random(cls, cfg: CLTConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> "CrossLayerTranscoder":
        """Random weights (encoders ``N(0, 1/d_model)``, decoders ``N(0, 1/(d_transcoder n_layers))``, small biases,
        thresholds in ``[0, 0.1)``): an untrained CLT for tests and timing."""
        g = torch.Generator().manual_seed(seed)
        L, F, D = cfg.n_layers, cfg.d_transcoder, cfg.d_model

        def draw(*shape: int, scale: float) -> Tensor:
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

        tensors = {
            "W_enc": draw(L, F, D, scale=D**-0.5),
            "b_enc": draw(L, F, scale=0.1),
            "b_dec": draw(L, D, scale=0.1),
        }
        tensors.update({f"W_dec.{i}": draw(F, L - i, D, scale=(F * L) ** -0.5) for i in range(L)})
        if cfg.activation == "jumprelu":
            tensors["threshold"] = (torch.rand(L, F, generator=g, dtype=torch.float64) * 0.1).to(dtype)
        return cls(cfg, tensors)

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    # --- the math ----------------------------------------------------------------------------
    def pre_layer(self, layer: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """``x W_enc[layer]^T + b_enc[layer]``: layer ``layer``'s pre-activations."""
        return einops.einsum(x, self.W_enc[layer], "... d_model, f d_model -> ... f") + self.b_enc[layer]

    def encode_layer(self, layer: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """Layer ``layer``'s feature activations of ``x`` (module docstring)."""
        pre = self.pre_layer(layer, x)
        if self.cfg.activation == "relu":
            return pre.relu()
        if self.cfg.activation == "jumprelu":
            return pre * (pre > self.threshold[layer]).to(pre.dtype)
        values, indices = pre.topk(self.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, indices, values.relu())

    def encode(self, x: Float[Tensor, "layer ... d_model"]) -> Float[Tensor, "layer ... d_transcoder"]:
        """Every layer's activations: ``x [n_layers, ..., d_model]`` holds each layer's input."""
        self._check_layers(x, "x")
        return torch.stack([self.encode_layer(layer, x[layer]) for layer in range(self.cfg.n_layers)])

    def decode(self, acts: Float[Tensor, "layer ... d_transcoder"]) -> Float[Tensor, "layer ... d_model"]:
        """``out_o`` for every output layer ``o`` (module docstring) from every layer's activations."""
        self._check_layers(acts, "acts")
        outs = []
        for out_layer in range(self.cfg.n_layers):
            out = self.b_dec[out_layer].expand(*acts.shape[1:-1], self.cfg.d_model)
            for layer in range(out_layer + 1):
                out = out + acts[layer] @ self.W_dec[layer][:, out_layer - layer]
            outs.append(out)
        return torch.stack(outs)

    def forward(self, x: Float[Tensor, "layer ... d_model"]) -> Float[Tensor, "layer ... d_model"]:
        """``decode(encode(x))``: every MLP output, from every layer's input."""
        return self.decode(self.encode(x))

    def _check_layers(self, x: Tensor, name: str) -> None:
        if not isinstance(x, Tensor) or x.ndim < 2 or x.shape[0] != self.cfg.n_layers:
            received = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be [n_layers={self.cfg.n_layers}, ..., width], got {received}")

    # --- files -------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write circuit-tracer's layout (module docstring) to ``folder``; returns the folder."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        metadata = self.cfg.metadata()
        for i in range(self.cfg.n_layers):
            encoder = {f"W_enc_{i}": self.W_enc[i], f"b_enc_{i}": self.b_enc[i], f"b_dec_{i}": self.b_dec[i]}
            if self.threshold is not None:
                encoder[f"threshold_{i}"] = self.threshold[i]
            encoder = {name: tensor.detach().contiguous().cpu() for name, tensor in encoder.items()}
            decoder = {f"W_dec_{i}": self.W_dec[i].detach().contiguous().cpu()}
            atomic_write(folder / f"W_enc_{i}.safetensors", lambda p, t=encoder: save_file(t, str(p), metadata))
            atomic_write(folder / f"W_dec_{i}.safetensors", lambda p, t=decoder: save_file(t, str(p)))
        return folder

    @classmethod
    def load(
        cls,
        folder: str | Path,
        *,
        input_hook: str | None = None,
        output_hook: str | None = None,
        dtype: torch.dtype | None = None,
    ) -> "CrossLayerTranscoder":
        """Read circuit-tracer's layout from ``folder``; ``input_hook``/``output_hook`` override what the files say.

        Strict: every ``W_enc_{i}``/``W_dec_{i}`` pair for ``i < n_layers`` (counted from the encoder files), each
        with exactly its tensors; anything else raises ``ValueError`` naming what is missing or unexpected.
        """
        folder = Path(folder)
        encoders = sorted(folder.glob("W_enc_*.safetensors")) if folder.is_dir() else []
        if not encoders:
            raise ValueError(
                f"{folder} holds no W_enc_0.safetensors: not a cross-layer transcoder in circuit-tracer's "
                "layout (W_enc_{i}.safetensors and W_dec_{i}.safetensors per layer)"
            )
        n_layers = len(encoders)
        expected = {f"W_{kind}_{i}.safetensors" for kind in ("enc", "dec") for i in range(n_layers)}
        present = {p.name for p in folder.glob("W_*_*.safetensors")}
        if present != expected:
            raise ValueError(
                f"{folder}: {n_layers} encoder files need exactly {sorted(expected)}; missing "
                f"{sorted(expected - present)}, unexpected {sorted(present - expected)}"
            )
        metadata = read_metadata(folder, "W_enc_0.safetensors", f"the cross-layer transcoder in {folder}")
        tensors: dict[str, list[Tensor]] = {"W_enc": [], "b_enc": [], "b_dec": [], "threshold": []}
        decoders = {}
        for i in range(n_layers):
            encoder = read_tensors(folder, f"W_enc_{i}.safetensors", f"layer {i}'s encoder", dtype)
            names = {f"W_enc_{i}", f"b_enc_{i}", f"b_dec_{i}"}
            unexpected = set(encoder) - names - {f"threshold_{i}"}
            if not names <= set(encoder) or unexpected:
                raise ValueError(
                    f"{folder / f'W_enc_{i}.safetensors'} must hold {sorted(names)} (and threshold_{i} for JumpReLU); "
                    f"got {sorted(encoder)}"
                )
            for name in ("W_enc", "b_enc", "b_dec", "threshold"):
                if f"{name}_{i}" in encoder:
                    tensors[name].append(encoder[f"{name}_{i}"])
            decoder = read_tensors(folder, f"W_dec_{i}.safetensors", f"layer {i}'s decoder", dtype)
            if set(decoder) != {f"W_dec_{i}"}:
                raise ValueError(
                    f"{folder / f'W_dec_{i}.safetensors'} must hold W_dec_{i} alone, got {sorted(decoder)}"
                )
            decoders[f"W_dec.{i}"] = decoder[f"W_dec_{i}"]
        if len(tensors["threshold"]) not in (0, n_layers):
            raise ValueError(
                f"{folder}: threshold_{{i}} is stored for {len(tensors['threshold'])} of {n_layers} layers"
            )
        stacked = {name: _stack(name, values) for name, values in tensors.items() if values}
        F, D = stacked["W_enc"].shape[1:]
        activation = metadata.get("activation") or ("jumprelu" if "threshold" in stacked else "relu")
        cfg = CLTConfig(
            n_layers=n_layers,
            d_transcoder=F,
            d_model=D,
            activation=activation,
            k=int(metadata["k"]) if metadata.get("k") else None,
            input_hook=input_hook or metadata.get("input_hook") or "hook_resid_mid",
            output_hook=output_hook or metadata.get("output_hook") or "hook_mlp_out",
        )
        return cls(cfg, {**stacked, **decoders})

    def replace(self, **changes) -> "CrossLayerTranscoder":
        """The same weights under a config with ``changes`` (e.g. other hooks)."""
        return type(self)(dataclasses.replace(self.cfg, **changes), self.state_dict())

    def extra_repr(self) -> str:
        return repr(self.cfg)


def _stack(name: str, values: list[Tensor]) -> Tensor:
    shapes = {tuple(value.shape) for value in values}
    if len(shapes) != 1:
        raise ValueError(f"the layers' {name} tensors differ in shape: {sorted(shapes)}")
    return torch.stack(values)


__all__ = ["ACTIVATIONS", "CLTConfig", "CrossLayerTranscoder"]

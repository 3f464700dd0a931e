"""ActivationCache: the activations of one run, addressable by full or short names.

Short keys go through the model's explicit name table (``model.hook_names``, no regular
expressions): ``cache["pattern", 0]`` is ``blocks.0.attn.hook_pattern``,
``cache["resid_pre", -1]`` the last block's input, ``cache["normalized", 0, "ln1"]`` the
first LayerNorm's output, ``cache["scale"]`` the final norm's scale.

Stacks of residual-stream components (``accumulated_resid``, ``decompose_resid``,
``stack_head_results``, ``stack_neuron_results``) have shape
``[component, batch, pos, d_model]``; ``apply_ln_to_stack`` pushes them through a norm
with its scale frozen to the cached value (the norm's own ``apply_frozen``), so they
stay additive.

What applies is decided by the model's capabilities (``model.capabilities``), never by
its class. In a post-norm model the norms renormalize the residual stream inside every
block, so it is not a sum of component outputs and no final norm reads it. There,
``accumulated_resid`` (without ``apply_ln``), ``stack_head_results`` and
``stack_neuron_results`` keep their meaning (the hidden state entering each block, each
head's and neuron's write); ``decompose_resid``, ``apply_ln_to_stack`` and ``logit_attrs``
raise an error that says so and names the tool to use instead.
"""

import difflib
from typing import Iterable, Iterator, Optional, Union

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .hook_names import ALIASES

POST_NORM_INSTEAD = (
    "For an exact split of an output direction over embeddings, heads, MLPs and norm biases (every norm's scale frozen "
    "from the cache) use analysis.encoder_attribution.encoder_direct_attribution(cache, direction)"
)


def _not_additive(model, what: str) -> ValueError:
    return ValueError(f"{what} has no meaning here: {model.capabilities.why_not_additive()}. {POST_NORM_INSTEAD}")


def storage_id(tensor: torch.Tensor) -> int:
    # the address of the storage object; views and aliases of one buffer share it (also on "meta")
    return tensor.untyped_storage()._cdata


def held_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``: the memory that keeping them costs.

    A tensor stored under two names, or two views of one buffer, count once; a small
    view that keeps a large buffer alive counts the whole buffer.
    """
    storages = {storage_id(t): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


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
            names = self.model.hook_names
            short = ALIASES.get(key, key)
            if short in names.global_keys or short in names.unavailable:
                return self.model.act_name(key)  # the model's table, or its advice where it lacks the key
            return key  # not a short name: reported as an unknown activation
        if isinstance(key, tuple) and 1 <= len(key) <= 3:
            return self.model.act_name(*key)
        raise KeyError(f"cache keys are a hook name or (short_name, layer[, sub-layer]), got {key!r}")

    def _has_hook(self, name: str, layer: int) -> bool:
        """Whether the model has the short-named hook in block ``layer`` (an attention-only block has no MLP)."""
        return self.model.act_name(name, layer) in self.model.hook_dict

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

        ``"final_post"`` is the hook the model names its final residual stream
        (``hook_names.final_residual``). On a post-norm model (BERT) the entries are the
        hidden states entering each block (``hook_resid_pre``, already normalized by the
        previous block's ``ln2``), with ``incl_mid`` also ``resid_mid = resid_pre + attn_out``,
        and ``"final_post"`` is the final hidden state (the last ``hook_normalized_resid_post``,
        *not* the last ``hook_resid_post``, which is before ``ln2``). ``apply_ln`` raises
        there: no norm reads the stream the way ``ln_final`` does in a pre-norm decoder.
        """
        if apply_ln and not self.model.capabilities.additive_residual:
            raise _not_additive(self.model, "accumulated_resid(apply_ln=True)")
        end = self._layer_bound(layer)
        components, labels = [], []
        for l in range(end):
            components.append(self["resid_pre", l])
            labels.append(f"{l}_pre")
            if incl_mid and self._has_hook("resid_mid", l):
                components.append(self["resid_mid", l])
                labels.append(f"{l}_mid")
        if end == self.model.cfg.n_layers:
            components.append(self[self.model.hook_names.final_residual_name(end)])
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

        The embeddings the architecture adds to the stream (``hook_names.input_writers``:
        ``embed``, ``pos_embed`` for GPT-2), then ``L_attn_out`` and ``L_mlp_out`` per block;
        with ``mode="all"`` and ``incl_embeds`` they sum to the residual stream at ``layer``.
        Raises ``ValueError`` on a post-norm model, whose stream is no such sum.
        """
        if not self.model.capabilities.additive_residual:
            raise _not_additive(self.model, "decompose_resid")
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        end = self._layer_bound(layer)
        components, labels = [], []
        if incl_embeds:
            for name in self.model.hook_names.input_writers:
                components.append(self[name])
                labels.append(name)
        for l in range(end):
            if mode in ("all", "attn"):
                components.append(self["attn_out", l])
                labels.append(f"{l}_attn_out")
            if mode in ("all", "mlp") and self._has_hook("mlp_out", l):
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
        if not self._has_hook("post", 0):
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
        """Push each component through a norm whose scale is frozen to the cached one.

        The norm is the final one (``layer=None``) or block ``layer``'s ``ln1`` (``ln2`` if
        ``mlp_input``), applied by its own ``apply_frozen`` (LayerNorm:
        ``x -> (x - mean(x)) / scale * w``). The bias is left out so the result stays
        additive: the components of a residual sum to ``normalized - b``. ``pos_slice`` must
        be the one the stack was sliced with. Raises ``ValueError`` on a post-norm model
        (the components of its stream do not add up to what a norm reads).
        """
        if not self.model.capabilities.additive_residual:
            raise _not_additive(self.model, "apply_ln_to_stack")
        if layer is None or layer == self.model.cfg.n_layers:
            norm = self.model.final_norm
            if norm is None:
                raise ValueError("apply_ln_to_stack(layer=None) needs the final norm, and this model has none")
            scale = self["scale"]
        else:
            sub = "ln2" if mlp_input else "ln1"
            scale, norm = self["scale", layer, sub], getattr(self.model.blocks[layer], sub)
        return norm.apply_frozen(residual_stack, _slice_pos(scale, pos_slice, pos_dim=scale.ndim - 2))

    def logit_attrs(
        self,
        residual_stack: Float[Tensor, "component ... d_model"],
        tokens: Union[int, Int[Tensor, "..."]],
        incorrect_tokens: Union[None, int, Int[Tensor, "..."]] = None,
    ) -> Float[Tensor, "component ..."]:
        """Each component's direct contribution to the logit of ``tokens`` (minus ``incorrect_tokens``).

        ``residual_stack`` should already be through ``apply_ln_to_stack``; the result is
        ``stack . W_U[:, token]`` (no ``b_U``), broadcast over the stack's batch/pos axes.
        Raises ``ValueError`` on a post-norm model: no stack of residual components dots
        into its output.
        """
        if not self.model.capabilities.additive_residual:
            raise _not_additive(self.model, "logit_attrs")
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

"""Residual-stream stacks of an ``ActivationCache``: the logit lens, decompositions and direct logit attribution.

Every stack has shape ``[component, *batch_and_pos, d_model]`` (``pos`` gone when
``pos_slice`` is an int). The arguments, their order and their meaning follow
TransformerLens' ``ActivationCache``:

- ``layer`` is the block whose *input* is decomposed: ``0 .. n_layers``, where
  ``n_layers`` means the final residual stream (what the final norm reads). ``None`` and
  ``-1`` both mean ``n_layers``, i.e. *every* layer through the final one (not "the last
  block"): ``accumulated_resid(layer=-1)`` ends with ``"final_post"``, and ``apply_ln``
  then uses the final norm. Other negative layers raise ``ValueError``.
- ``mlp_input`` decomposes the input of block ``layer``'s MLP instead of its attention
  (``resid_mid``; the norm is then ``ln2``).
- ``pos_slice`` / ``batch_slice`` take a ``Slice`` or anything ``Slice`` accepts.
- ``apply_ln`` pushes each component through the norm reading that input with its scale
  frozen to the cached one (the norm's own ``apply_frozen``: for LayerNorm
  ``(x - mean(x)) / scale * w``, bias left out), so the stack stays additive. Only
  ``accumulated_resid(apply_ln=True)`` at the final layer recomputes the final norm for
  each entry (``recompute_ln``): each entry is then a residual stream read on its own, the
  logit lens. One difference from TransformerLens: the frozen norm includes its weight
  ``w`` (TransformerLens divides by the scale only); the two agree once ``fold_ln`` has
  run, which sets ``w = 1``.

A post-norm model (capabilities) keeps what still has a meaning there (the hidden state
entering each block, each head's and neuron's write) and raises on the rest.
"""

import einops
import torch
from torch import Tensor

from interp_transformer.cache.residual_norms import POST_NORM_INSTEAD, ResidualNorms, SliceLike
from interp_transformer.hooks.slices import Slice


class ResidualStacks:
    """The residual-stream tools of one ``ActivationCache`` (see the module docstring); the cache forwards to them."""

    def __init__(self, cache):
        self.cache = cache
        self.norms = ResidualNorms(cache)

    @property
    def model(self):
        return self.cache.model

    # --- helpers --------------------------------------------------------------------------------
    def _residual_at(self, layer: int) -> Tensor:
        """The residual stream entering block ``layer`` (``n_layers``: the final residual stream)."""
        if layer == self.model.cfg.n_layers:
            return self.cache[self.model.hook_names.final_residual_name(layer)]
        return self.cache["resid_pre", layer]

    def _remainder_of(self, layer: int) -> Tensor:
        """The residual stream that ``incl_remainder`` completes: the input of block ``layer`` (``n_layers``: the
        final one). ``layer=0`` gives the embeddings; TransformerLens' convention differs (``compat.cache``)."""
        return self._residual_at(layer)

    def _adds_attn_before_mlp(self, layer: int, mlp_input: bool) -> bool:
        """Whether block ``layer``'s MLP input includes its own attention output (not in a parallel block)."""
        if not mlp_input:
            return False
        if layer == self.model.cfg.n_layers:
            raise ValueError("mlp_input=True needs a block's MLP; layer=n_layers is the final norm's input")
        return self.cache._has_hook("resid_mid", layer)

    def _empty(self, pos_slice: Slice, last: int | None = None) -> Tensor:
        """A stack of no components, shaped like the embeddings after ``pos_slice`` (last axis ``last`` if given)."""
        like = pos_slice.apply(self.cache[self.model.hook_names.input_writers[0]], dim=-2)
        shape = like.shape if last is None else (*like.shape[:-1], last)
        return like.new_zeros((0, *shape))

    @staticmethod
    def _finish(stack: Tensor, labels: list, return_labels: bool):
        return (stack, labels) if return_labels else stack

    # --- stacks -----------------------------------------------------------------------------------
    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: SliceLike = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ):
        """The residual stream entering each block up to ``layer`` (None/-1: every block, then the final one).

        Labels ``"0_pre"``, ``"0_mid"`` (with ``incl_mid``), ..., ``"final_post"``; with
        ``mlp_input`` also ``resid_mid`` of block ``layer``. With ``apply_ln`` each entry is
        read by the norm at ``layer``: at the final layer the final norm recomputed on each
        entry (the logit lens: ``final_norm(r)`` whole), elsewhere with its cached scale.
        On a post-norm model the entries are the hidden states entering each block and
        ``apply_ln`` raises.
        """
        if apply_ln:
            self.norms._require_additive("accumulated_resid(apply_ln=True)")
        layer, pos_slice = self.norms._input_layer(layer), Slice(pos_slice)
        n_layers = self.model.cfg.n_layers
        components, labels = [], []
        for l in range(layer + 1):
            if l == n_layers:
                components.append(self._residual_at(n_layers))
                labels.append("final_post")
                continue
            components.append(self.cache["resid_pre", l])
            labels.append(f"{l}_pre")
            if ((incl_mid and l < layer) or (mlp_input and l == layer)) and self.cache._has_hook("resid_mid", l):
                components.append(self.cache["resid_mid", l])
                labels.append(f"{l}_mid")
        stack = torch.stack([pos_slice.apply(c, dim=-2) for c in components])
        if apply_ln:
            stack = self.norms.apply_ln_to_stack(stack, layer, mlp_input, pos_slice, recompute_ln=layer == n_layers)
        return self._finish(stack, labels, return_labels)

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice: SliceLike = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ):
        """The outputs of every component that wrote to the residual stream before block ``layer``.

        The embeddings summed into the stream (``hook_names.input_writers``), then each block's
        writers' outputs, ``L_attn_out`` and ``L_mlp_out`` (``mode``: ``"all"``, ``"attn"``, ``"mlp"``),
        with ``mlp_input`` also block ``layer``'s ``attn_out``; with ``mode="all"`` and
        ``incl_embeds`` they sum to the residual stream there. Raises on a post-norm model.
        """
        self.norms._require_additive("decompose_resid")
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        layer, pos_slice = self.norms._input_layer(layer), Slice(pos_slice)
        components, labels = [], []
        if incl_embeds:
            for name in self.model.hook_names.input_writers:
                components.append(self.cache[name])
                labels.append(name)
        writers = [(l, writer) for l in range(layer) for writer in self.model.blocks[l].writers()]
        if self._adds_attn_before_mlp(layer, mlp_input):  # a parallel block's MLP reads resid_pre
            own = self.model.blocks[layer].writers()
            writers += [(layer, writer) for writer in own[: [w.sublayer for w in own].index("mlp")]]
        for l, writer in writers:
            if mode in ("all", writer.sublayer):
                components.append(self.cache[writer.output])
                labels.append(f"{l}_{writer.sublayer}_out")
        if not components:
            raise ValueError(
                f"decompose_resid(layer={layer}, mode={mode!r}, incl_embeds={incl_embeds}) selects no component"
            )
        stack = torch.stack([pos_slice.apply(c, dim=-2) for c in components])
        if apply_ln:
            stack = self.norms.apply_ln_to_stack(stack, layer, mlp_input, pos_slice)
        return self._finish(stack, labels, return_labels)

    def stack_head_results(
        self,
        layer: int | None = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: SliceLike = None,
        apply_ln: bool = False,
    ):
        """Each head's write to the residual, ``z_h W_O[h]`` (no ``b_O``), for the blocks before ``layer``.

        Shape ``[layer * head_index, ...]``, labels ``"L0H3"``; computed from the cached ``z``
        (``cache["result", L]``). Where the attention's output passes through a norm before the
        stream (the writer's ``output_norm``, Gemma 2), each head's write is its result
        through that norm with the scale frozen to the cached one. ``incl_remainder`` adds ``"remainder"``: the residual
        stream entering block ``layer`` minus the heads (for ``layer=0``, the whole input of
        block 0; TransformerLens, and so ``HookedTransformer``'s cache, uses the last block's output there).
        """
        if apply_ln or incl_remainder:
            self.norms._require_additive("stack_head_results(apply_ln=True or incl_remainder=True)")
        layer, pos_slice = self.norms._input_layer(layer), Slice(pos_slice)
        parts: list[Tensor] = []
        labels: list[str] = []
        for l in range(layer):
            result = pos_slice.apply(self.cache._head_results(l), dim=-3)
            writer = self.model.blocks[l].writer("attn")
            scale = self.norms._output_scale(writer, pos_slice)
            parts.append(writer.to_stream(result, None if scale is None else scale[..., None, :]))
            labels.extend(f"L{l}H{h}" for h in range(parts[-1].shape[-2]))
        if parts:
            stack = einops.rearrange(torch.cat(parts, dim=-2), "... component d_model -> component ... d_model")
        else:
            stack = self._empty(pos_slice)
        if incl_remainder:
            remainder = pos_slice.apply(self._remainder_of(layer), dim=-2) - stack.sum(dim=0)
            stack = torch.cat([stack, remainder[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.norms.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return self._finish(stack, labels, return_labels)

    def stack_activation(
        self, activation_name: str, layer: int | None = -1, sublayer_type: str | None = None
    ) -> Tensor:
        """``cache[activation_name, L, sublayer_type]`` stacked over the blocks before ``layer`` (None/-1: all)."""
        return torch.stack(
            [self.cache[(activation_name, l, sublayer_type)] for l in range(self.norms._input_layer(layer))]
        )

    def get_neuron_results(
        self,
        layer: int,
        neuron_slice: SliceLike = None,
        pos_slice: SliceLike = None,
        project_output_onto: Tensor | None = None,
    ) -> Tensor:
        """Each neuron's write ``post[n] * W_out[n]`` in block ``layer``: ``[..., neuron, d_model]``.

        With ``project_output_onto`` (``[d_model]`` or ``[d_model, n_outs]``) the write is
        projected first (``post[n] * (W_out[n] @ p)``), never forming ``[..., neuron, d_model]``.
        Where the MLP's output passes through a norm before the stream (Gemma 2's ``ln2_post``),
        each write goes through it with the scale frozen to the cached one.
        """
        if not self.cache._has_hook("post", layer):
            raise ValueError(self._no_neurons_reason(layer))
        neuron_slice, pos_slice = Slice.unwrap(neuron_slice), Slice(pos_slice)
        acts = neuron_slice.apply(pos_slice.apply(self.cache["post", layer], dim=-2), dim=-1)
        W_out = neuron_slice.apply(self.model.blocks[layer].mlp.W_out, dim=0).to(acts.dtype)
        writer = self.model.blocks[layer].writer("mlp")
        norm, scale = writer.output_norm, self.norms._output_scale(writer, pos_slice)
        if project_output_onto is None:
            writes = acts[..., None] * W_out
            return writer.to_stream(writes, None if scale is None else scale[..., None, :])
        direction = project_output_onto.to(W_out)
        if norm is not None:  # apply_frozen(x, s) . p = x . pull_back(p) / s
            direction = norm.pull_back(direction.mT).mT if direction.ndim == 2 else norm.pull_back(direction)
            acts = acts / scale
        projected = W_out @ direction
        return acts * projected if projected.ndim == 1 else acts[..., None] * projected

    def _no_neurons_reason(self, layer: int) -> str:
        writer = self.model.blocks[layer].writer("mlp")
        if writer is not None and writer.routes_tokens:
            return (
                f"block {layer}'s MLP is a mixture of experts: its neurons are per expert; read them with "
                "analysis.readouts.experts (expert_neuron_activations, expert_neuron_logit_attribution)"
            )
        return f"block {layer} has no MLP neurons (an attention-only block)"

    def stack_neuron_results(
        self,
        layer: int | None,
        pos_slice: SliceLike = None,
        neuron_slice: SliceLike = None,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        project_output_onto: Tensor | None = None,
    ):
        """Each MLP neuron's write to the residual, ``post[n] * W_out[n]``, for the blocks before ``layer``.

        Shape ``[layer * neuron, ...]``, labels ``"L0N5"``; select neurons with
        ``neuron_slice`` (the full stack is large). ``project_output_onto`` (``[d_model]`` or
        ``[d_model, n_outs]``) projects each write without forming the full stack; with
        ``apply_ln`` the direction is pulled back through the frozen norm first (the norm's
        ``pull_back``), so the result is the projection of the normalized write.
        """
        if not self.cache._has_hook("post", 0):
            raise ValueError(f"stack_neuron_results: {self._no_neurons_reason(0)}")
        if apply_ln or incl_remainder:
            self.norms._require_additive("stack_neuron_results(apply_ln=True or incl_remainder=True)")
        layer, pos_slice, neuron_slice = self.norms._input_layer(layer), Slice(pos_slice), Slice.unwrap(neuron_slice)
        neurons = neuron_slice.apply(torch.arange(self.model.cfg.d_mlp))
        labels = [f"L{l}N{int(n)}" for l in range(layer) for n in neurons]
        columns, squeeze = _as_columns(project_output_onto)
        project, scale = columns, None
        # LN_s(x) . p = x . pull_back(p) / s, so project onto the pulled-back direction
        if apply_ln and project is not None:
            norm, scale = self.norms._norm_and_scale(layer, False)
            project = norm.pull_back(project.mT.to(self.model.W_E.dtype)).mT
            scale = None if scale is None else pos_slice.apply(scale, dim=-2)
        parts = [self.get_neuron_results(l, neuron_slice, pos_slice, project) for l in range(layer)]
        last = None if project is None else project.shape[-1]
        if parts:
            stack = einops.rearrange(torch.cat(parts, dim=-2), "... component d -> component ... d")
        else:
            stack = self._empty(pos_slice, last)
        if scale is not None:
            stack = stack / scale
        if incl_remainder:
            remainder = pos_slice.apply(self._remainder_of(layer), dim=-2)
            if apply_ln and columns is not None:  # project is None exactly when columns is
                remainder = self.norms.apply_ln_to_stack(remainder[None], layer, pos_slice=pos_slice)[0]
                remainder = remainder @ columns.to(remainder)
            elif project is not None:
                remainder = remainder @ project.to(remainder)
            stack = torch.cat([stack, (remainder - stack.sum(dim=0))[None]])
            labels.append("remainder")
        if apply_ln and project is None:
            stack = self.norms.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return self._finish(stack.squeeze(-1) if squeeze else stack, labels, return_labels)

    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: SliceLike = None,
        return_labels: bool = False,
        project_output_onto: Tensor | None = None,
    ):
        """Every write into block ``layer``'s input: each head, each neuron (or MLP layer), the embeddings, the biases.

        In that order (labels ``"L0H0"``..., ``"L0N0"``... or ``"0_mlp_out"``..., any other kind of
        writer's whole output, ``"0_adapter_out"``..., the embedding names, ``"bias"``); without
        ``apply_ln`` they sum to the residual stream
        there. ``"bias"`` is ``sum b_O`` (and ``sum b_out`` when neurons are expanded) over the
        blocks before ``layer`` (with ``mlp_input``, also block ``layer``'s ``b_O``).
        """
        self.norms._require_additive("get_full_resid_decomposition")
        layer, pos_slice = self.norms._input_layer(layer), Slice(pos_slice)
        routed = [l for l, block in enumerate(self.model.blocks) if (w := block.writer("mlp")) and w.routes_tokens]
        if expand_neurons and routed and layer > 0:
            raise ValueError(
                "get_full_resid_decomposition(expand_neurons=True): "
                + self._no_neurons_reason(routed[0])
                + "; pass expand_neurons=False for each MLP layer's output"
            )
        own_attn = self._adds_attn_before_mlp(layer, mlp_input)
        heads, labels = self.stack_head_results(layer + int(own_attn), return_labels=True, pos_slice=pos_slice)
        components = [heads]
        if layer > 0 and self.cache._has_hook("post" if expand_neurons else "mlp_out", 0):
            if expand_neurons:
                neurons, neuron_labels = self.stack_neuron_results(layer, pos_slice, return_labels=True)
            else:
                neurons, neuron_labels = self.decompose_resid(
                    layer, mlp_input, "mlp", pos_slice=pos_slice, incl_embeds=False, return_labels=True
                )
            components.append(neurons)
            labels.extend(neuron_labels)
        others = [
            (l, writer)
            for l in range(layer)
            for writer in self.model.blocks[l].writers()
            if writer.sublayer not in ("attn", "mlp")  # a writer of another kind (an adapter, ...): its whole output
        ]
        for l, writer in others:
            components.append(pos_slice.apply(self.cache[writer.output], dim=-2)[None])
            labels.append(f"{l}_{writer.sublayer}_out")
        for name in self.model.hook_names.input_writers:
            components.append(pos_slice.apply(self.cache[name], dim=-2)[None])
            labels.append(name)
        bias = self._accumulated_bias(layer, own_attn, expand_neurons, pos_slice).to(heads)
        components.append(bias.expand(heads.shape[1:])[None])
        labels.append("bias")
        stack = torch.cat(components)
        if apply_ln:
            stack = self.norms.apply_ln_to_stack(stack, layer, mlp_input, pos_slice)
        project, squeeze = _as_columns(project_output_onto)
        if project is not None:
            stack = stack @ project.to(stack)
            stack = stack.squeeze(-1) if squeeze else stack
        return self._finish(stack, labels, return_labels)

    def _accumulated_bias(self, layer: int, own_attn: bool, include_mlp_biases: bool, pos_slice: Slice) -> Tensor:
        """``sum b_O`` (and ``b_out``) of the blocks before ``layer``, plus block ``layer``'s ``b_O`` with ``own_attn``.

        ``[d_model]``; where outputs pass through a norm before the stream (Gemma 2) each bias
        goes through it with the cached scale, giving ``[..., pos, d_model]``.
        """
        total = torch.zeros(self.model.cfg.d_model, device=self.model.W_E.device, dtype=self.model.W_E.dtype)
        for l in range(layer + int(own_attn)):
            for writer in self.model.blocks[l].writers():
                heads = writer.sublayer == "attn"
                if heads or (include_mlp_biases and l < layer and writer.sublayer == "mlp"):
                    bias = writer.bias_write(self.cache.__getitem__)
                    total = total + writer.to_stream(bias, self.norms._output_scale(writer, pos_slice))
        return total.detach()


def _as_columns(project: Tensor | None) -> tuple[Tensor | None, bool]:
    """A projection as ``[d_model, n_outs]`` columns, and whether it was one ``[d_model]`` vector."""
    if project is None:
        return None, False
    if not isinstance(project, Tensor) or project.ndim not in (1, 2):
        raise ValueError(f"project_output_onto must be a [d_model] or [d_model, n_outs] tensor, got {project!r:.80}")
    return (project[:, None], True) if project.ndim == 1 else (project, False)


__all__ = ["POST_NORM_INSTEAD", "ResidualStacks"]

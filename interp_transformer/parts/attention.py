import contextlib
import math
from collections.abc import Iterator, Sequence

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.hooks.thread_state import thread_table
from interp_transformer.parts.affine import affine
from interp_transformer.parts.attention_sinks import AttentionSinks, with_sink_key
from interp_transformer.parts.head_projection import (
    DEFAULT_HEAD_LAYOUT,
    checked_head_layout,
    new_head_weight,
    place_assigned,
    project_heads,
)
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.masks import CausalMask, PaddingMask, allowed_keys, fused_is_causal
from interp_transformer.parts.scores import additive_mask, explicit_scores, masked_scores
from interp_transformer.parts.softcap import check_softcap, soft_cap
from interp_transformer.parts.split_inputs import attend_inputs, hooked_results_sum, transformer_lens_call
from interp_transformer.parts.writers import HeadWrites

GIVEN_PATTERNS = "given patterns"  # this thread's {attention: pattern} (Attention.pattern_given; thread_table)

GROUPED_WEIGHTS = ("W_K", "W_V", "b_K", "b_V")  # stored once per key/value head


class Attention(HeadWrites, nn.Module):
    """Multi-head attention with explicit per-head weights; which keys a query sees is up to its mask parts.

    For each head ``h``, with ``x`` the normalized residual stream of the queries and
    ``source`` that of the keys (``x`` itself, or ``kv_input`` for cross-attention)::

        q = x W_Q[h] + b_Q[h]        k = source W_K[h] + b_K[h]        v = source W_V[h] + b_V[h]
        attn_scores = q k^T * scale            (scale = 1/sqrt(d_head) unless given; -inf where a mask disallows)
        pattern = softmax(attn_scores)         over key_pos
        z = pattern v
        attn_out = sum_h z_h W_O[h] + b_O

    ``masks`` (default ``CausalMask`` and ``PaddingMask``) read the ``TokenLayout`` of the
    forward pass; see ``interp_transformer.parts.masks``. An encoder passes
    ``(PaddingMask(),)``; cross-attention likewise, with the source's layout.

    Optional parts, each adding its hooks only when present:

    - ``rotary`` (a ``Rotary``): q and k are rotated by their positions (``layout.positions``)
      after ``hook_q``/``hook_k``; ``hook_rot_q``/``hook_rot_k`` hold the rotated values, which
      are what the scores read, and keys enter a key/value cache already rotated.
    - ``q_norm``/``k_norm``: a norm of q and k after ``hook_q``/``hook_k``, before the rotation: over each
      head's ``d_head`` (Qwen3, Gemma 3), or over every head together (OLMo's ``AllHeadsRMSNorm``).
    - ``score_bias`` (ALiBi, ``components.alibi``): a part that answers ``score_bias(layout, dtype)``
      with a bias ``[batch, head_index, query_pos, key_pos]`` added to the scores before masking
      and softmax, hooked by the part itself (``score_bias.hook_bias``)::

          attn_scores = q k^T * scale + score_bias          (-inf where a mask disallows)

    - ``softcap`` (Gemma 2, > 0): a score step after ``score_bias``, ``attn_scores = softcap * tanh(uncapped /
      softcap)`` (``-inf`` stays), ``hook_attn_scores_uncapped`` before it; never fused (``parts.softcap``).

    - ``sinks`` (gpt-oss, ``components.attention_sinks``): a learned logit per head that joins
      the softmax as one more column and is dropped after it, so a pattern row may sum to less
      than 1 (hooked by the part, ``sinks.hook_logits``)::

          pattern = softmax([attn_scores, sink])[..., :-1]

    - ``with attention.pattern_given(pattern)``: in this thread's forwards, a pattern ``[1 or batch,
      head_index, query_pos, key_pos]`` used in place of ``softmax(attn_scores)``, whose scores are then not
      computed (an attribution graph's replacement model freezes its patterns so); ``hook_pattern`` still
      fires. Other threads running the same model are not affected.
    - ``n_key_value_heads`` (grouped-query attention, default ``n_heads``): each key/value head
      serves ``n_heads / n_key_value_heads`` consecutive query heads. Keys and values are stored
      once per key/value head, as TransformerLens' ``_W_K``, ``_W_V``, ``_b_K``, ``_b_V``
      ``[n_key_value_heads, ...]``; ``W_K``, ``W_V``, ``b_K``, ``b_V`` then give them per query
      head (repeated, read-only copies), so ``model.W_K`` and the QK/OV circuits read the same
      as without grouping. ``hook_k`` and ``hook_v`` are ``[batch, pos, n_key_value_heads, d_head]``.
    - ``split_inputs``, ``result_hook`` (TransformerLens', ``parts.split_inputs``): q, k and v read their own
      inputs (``attn(query_input=...)``, ``forward_inputs``); ``hook_result`` (after ``hook_z``) each head's write.

    ``W_Q``, ``W_K`` and ``W_V`` lie in memory head by head or side by side as ``head_layout`` says
    (``"side_by_side"``, the default on every machine, ``"per_head"``, or ``"auto"``: by the thread
    count; ``head_projection.set_head_layout`` re-lays a built model); the shapes and values are
    the same either way.

    Two paths compute it (``uses_fast_kernels()`` is the one switch): the explicit path, every
    step the einsum above (``use_fused_attention = False``; the reference), and the fast
    kernels, the default: products that read the weights where they lie, the scores
    accumulated onto the mask in one product, and PyTorch's fused
    ``scaled_dot_product_attention`` while nothing hooks or caches the scores or the pattern of
    this layer (``uses_fused_path()``). Both give every hook the same values.
    """

    reads_kv_input = False  # cross-attention's keys and values come from kv_input only, never from its queries' stream

    def __init__(
        self,
        cfg,
        masks: Sequence[nn.Module] | None = None,
        *,
        scale: float | None = None,
        n_key_value_heads: int | None = None,
        rotary: nn.Module | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        score_bias: nn.Module | None = None,
        sinks: AttentionSinks | None = None,
        softcap: float | None = None,
        split_inputs: bool = False,
        result_hook: bool = False,
        head_layout: str = DEFAULT_HEAD_LAYOUT,
    ):
        super().__init__()
        n_heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        n_kv = n_heads if n_key_value_heads is None else n_key_value_heads
        if isinstance(n_kv, bool) or not isinstance(n_kv, int) or n_kv <= 0 or n_heads % n_kv:
            raise ValueError(f"n_key_value_heads must be a positive int dividing n_heads={n_heads}, got {n_kv!r}")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm come together: pass both or neither")
        for name, flag in (("split_inputs", split_inputs), ("result_hook", result_hook)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        self.n_heads, self.n_key_value_heads, self.d_head = n_heads, n_kv, d_head
        self.scale = 1 / math.sqrt(d_head) if scale is None else float(scale)
        kv = "" if n_kv == n_heads else "_"  # grouped keys/values are stored as _W_K ... (see the class docstring)
        self.head_layout = checked_head_layout(head_layout)  # where W_Q/W_K/W_V lie in memory: head_projection
        self.W_Q = nn.Parameter(new_head_weight(n_heads, d_model, d_head, head_layout))
        self.register_parameter(kv + "W_K", nn.Parameter(new_head_weight(n_kv, d_model, d_head, head_layout)))
        self.register_parameter(kv + "W_V", nn.Parameter(new_head_weight(n_kv, d_model, d_head, head_layout)))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
        self.register_parameter(kv + "b_K", nn.Parameter(torch.zeros(n_kv, d_head)))
        self.register_parameter(kv + "b_V", nn.Parameter(torch.zeros(n_kv, d_head)))
        self.b_O = nn.Parameter(torch.zeros(d_model))
        self.masks = nn.ModuleList(masks if masks is not None else (CausalMask(), PaddingMask()))
        self.rotary = rotary
        self.use_fused_attention = True  # set False to always run the explicit path
        # hooks and hooked parts in the order they fire
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.q_norm, self.k_norm = q_norm, k_norm
        if rotary is not None:
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
        self.score_bias = score_bias
        self.softcap = None if softcap is None else check_softcap(softcap)  # a score step after score_bias
        if self.softcap is not None:
            self.hook_attn_scores_uncapped = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.sinks = sinks
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self.split_inputs = split_inputs  # TransformerLens' query_input=, key_input=, value_input= call
        self.set_result_hook(result_hook)

    # --- keys and values: stored per key/value head, read per query head ---------------------
    def stored(self, name: str) -> nn.Parameter:
        """The parameter holding ``W_K``, ``W_V``, ``b_K`` or ``b_V`` as stored: ``[n_key_value_heads, ...]``.

        Without grouping it is the weight itself; with grouping it is ``_W_K`` (...), and
        editing it is how to change the keys or values (``W_K`` is then a copy).
        """
        if name not in GROUPED_WEIGHTS:
            raise KeyError(f"stored() holds the key/value weights {GROUPED_WEIGHTS}, got {name!r}")
        params = self._parameters  # values typed Parameter | None; __init__ registers each as a Parameter
        return params[name] if name in params else params["_" + name]  # type: ignore[return-value]

    def _per_query_head(self, name: str) -> Tensor:
        parameters = self._parameters
        if name in parameters:
            return parameters[name]  # type: ignore[return-value]  # a Parameter (see stored)
        if "_" + name not in parameters:  # still being built
            raise AttributeError(name)
        group = self.n_heads // self.n_key_value_heads
        return einops.repeat(self.stored(name), "kv_head ... -> (kv_head group) ...", group=group)  # the "_" one

    W_K = property(
        lambda self: self._per_query_head("W_K"), doc="``[head_index, d_model, d_head]``: keys per query head."
    )
    W_V = property(
        lambda self: self._per_query_head("W_V"), doc="``[head_index, d_model, d_head]``: values per query head."
    )
    b_K = property(lambda self: self._per_query_head("b_K"), doc="``[head_index, d_head]``: key biases per query head.")
    b_V = property(
        lambda self: self._per_query_head("b_V"), doc="``[head_index, d_head]``: value biases per query head."
    )

    def input_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W, b)`` pairs that read this part's input, as stored: what folding a norm into it rewrites."""
        stored = self.stored
        return [(self.W_Q, self.b_Q), (stored("W_K"), stored("b_K")), (stored("W_V"), stored("b_V"))]

    def output_weights(self) -> list[Tensor]:
        """Weights whose last axis is ``d_model``: what this part writes to the residual stream."""
        return [self.W_O, self.b_O]

    def key_window(self) -> int | None:
        """The most keys one query may see, where a mask part bounds it (a sliding window, which declares
        ``window``); None where every allowed key may be seen."""
        windows = [window for mask in self.masks if (window := getattr(mask, "window", None)) is not None]
        return min(windows) if windows else None

    def pattern_rows_sum_to_one(self) -> bool:
        """Whether every query's pattern sums to 1 (no sink takes a share), so that ``z`` carries exactly ``b_V``:
        what folding the value biases into ``b_O`` needs."""
        return self.sinks is None

    def uses_fast_kernels(self) -> bool:
        """The one switch between the two paths: the fast kernels (the default), or the explicit einsum formula.

        Fast: ``head_projection.project_heads`` (the product that reads ``W_Q``/``W_K``/``W_V`` where
        they lie), ``masked_scores`` (scores accumulated onto the mask in one product) and, while
        nobody observes the scores or the pattern, ``scaled_dot_product_attention``
        (``uses_fused_path``). Explicit (``use_fused_attention = False``): every step is the
        einsum of the class docstring. Tests hold the two equal in float32 and float64.
        """
        return self.use_fused_attention

    @property
    def given_pattern(self) -> Tensor | None:
        """The pattern this thread's forwards use in place of ``softmax(attn_scores)`` (``pattern_given``), or None."""
        return thread_table(GIVEN_PATTERNS).get(self)

    @contextlib.contextmanager
    def pattern_given(self, pattern: Tensor) -> Iterator[None]:
        """Within the block, this thread's forwards use ``pattern`` ``[1 or batch, head_index, query_pos, key_pos]``
        in place of ``softmax(attn_scores)`` and compute no scores (see the class docstring)."""
        patterns = thread_table(GIVEN_PATTERNS)  # reset_hooks and restores_thread_state clear it too
        if self in patterns:
            raise RuntimeError("this attention already has a pattern given in this thread")
        patterns[self] = pattern
        try:
            yield
        finally:
            if patterns.get(self) is pattern:  # reset_hooks may have taken it; never another block's
                del patterns[self]

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: the fast kernels, no soft-cap (the kernel cannot cap), and nobody
        observes the scores or the pattern."""
        if self.softcap is not None:
            return False
        observed = self.hook_attn_scores.has_hooks() or self.hook_pattern.has_hooks()
        return self.uses_fast_kernels() and not observed and self.given_pattern is None

    def set_result_hook(self, enabled: bool) -> None:
        """Add ``hook_result`` (registered last: it fires after ``hook_z``) or take it away, with the hooks on it."""
        if enabled and "hook_result" not in self._modules:
            self.hook_result = HookPoint()
        elif not enabled and "hook_result" in self._modules:
            del self._modules["hook_result"]

    @shape_checked
    def forward(
        self,
        normalized: Float[Tensor, "batch pos d_model"] | None = None,
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
        kv_input: Float[Tensor, "batch key_pos d_model"] | None = None,
        *,
        query_input: Tensor | None = None,
        key_input: Tensor | None = None,
        value_input: Tensor | None = None,
        past_kv_cache_entry=None,
        attention_mask: Tensor | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if query_input is not None or normalized is None:  # TransformerLens' call (split_inputs)
            kv_cache = past_kv_cache_entry if past_kv_cache_entry is not None else kv_cache
            inputs = (query_input, key_input, value_input)
            return transformer_lens_call(self, normalized, kv_input, layout, kv_cache, inputs, attention_mask)
        if kv_input is not None and self.rotary is not None:
            raise ValueError(
                "rotary positions need the keys' positions, which cross-attention (kv_input) does not give"
            )
        source = kv_input if kv_input is not None or self.reads_kv_input else normalized
        return self.attend(normalized, source, source, layout, kv_cache)

    def forward_inputs(
        self,
        query_input: Tensor,
        key_input: Tensor,
        value_input: Tensor,
        layout: TokenLayout | None = None,
        kv_cache=None,
    ) -> Tensor:
        """Queries, keys and values from their own inputs, each ``[batch, pos, d_model]`` or one per head
        ``[batch, pos, head_index, d_model]`` (``parts.split_inputs.attend_inputs``)."""
        return attend_inputs(self, query_input, key_input, value_input, layout, kv_cache)

    def attend(
        self,
        query_input: Tensor,
        key_input: Tensor | None,
        value_input: Tensor | None,
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> Tensor:
        """The formula of the class docstring, with queries, keys and values each read from their own input.

        ``forward`` passes the normalized stream for all three (``kv_input`` for keys and
        values in cross-attention); TransformerLens' split inputs (``compat``) pass three.
        """
        if layout is None:  # a standalone call: one fresh, unpadded sequence per row
            offset = kv_cache.n_positions if kv_cache is not None else 0
            layout = TokenLayout.contiguous(query_input.shape[0], query_input.shape[1], offset, query_input.device)
        q = self.hook_q(self._project(query_input, self.W_Q, self.b_Q))
        k, v = self._new_keys_and_values(key_input, value_input, kv_cache)  # type: ignore[arg-type]  # None: cross
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"the queries have batch {q.shape[0]}, the keys and values have batch {k.shape[0]}")
        q, k = self._normalize_and_rotate(q, k, layout)
        if kv_cache is not None:
            k, v = self._with_cached(kv_cache, k, v)
        z = self._fused_z(q, k, v, layout) if self.uses_fused_path() else self._explicit_z(q, k, v, layout)
        return self._combine_heads(self.hook_z(z))

    def _new_keys_and_values(self, key_input: Tensor, value_input: Tensor, kv_cache) -> tuple[Tensor, Tensor]:
        """``k = key_input W_K + b_K`` and ``v = value_input W_V + b_V``, one per key/value head (hooked)."""
        stored = self.stored
        k = self.hook_k(self._project(key_input, stored("W_K"), stored("b_K")))
        v = self.hook_v(self._project(value_input, stored("W_V"), stored("b_V")))
        return k, v

    @staticmethod
    def _with_cached(kv_cache: LayerKVCache, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Every key and value the queries see: the cache's earlier ones, then these (appended to it)."""
        return kv_cache.append(k, v)

    def _normalize_and_rotate(self, q: Tensor, k: Tensor, layout: TokenLayout) -> tuple[Tensor, Tensor]:
        """``rot_q = R(positions) q_norm(q)``, likewise for ``k``; each step only where its part is present."""
        if self.q_norm is not None and self.k_norm is not None:  # given together
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q = self.hook_rot_q(self.rotary(q, layout.positions))
            k = self.hook_rot_k(self.rotary(k, layout.positions))
        return q, k

    def _per_query_head_keys(self, t: Tensor) -> Tensor:
        """Keys or values ``[batch, key_pos, n_key_value_heads, d_head]`` repeated for each query head of their
        group."""
        group = self.n_heads // self.n_key_value_heads
        return einops.repeat(t, "batch key_pos kv_head d_head -> batch key_pos (kv_head group) d_head", group=group)

    def _explicit_z(self, q: Tensor, k: Tensor, v: Tensor, layout: TokenLayout) -> Tensor:
        given = self.given_pattern
        if given is None:
            pattern = self.hook_pattern(self._pattern(q, self._per_query_head_keys(k), layout))
        else:  # a pattern given whole (a replacement model's, frozen): no scores are made
            expected = (q.shape[0], self.n_heads, q.shape[1], k.shape[1])
            shape = tuple(given.shape)
            if len(shape) != 4 or shape[0] not in (1, expected[0]) or shape[1:] != expected[1:]:
                raise ValueError(
                    f"pattern_given: the pattern must have shape [1 or {', '.join(map(str, expected))}], got {shape}"
                )
            pattern = self.hook_pattern(given.expand(q.shape[0], -1, -1, -1))
        v = self._per_query_head_keys(v)
        if pattern.shape[0] > 1 and pattern.stride(0) == 0:  # one pattern shared by every row (an expanded one):
            pattern = pattern[:1]  # broadcast it, rather than let the product copy it for each row
        return einops.einsum(
            pattern,
            v,
            "batch head_index query_pos key_pos, batch key_pos head_index d_head -> batch query_pos head_index d_head",
        )

    def _pattern(self, q: Tensor, k: Tensor, layout: TokenLayout) -> Tensor:
        """``softmax(attn_scores)`` over the keys (``hook_attn_scores``); with sinks, their logit one more column."""
        attn_scores = self._attn_scores(q, k, layout)
        if self.softcap is not None:
            attn_scores = soft_cap(self.hook_attn_scores_uncapped(attn_scores), self.softcap)
        attn_scores = self.hook_attn_scores(attn_scores)
        if self.sinks is None:
            return attn_scores.softmax(dim=-1)
        sink = self.sinks(q.shape[0], q.shape[1], attn_scores.dtype)  # joins the softmax, dropped after it
        return self.sinks.softmax(attn_scores, sink)

    def _attn_scores(self, q: Tensor, k: Tensor, layout: TokenLayout) -> Tensor:
        """``q k^T * scale (+ score_bias)``, ``-inf`` where a mask disallows the key (``k`` per query head)."""
        allowed, score_bias = allowed_keys(self.masks, layout), self._score_bias(layout, q.dtype)
        if self.uses_fast_kernels():  # the same formula as one product that starts from the mask
            return masked_scores(q, k, self.scale, allowed, score_bias)
        return explicit_scores(q, k, self.scale, allowed, score_bias)

    def _fused_z(self, q: Tensor, k: Tensor, v: Tensor, layout: TokenLayout) -> Tensor:
        """``z`` by PyTorch's fused kernel: the same formula, without forming the scores (grouped keys read in
        place)."""
        to_heads_first = "batch pos head_index d_head -> batch head_index pos d_head"
        q, k, v = (einops.rearrange(t, to_heads_first) for t in (q, k, v))
        grouped = self.n_key_value_heads != self.n_heads
        bias = self._score_bias(layout, q.dtype)
        sink = None if self.sinks is None else self.sinks(q.shape[0], q.shape[2], q.dtype)
        if bias is None and sink is None and fused_is_causal(self.masks, layout) and q.shape[2] == k.shape[2]:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=grouped)
        else:
            allowed = allowed_keys(self.masks, layout)
            mask = allowed if bias is None else additive_mask(allowed, bias)
            if sink is not None:  # the sink as one more key: zero key and value, its logit as the score
                k, v, mask = with_sink_key(k, v, mask, sink)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=grouped)
        return einops.rearrange(z, "batch head_index pos d_head -> batch pos head_index d_head")

    def _score_bias(self, layout: TokenLayout, dtype: torch.dtype) -> Tensor | None:
        """The ``score_bias`` part's ``[batch, head_index, query_pos, key_pos]`` bias, or None without one."""
        return None if self.score_bias is None else self.score_bias(layout, dtype)

    def _project(self, x: Tensor, W: Tensor, b: Tensor) -> Tensor:
        """``x W[h] + b[h]`` for every head ``h``: ``x`` ``[batch, pos, d_model]`` read by every head, or one input
        per head ``[batch, pos, head_index, d_model]`` (TransformerLens' split inputs). The fast kernel reads ``W``
        where it lies (``head_projection.project_heads``)."""
        if x.ndim == 3 and self.uses_fast_kernels():
            return project_heads(x, W, b)
        if x.ndim == 3:
            return (
                einops.einsum(x, W, "batch pos d_model, head_index d_model d_head -> batch pos head_index d_head") + b
            )
        return (
            einops.einsum(
                x, W, "batch pos head_index d_model, head_index d_model d_head -> batch pos head_index d_head"
            )
            + b
        )

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        """Input weights loaded with ``assign=True`` are laid out as ``head_layout`` says (copied only where they are
        not)."""
        if local_metadata.get("assign_to_params_buffers", False):
            place_assigned(state_dict, prefix, self._parameters, self.head_layout)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def _combine_heads(self, z: Tensor) -> Tensor:
        """``sum_h z[h] W_O[h] + b_O``: one product over ``(head_index d_head)`` (or the hooked ``hook_result``'s sum).

        Same as ``einsum(z, W_O, "batch pos head_index d_head, head_index d_head d_model -> batch pos d_model") + b_O``.
        """
        hook_result = self._modules.get("hook_result")
        if isinstance(hook_result, HookPoint) and hook_result.has_hooks():
            summed = hooked_results_sum(self, z)  # None where the hooks left each head's result as it was
            if summed is not None:
                return summed
        z_heads = einops.rearrange(z, "batch pos head_index d_head -> batch pos (head_index d_head)")
        W_O_heads = einops.rearrange(self.W_O, "head_index d_head d_model -> (head_index d_head) d_model")
        return affine(z_heads, W_O_heads, self.b_O)

    def extra_repr(self) -> str:
        return "" if self.softcap is None else f"softcap={self.softcap}"

"""Transformer blocks: three classes, each built from its parts, with the variations as optional parts.

A block takes its norm, attention and MLP parts already built (a family's recipe picks them),
registers them in forward order (so ``named_modules()`` lists hooks as they fire) and adds the
residual-stream hooks of DESIGN section 3 around them. Norms are named in the order their
sublayers run: ``ln1`` before (or after) attention, ``ln2`` with cross-attention when there is
one, the MLP's last (``ln2``, or ``ln3`` beside cross-attention; TransformerLens' names).

=================  ====================================================================================
``PreNormBlock``   ``resid_mid = resid_pre + attn(ln1(resid_pre))``, ``resid_post = resid_mid +
                   mlp(ln2(resid_mid))``. Optional: the MLP (attention-only: ``resid_post = resid_pre +
                   attn_out``, no ``hook_resid_mid``); the pre norms (None: the sublayer reads the stream
                   as it is, OLMo 2); norms on each sublayer's output, ``ln1_post``/``ln2_post`` (Gemma 2,
                   OLMo 2); cross-attention over an encoder's output between attention and the MLP (T5,
                   the pre-LN Transformer); writers beside the MLP reading its normalized input (the
                   adapter); TransformerLens' input hooks and shortformer positions
                   (``parts.input_hooks``)
``PostNormBlock``  post-norm (BERT, BART): the norms act on the stream itself, after each sum; optional
                   cross-attention between attention and the MLP
``ParallelBlock``  attention and the MLP both read the block's input (GPT-NeoX); optional shared norm
                   (GPT-J: no ``ln2``, one ``ln1`` read by both)
=================  ====================================================================================

How the formulas differ, and which identities hold in each, is in each class's docstring.
"""

from collections.abc import Mapping
from typing import Any

from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.core.errors import CompatValueError
from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.cross_attention import CrossAttentionSource, DecoderLayerKVCache
from interp_transformer.parts.input_hooks import INPUT_HOOKS, attend_with_input_hooks
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.writers import Step, StreamBlock, StreamNorm, Writer

KVCache = LayerKVCache | DecoderLayerKVCache | None


def _through(norm: nn.Module | None, x: Tensor) -> Tensor:
    """``norm(x)``, or ``x`` as it is where there is no norm."""
    return x if norm is None else norm(x)


def _caches(kv_cache, reads_source: bool) -> tuple:
    """``(self-attention's cache, cross-attention's cache)``: a decoder block's cache holds both."""
    if not reads_source:
        return kv_cache, None
    return (None, None) if kv_cache is None else (kv_cache.self_attn, kv_cache.cross_attn)


def _check_source(source) -> CrossAttentionSource:
    if not isinstance(source, CrossAttentionSource):
        raise TypeError(
            f"a decoder block reads the encoder through a CrossAttentionSource, got {type(source).__name__}"
        )
    return source


def _cross_attend(block: Any, normalized: Tensor, layout, cache, source: Any) -> Tensor:
    return block.cross_attn(normalized, source.layout(layout), cache, source.encoder_out)


class PreNormBlock(StreamBlock):
    """A pre-norm block: each sublayer reads the stream through its own norm and adds its output to it.

    ::

        attn_out        = ln1_post(attn(ln1(resid_pre)))                       (ln1, ln1_post optional)
        resid_mid       = resid_pre + attn_out
        resid_mid_cross = resid_mid + cross_attn(ln2(resid_mid), encoder_out)   (with cross-attention)
        mlp_out         = ln2_post(mlp(ln2(.)))                                 (ln3 with cross-attention)
        resid_post      = . + mlp_out (+ each writer beside the MLP, reading ln2(.) too)

    The stream is the sum of every write (``resid_post = resid_pre + attn_out + ... + mlp_out``).
    Where a sublayer's output passes a post norm, ``attn_out = sum_h z_h W_O[h] + b_O`` does not
    hold; with the norm's scale frozen it is linear again (the writer's ``output_norm``).

    ``beside_mlp`` maps a name to a writer run beside the MLP (the adapter): registered as
    ``name`` with ``hook_<name>_out``, it reads the MLP's normalized input and its output is added
    after the MLP's. ``attn_in``, ``split_qkv_input``, ``mlp_in`` and ``shortformer`` are
    TransformerLens' input hooks and positions (``parts.input_hooks``); they only add hook points.
    """

    def __init__(
        self,
        ln1: nn.Module | None,
        attn: nn.Module,
        ln2: nn.Module | None = None,
        mlp: nn.Module | None = None,
        *,
        ln1_post: nn.Module | None = None,
        ln2_post: nn.Module | None = None,
        cross_attn: nn.Module | None = None,
        cross_norm: nn.Module | None = None,
        beside_mlp: Mapping[str, nn.Module] | None = None,
        attn_in: bool = False,
        split_qkv_input: bool = False,
        mlp_in: bool = False,
        shortformer: bool = False,
    ):
        super().__init__()
        beside_mlp = dict(beside_mlp or {})
        _check_pre_norm_parts(ln2, mlp, ln1_post, ln2_post, cross_attn, cross_norm, beside_mlp, mlp_in)
        self.shortformer = shortformer
        self.reads_source = cross_attn is not None
        mlp_norm = "ln3" if self.reads_source else "ln2"
        self._mlp_norm = mlp_norm if ln2 is not None else None
        self._beside_mlp = tuple(beside_mlp)
        self._input_hooks = attn_in or split_qkv_input or shortformer
        self.hook_resid_pre = HookPoint()
        for name in INPUT_HOOKS["attn_in"] if attn_in else ():
            setattr(self, name, HookPoint())
        for name in INPUT_HOOKS["split_qkv_input"] if split_qkv_input else ():
            setattr(self, name, HookPoint())
        if ln1 is not None:
            self.ln1 = ln1
        self.attn = attn
        if ln1_post is not None:
            self.ln1_post = ln1_post
        self.hook_attn_out = HookPoint()
        if mlp is not None:
            self.hook_resid_mid = HookPoint()
        if cross_attn is not None and cross_norm is not None:
            self.ln2 = cross_norm
            self.cross_attn = cross_attn
            self.hook_cross_attn_out = HookPoint()
            self.hook_resid_mid_cross = HookPoint()
        if mlp is not None:
            if mlp_in:
                self.hook_mlp_in = HookPoint()
            if ln2 is not None:
                setattr(self, mlp_norm, ln2)
            self.mlp = mlp
            if ln2_post is not None:
                self.ln2_post = ln2_post
            self.hook_mlp_out = HookPoint()
            for name, part in beside_mlp.items():
                setattr(self, name, part)
                setattr(self, f"hook_{name}_out", HookPoint())
        self.hook_resid_post = HookPoint()

    def parts(self) -> dict:
        """The arguments this block was built with (the same part objects): ``PreNormBlock(**block.parts())`` is it
        again, with fresh hook points."""
        get = self._modules.get
        return dict(
            ln1=get("ln1"),
            attn=self.attn,
            ln2=get(self._mlp_norm) if self._mlp_norm else None,
            mlp=get("mlp"),
            ln1_post=get("ln1_post"),
            ln2_post=get("ln2_post"),
            cross_attn=get("cross_attn"),
            cross_norm=get("ln2") if self.reads_source else None,
            beside_mlp={name: self._modules[name] for name in self._beside_mlp},
            **self.input_hooks(),
        )

    def input_hooks(self) -> dict:
        """TransformerLens' input hooks and positions this block was built with (``attn_in=``, ...)."""
        return dict(
            attn_in="hook_attn_in" in self._modules,
            split_qkv_input="hook_q_input" in self._modules,
            mlp_in="hook_mlp_in" in self._modules,
            shortformer=self.shortformer,
        )

    def with_input_hooks(self, **flags) -> "PreNormBlock":
        """This block with the input hooks ``flags`` ask for: the same parts, hook points and hooks attached to
        them (TransformerLens' toggles)."""
        new = PreNormBlock(**{**self.parts(), **flags})
        for name, module in self.named_children():
            if isinstance(module, HookPoint) and name in new._modules:
                setattr(new, name, module)  # keep the hooks already attached there
        return new

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(norm, part)``: each pre norm and the parts that read its output (what ``fold_ln`` folds into).

        Post norms have no reader to fold into: their output goes straight into the stream. A norm
        read by the MLP and a writer beside it is listed once per reader, so folding reaches both.
        """
        get = self._modules.get
        readers = [(get("ln1"), self.attn)]
        if self.reads_source:
            readers.append((self.ln2, self.cross_attn))
        if self._mlp_norm is not None:
            norm = getattr(self, self._mlp_norm)
            readers += [(norm, self.mlp)] + [(norm, getattr(self, name)) for name in self._beside_mlp]
        return [(norm, part) for norm, part in readers if norm is not None]

    def stream(self) -> list[Step]:
        """The residual stream's steps: what is added to it, in forward order (through the post norms, if any)."""
        get = self._modules.get
        steps: list[Step] = [Writer("attn", self.attn, self.hook_attn_out.name, output_norm=get("ln1_post"))]
        if self.reads_source:
            steps.append(Writer("cross_attn", self.cross_attn, self.hook_cross_attn_out.name, reads_source=True))
        if "mlp" in self._modules:
            steps.append(Writer("mlp", self.mlp, self.hook_mlp_out.name, output_norm=get("ln2_post")))
        return steps + [
            Writer(name, getattr(self, name), getattr(self, f"hook_{name}_out").name) for name in self._beside_mlp
        ]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: KVCache = None,
        source: CrossAttentionSource | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        modules = self._modules
        self_cache, cross_cache = _caches(kv_cache, self.reads_source)
        if self.reads_source:
            source = _check_source(source)
        resid_pre = self.hook_resid_pre(resid_pre)
        if self._input_hooks:
            attended = attend_with_input_hooks(self, resid_pre, layout, self_cache)
        else:
            attended = self.attn(_through(modules.get("ln1"), resid_pre), layout, self_cache)
        attn_out = self.hook_attn_out(_through(modules.get("ln1_post"), attended))
        if "mlp" not in modules:
            return self.hook_resid_post(resid_pre + attn_out)
        resid = self.hook_resid_mid(resid_pre + attn_out)
        if self.reads_source:
            cross_attn_out = self.hook_cross_attn_out(_cross_attend(self, self.ln2(resid), layout, cross_cache, source))
            resid = self.hook_resid_mid_cross(resid + cross_attn_out)
        mlp_in = self.hook_mlp_in(resid.clone()) if "hook_mlp_in" in modules else resid
        normalized = _through(modules.get(self._mlp_norm) if self._mlp_norm else None, mlp_in)
        resid = resid + self.hook_mlp_out(_through(modules.get("ln2_post"), self.mlp(normalized)))
        for name in self._beside_mlp:
            resid = resid + getattr(self, f"hook_{name}_out")(getattr(self, name)(normalized))
        return self.hook_resid_post(resid)


def _check_pre_norm_parts(ln2, mlp, ln1_post, ln2_post, cross_attn, cross_norm, beside_mlp, mlp_in) -> None:
    if mlp is None:
        needing = {"ln2": ln2, "ln2_post": ln2_post, "cross_attn": cross_attn, "beside_mlp": beside_mlp or None}
        given = [name for name, value in needing.items() if value is not None]
        if given:
            raise ValueError(f"{given[0]} needs an MLP: this block is attention-only (mlp=None)")
        if mlp_in:
            raise CompatValueError("hook_mlp_in needs an MLP: this block is attention-only")
    if (ln1_post is None) != (ln2_post is None):
        raise CompatValueError(
            "ln1_post and ln2_post come together, and need an MLP (a block with norms after both sublayers), got "
            f"ln1_post={type(ln1_post).__name__}, ln2_post={type(ln2_post).__name__}"
        )
    if (cross_attn is None) != (cross_norm is None):
        raise ValueError(
            "cross_attn and cross_norm come together (cross-attention reads the stream through its norm), got "
            f"cross_attn={type(cross_attn).__name__}, cross_norm={type(cross_norm).__name__}"
        )


class PostNormBlock(StreamBlock):
    """Post-norm block (BERT, BART): the norms renormalize the residual stream itself.

    ``resid_mid = resid_pre + attn(resid_pre)``; ``ln1`` normalizes it, and that normalized
    stream is what the next sublayer reads *and* what its output is added to:
    ``resid_post = ln1(resid_mid) + mlp(ln1(resid_mid))``; the block's output is
    ``normalized_resid_post = ln2(resid_post)``, the next block's ``resid_pre``. Unlike a
    pre-norm block the stream is renormalized after every sublayer, so ``resid_post !=
    resid_mid + mlp_out`` (it is ``ln1.hook_normalized + mlp_out``).

    With ``cross_attn`` (BART, Marian, the original Transformer) cross-attention runs between
    attention and the MLP: ``resid_mid_cross = ln1(resid_mid) + cross_attn(ln1(resid_mid),
    encoder_out)``, renormalized by ``cross_norm`` (named ``ln2``); the MLP's norm is then ``ln3``.
    """

    def __init__(
        self,
        attn: nn.Module,
        ln1: nn.Module,
        mlp: nn.Module,
        ln2: nn.Module,
        *,
        cross_attn: nn.Module | None = None,
        cross_norm: nn.Module | None = None,
    ):
        super().__init__()
        if (cross_attn is None) != (cross_norm is None):
            raise ValueError(
                "cross_attn and cross_norm come together (the norm renormalizes the stream after cross-attention), "
                f"got cross_attn={type(cross_attn).__name__}, cross_norm={type(cross_norm).__name__}"
            )
        self.reads_source = cross_attn is not None
        self._mlp_norm = "ln3" if self.reads_source else "ln2"
        self.hook_resid_pre = HookPoint()
        self.attn = attn
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln1 = ln1
        if cross_attn is not None and cross_norm is not None:
            self.cross_attn = cross_attn
            self.hook_cross_attn_out = HookPoint()
            self.hook_resid_mid_cross = HookPoint()
            self.ln2 = cross_norm
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()
        setattr(self, self._mlp_norm, ln2)
        self.hook_normalized_resid_post = HookPoint()

    def stream(self) -> list[Step]:
        """Each write followed by the norm that renormalizes the stream after it."""
        steps: list[Step] = [
            Writer("attn", self.attn, self.hook_attn_out.name),
            StreamNorm("ln1", self.ln1, self.hook_resid_mid.name),
        ]
        if self.reads_source:
            steps += [
                Writer("cross_attn", self.cross_attn, self.hook_cross_attn_out.name, reads_source=True),
                StreamNorm("ln2", self.ln2, self.hook_resid_mid_cross.name),
            ]
        norm = self._mlp_norm
        return steps + [
            Writer("mlp", self.mlp, self.hook_mlp_out.name),
            StreamNorm(norm, self._modules[norm], self.hook_resid_post.name),
        ]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: KVCache = None,
        source: CrossAttentionSource | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        self_cache, cross_cache = _caches(kv_cache, self.reads_source)
        if self.reads_source:
            source = _check_source(source)
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(resid_pre, layout, self_cache))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        normalized = self.ln1(resid_mid)
        if self.reads_source:
            cross_attn_out = self.hook_cross_attn_out(_cross_attend(self, normalized, layout, cross_cache, source))
            normalized = self.ln2(self.hook_resid_mid_cross(normalized + cross_attn_out))
        mlp_out = self.hook_mlp_out(self.mlp(normalized))
        resid_post = self.hook_resid_post(normalized + mlp_out)
        return self.hook_normalized_resid_post(getattr(self, self._mlp_norm)(resid_post))


class ParallelBlock(StreamBlock):
    """Attention and the MLP both read the block's input and write to the stream at once.

    ``resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln2(resid_pre))`` (GPT-NeoX, Pythia: two
    norms of the same input). With ``ln2=None`` the norm is shared (GPT-J): ``normalized =
    ln1(resid_pre)``, computed once and hooked once, is read by both, and ``norm_readers()`` lists
    ``ln1`` twice so that folding the norm reaches both (TransformerLens' GPT-J copies ``ln1``'s
    weights into an ``ln2`` computed a second time).

    There is no residual mid-point: the MLP never sees ``resid_pre + attn_out``, so there is no
    ``hook_resid_mid``. The stream is still the sum of every write: ``resid_post = resid_pre +
    attn_out + mlp_out``.
    """

    def __init__(self, ln1: nn.Module, attn: nn.Module, ln2: nn.Module | None, mlp: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = ln1
        self.attn = attn
        self.hook_attn_out = HookPoint()
        if ln2 is not None:
            self.ln2 = ln2
        self.mlp = mlp
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(norm, part)``: each norm and the part that reads its output (the shared ``ln1`` twice)."""
        ln2 = self._modules.get("ln2")
        return [(self.ln1, self.attn), (self.ln1 if ln2 is None else ln2, self.mlp)]

    def stream(self) -> list[Step]:
        """Attention's and the MLP's writes (both read the same block input)."""
        return [Writer("attn", self.attn, self.hook_attn_out.name), Writer("mlp", self.mlp, self.hook_mlp_out.name)]

    @shape_checked
    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        layout: TokenLayout | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        normalized = self.ln1(resid_pre)
        attn_out = self.hook_attn_out(self.attn(normalized, layout, kv_cache))
        ln2 = self._modules.get("ln2")
        mlp_out = self.hook_mlp_out(self.mlp(normalized if ln2 is None else ln2(resid_pre)))
        return self.hook_resid_post(resid_pre + attn_out + mlp_out)


__all__ = ["ParallelBlock", "PostNormBlock", "PreNormBlock"]

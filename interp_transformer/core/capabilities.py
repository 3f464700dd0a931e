"""What a model's residual stream is: the facts tools ask instead of a model's class.

Every model declares its ``Capabilities`` once (through its architecture module), and
the cache, verification, the report and every analysis tool read them. A new
architecture then reaches every tool without an edit there: a post-norm decoder lands
on the post-norm path because it says it is post-norm, not because a tool knows its class.

==========================  ==============================================================
``causal``                  a query sees only itself and earlier keys (decoders); False for
                            bidirectional attention (encoders)
``norm_placement``          ``"pre"``: each block reads a normalized copy and adds its writes
                            to the stream, so the residual stream is the sum of every
                            component's write; ``"post"``: norms renormalize the stream
                            inside the blocks, so it is no such sum
``final_norm``              attribute path of the norm that reads the final residual stream
                            before the read-out (``"ln_final"``), or None
``read_out``                attribute path of the linear map from the final norm's output to
                            the logits (``"unembed"``), or None when the logits are not a
                            linear function of it (BERT's MLM head is non-linear)
``next_token_logits``       the forward pass returns next-token logits: the language-model
                            loss applies (patching metrics, detector losses, gradients)
``embedding_norm``          attribute path of a norm applied to the summed embeddings before
                            block 0 (BERT's ``embed_ln``), or None
==========================  ==============================================================

In an encoder-decoder the fields describe the decoder, the stack the logits come from
(``final_norm`` is ``"decoder.ln_final"``).

What a single family brings is not a field here: the parts say it, and tools ask them.
A block's writers (``components.writers``) carry an output norm (Gemma 2's ``ln1_post``),
a mixture of experts' routing, or cross-attention's reading of the source; the read-out
carries its soft-cap. The model sums them up as ``model.has_experts``,
``model.has_cross_attention`` and ``model.logit_softcap``.
"""

from dataclasses import dataclass

NORM_PLACEMENTS = ("pre", "post")


@dataclass(frozen=True)
class Capabilities:
    """The residual-stream facts of one model (see the module docstring)."""

    causal: bool
    norm_placement: str
    final_norm: str | None
    read_out: str | None
    next_token_logits: bool
    embedding_norm: str | None = None

    def __post_init__(self) -> None:
        if self.norm_placement not in NORM_PLACEMENTS:
            raise ValueError(f"norm_placement must be one of {NORM_PLACEMENTS}, got {self.norm_placement!r}")

    @property
    def additive_residual(self) -> bool:
        """The residual stream is the sum of the writes of every component before it (pre-norm)."""
        return self.norm_placement == "pre"

    @property
    def linear_logits(self) -> bool:
        """Logits are ``read_out(final_norm(residual))`` with both linear once the norm's scale is frozen:
        what the logit lens and direct logit attribution need. With a soft-capped read-out
        (``model.logit_softcap``) this is true of the logits before the cap, which is what they then read."""
        return (
            self.additive_residual
            and self.final_norm is not None
            and self.read_out is not None
            and self.next_token_logits
        )

    def why_not_additive(self) -> str:
        """One sentence saying why residual-stream sums do not apply (for error messages)."""
        return (
            "this model is post-norm (post-LayerNorm): its norms renormalize the residual stream inside every block, "
            "so the stream is not a sum of component outputs and no final norm reads such a sum"
        )


__all__ = ["Capabilities", "NORM_PLACEMENTS"]

"""Read-outs: what one run of a model computes, read from its cache and its weights.

===============================  ===========================================================================
``readouts.attention``           attention patterns, entropy, head detectors (previous-token, duplicate-token,
                                 induction, your own target pattern)
``readouts.circuits``            full QK and OV circuits (``FactoredMatrix``), copying and composition scores
``readouts.neurons``             neuron activations, top activating examples by streaming, direct logit effect
``readouts.attribution``         the logit lens and direct logit attribution (heads, MLPs, neurons), through
                                 a decoder's stack or an encoder-decoder's decoder
``readouts.post_norm``           a post-norm model's exact counterpart: direct contributions to a direction of
                                 its hidden states (BERT-style encoders)
``readouts.encoder_decoder``     the decoder's residual stream split into its writers; direct logit attribution
                                 through every self- and cross-attention head
``readouts.cross_attention``     cross-attention patterns and how closely they follow an alignment
``readouts.experts``             mixtures of experts: routing, expert usage, per-expert neurons and attribution
===============================  ===========================================================================

Import the module you need: ``from analysis.readouts import attention, attribution``.
"""

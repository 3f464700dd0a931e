"""The model classes and what every model is made of beyond its parts.

==================  ===================================================================
``decoder``         ``DemoTransformer``: a causal decoder of any registered architecture
``base``            what every model class shares: stacked weights, ``QK``/``OV``, init,
                    capabilities, ``act_name``, the parts' answers (``has_experts``, ...)
``stack``           the one residual stack: embeddings in, blocks (``ResidualStack``)
``capabilities``    the residual-stream facts tools ask instead of a class
``config``          the GPT-2 config and presets, and the checks every config shares
``kv_cache``        the key/value cache for generation
``processing``      weight processing (``fold_ln``, centring, value-bias folding)
``losses``          the language-model loss
``shape_checks``    run-time shape checks (jaxtyping through typeguard)
``token_checks``    checks of token ids and ``stop_at_layer``
==================  ===================================================================

``EncoderTransformer`` and ``EncoderDecoderTransformer`` live in ``interp_transformer.models.encoder``
and ``interp_transformer.models.encoder_decoder``, with their inputs.
"""

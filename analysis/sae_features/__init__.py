"""Reading SAE features: what each one fires on, what it writes, and what it does to one prediction.

An SAE (``interp_transformer.sae.SAE``) on a model's hook turns the activation there into
feature activations. These tools read them, one concern per file:

==========================================  =====================================================
``read_features(model, sae, corpus)``       one streamed pass: each feature's top activations with
                                            context windows (``examples``) and activation histogram
                                            (``histogram``), memory independent of the corpus
``feature_logit_effect(model, sae, f)``     one unit of ``f`` through the final norm and ``W_U``:
                                            the tokens it promotes and suppresses (``logits``)
``feature_attribution(model, sae, ...)``    one prompt: activation x gradient of a metric, and exact
                                            direct logit attribution of each feature's write, which
                                            with the SAE's bias and error terms sums to the hook's
                                            (``attribution``; the terms come from ``writes``)
``feature_dashboards(model, sae, corpus)``  an offline HTML page per feature and an index
                                            (``dashboard``, ``dashboard_html``)
==========================================  =====================================================

See ``docs/saes.md``.
"""

from .attribution import FeatureAttribution, feature_attribution
from .dashboard import FeatureDashboard, FeatureDashboards, build_dashboards, feature_dashboards
from .examples import FeatureExamples, StreamingTopExamples
from .histogram import FeatureHistograms, StreamingHistogram
from .logits import FeatureLogitEffect, feature_logit_effect, why_no_logit_effect
from .reading import FeatureReading, read_features
from .writes import DecodedTerms, ResidualWrite, decoded_terms, residual_write

__all__ = [
    "DecodedTerms",
    "FeatureAttribution",
    "FeatureDashboard",
    "FeatureDashboards",
    "FeatureExamples",
    "FeatureHistograms",
    "FeatureLogitEffect",
    "FeatureReading",
    "ResidualWrite",
    "StreamingHistogram",
    "StreamingTopExamples",
    "build_dashboards",
    "decoded_terms",
    "feature_attribution",
    "feature_dashboards",
    "feature_logit_effect",
    "read_features",
    "residual_write",
    "why_no_logit_effect",
]

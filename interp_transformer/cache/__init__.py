"""What a run leaves behind: the activation cache and the model methods that fill it.

=====================  ==================================================================
``activations``        ``ActivationCache``: the cached activations, by hook name or alias
``caching``            ``run_with_cache`` and its backward pass (the model classes' mixin)
``residual_stacks``    the residual stream split by layer or by component
``residual_norms``     the norms that read the stream, applied to a stack (``apply_ln_to_stack``)
=====================  ==================================================================

Above the parts and the text helpers, below the model classes: the cache reads a model only through the
methods every model class has.
"""

from interp_transformer.cache.activations import ActivationCache

__all__ = ["ActivationCache"]

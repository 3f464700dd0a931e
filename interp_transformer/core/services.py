"""The few verbs the model classes offer that upper floors carry out: loading a checkpoint, splicing SAEs in.

``DemoTransformer.from_pretrained`` and ``model.saes(...)`` are methods for the user's convenience, but loading
builds model classes and the SAE splice runs them, so neither can sit below the models. The model classes call
``service(name)``; the package's ``__init__`` (the top floor, which imports every floor) hands each one in with
``provide`` when ``interp_transformer`` is imported. Nothing here imports the package.
"""

from collections.abc import Callable

SERVICES = {
    "from_pretrained": "interp_transformer.loading.from_pretrained",
    "splice_saes": "interp_transformer.sae.splice.splice_saes",
    "run_with_saes": "interp_transformer.sae.splice.run_with_saes",
    "run_with_cache_with_saes": "interp_transformer.sae.splice.run_with_cache_with_saes",
}
_PROVIDED: dict[str, Callable] = {}


def provide(**functions: Callable) -> None:
    """Hand in the functions that carry out the services (called once, by ``interp_transformer/__init__.py``)."""
    unknown = sorted(set(functions) - set(SERVICES))
    if unknown:
        raise KeyError(f"no service named {unknown}; the services are {sorted(SERVICES)}")
    _PROVIDED.update(functions)


def service(name: str) -> Callable:
    """The function that carries out ``name`` (one of ``SERVICES``)."""
    if name not in SERVICES:
        raise KeyError(f"no service named {name!r}; the services are {sorted(SERVICES)}")
    if name not in _PROVIDED:
        raise RuntimeError(
            f"{name} is carried out by {SERVICES[name]}, which has not been provided: import interp_transformer"
        )
    return _PROVIDED[name]

"""The ``transformers`` releases the Hugging Face references are tested with, and a check of the installed one.

The references read Hugging Face models through public outputs and functions only, but
Hugging Face changes its modules every few weeks (5.24.0 moved GPT-J's rotary table into a
module of its own and changed which field picks Gemma's activation). CI tests the release
the lock pins (``.ci/constraints.txt``) and the newest release this range allows
(``.ci/newest``); ``pyproject.toml`` states the same range, and a test holds the two equal.
Outside it, ``verify`` still runs, and says that the versions are untested.
"""

import warnings

from packaging.specifiers import SpecifierSet
from packaging.version import Version

SUPPORTED_TRANSFORMERS = ">=5.24.0,<5.25"


def installed_transformers() -> str:
    """The version of the ``transformers`` that is imported."""
    import transformers

    return transformers.__version__


def transformers_version_problem(version: str | None = None) -> str | None:
    """``None`` when ``version`` (default: the installed ``transformers``) is in the supported range, else why not."""
    if version is None:
        version = installed_transformers()
    if Version(version) in SpecifierSet(SUPPORTED_TRANSFORMERS):
        return None
    return (
        f"transformers {version} is outside the range the Hugging Face references are tested with "
        f"({SUPPORTED_TRANSFORMERS}); results may differ from Hugging Face's for reasons of its own: install "
        f"'transformers{SUPPORTED_TRANSFORMERS}' to verify against a tested version"
    )


def warn_if_untested_transformers() -> None:
    """A ``UserWarning`` naming the supported range when the installed ``transformers`` is outside it."""
    problem = transformers_version_problem()
    if problem is not None:
        warnings.warn(problem, stacklevel=3)


__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "installed_transformers",
    "transformers_version_problem",
    "warn_if_untested_transformers",
]

"""DeepPod: a shared, self-service AI factory.

The public API is what ``__all__`` lists. Names load lazily so that importing
``deeppod.runtime`` inside a user job, or the CLI, stays light.
"""

from __future__ import annotations

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "Client": "deeppod.sdk.client",
    "JobSpec": "deeppod.job_spec",
    "DeepPodError": "deeppod.errors",
    "InvalidRequest": "deeppod.errors",
    "Unauthenticated": "deeppod.errors",
    "Forbidden": "deeppod.errors",
    "NotFound": "deeppod.errors",
    "Conflict": "deeppod.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'deeppod' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

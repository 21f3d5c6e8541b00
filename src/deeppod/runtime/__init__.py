"""Library imported INSIDE user jobs. Imports the standard library (and torch, where a
feature needs it) only; never server code."""

from deeppod.runtime.context import JobContext, job_context

__all__ = ["JobContext", "job_context"]

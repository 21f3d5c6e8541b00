"""``deeppod.runtime``: the library imported INSIDE user jobs.

It imports torch and the standard library only (never server code), and loads lazily so
``import deeppod.runtime`` costs nothing until a feature is used::

    from deeppod import runtime
    ctx = runtime.init()                      # NCCL with CUDA, gloo otherwise
    ckpt = runtime.Checkpointer(keep=3)
    state = ckpt.load_latest(model=model, optimizer=opt, sampler=sampler)
    ...
    runtime.report(step, loss=loss, accuracy=acc)
    if runtime.should_stop():                 # SIGTERM: preemption, resize, cancel
        ckpt.save(step, model=model, optimizer=opt, sampler=sampler, epoch=epoch)
        runtime.exit_for_resume()             # exit code 75: "resume me"
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "JobContext": "deeppod.runtime.context",
    "job_context": "deeppod.runtime.context",
    "init": "deeppod.runtime.context",
    "Checkpointer": "deeppod.runtime.checkpoint",
    "ElasticSampler": "deeppod.runtime.sampler",
    "scale_for_world": "deeppod.runtime.scaling",
    "Resizer": "deeppod.runtime.resize",
    "StepAbandoned": "deeppod.errors",
    "shard": "deeppod.runtime.sharding",
    "EXIT_RESUME": "deeppod.runtime.stop",
    "should_stop": "deeppod.runtime.stop",
    "request_stop": "deeppod.runtime.stop",
    "exit_for_resume": "deeppod.runtime.stop",
    "StopGuard": "deeppod.runtime.stop",
    "Reporter": "deeppod.runtime.metrics",
    "report": "deeppod.runtime.metrics",
    "report_histograms": "deeppod.runtime.metrics",
    "model_histograms": "deeppod.runtime.metrics",
    "histogram": "deeppod.runtime.metrics",
    "ActivationRecorder": "deeppod.runtime.metrics",
    "trials": "deeppod.runtime.trial",
    "Trial": "deeppod.runtime.trial",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'deeppod.runtime' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

"""One error root, declared in one module."""

import importlib
import pkgutil

import deeppod
from deeppod.errors import DeepPodError


def all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from all_subclasses(sub)


def test_every_error_class_lives_in_deeppod_errors():
    for m in pkgutil.walk_packages(deeppod.__path__, "deeppod."):
        if m.name.endswith("__main__") or ".migrations." in m.name:
            continue
        importlib.import_module(m.name)
    outside = sorted(f"{c.__module__}.{c.__name__}" for c in all_subclasses(DeepPodError)
                     if c.__module__ != "deeppod.errors" and not c.__module__.startswith("tests"))
    assert outside == []


def test_codes_are_stable_and_distinct_where_the_class_is_its_own():
    from deeppod import errors

    assert errors.BadInput("x").code == "bad_input" and errors.BadInput("x").status == 422
    assert errors.NoReplica("x").code == "unavailable" and errors.NoReplica("x").status == 503
    assert errors.MoveFailed("x").status == 500

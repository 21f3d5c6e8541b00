import importlib

import pytest

import deeppod
from deeppod import errors


def test_all_is_exactly_the_public_api():
    assert sorted(deeppod.__all__) == sorted(
        ["__version__", "Client", "JobSpec", "DeepPodError", "InvalidRequest", "Unauthenticated", "Forbidden",
         "NotFound", "Conflict"])
    assert set(dir(deeppod)) == set(deeppod.__all__)


def test_every_public_name_is_the_object_its_module_defines():
    from deeppod.sdk.client import Client

    assert deeppod.Client is Client
    from deeppod.job_spec import JobSpec

    assert deeppod.JobSpec is JobSpec
    for name in ("DeepPodError", "InvalidRequest", "Unauthenticated", "Forbidden", "NotFound", "Conflict"):
        assert getattr(deeppod, name) is getattr(errors, name)
    assert isinstance(deeppod.__version__, str) and deeppod.__version__.count(".") == 2
    with pytest.raises(AttributeError):
        deeppod.JobService  # noqa: B018  (internals are not reachable from the package)


def test_runtime_exports_resolve_to_their_modules():
    from deeppod import runtime

    for name in runtime.__all__:
        value = getattr(runtime, name)
        assert value is getattr(importlib.import_module(runtime._EXPORTS[name]), name)


def test_every_error_shares_one_root():
    """Every exception class defined in deeppod.errors (not only the exported ones) is a DeepPodError."""
    import inspect

    defined = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, BaseException) and c.__module__ == errors.__name__]
    assert len(defined) > 8 and [c.__name__ for c in defined if not issubclass(c, deeppod.DeepPodError)] == []


ALL_ERRORS = [errors.InvalidRequest, errors.Unauthenticated, errors.Forbidden, errors.NotFound, errors.Conflict,
              errors.TooLarge, errors.UnsupportedMediaType, errors.Unavailable]


def test_each_http_status_has_one_error_class_and_one_code():
    assert len({c.status for c in ALL_ERRORS}) == len(ALL_ERRORS)
    assert len({c.code for c in ALL_ERRORS}) == len(ALL_ERRORS)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_sdk_rebuilds_every_api_error(cls):
    """What the server's one handler sends comes back as the same class, code and message."""
    import json

    from deeppod.api.errors import error_response

    sent = cls("what to do next")
    resp = error_response(sent.status, sent.code, sent.message)
    got = errors.from_response(resp.status_code, json.loads(resp.body))
    assert type(got) is cls and got.code == sent.code and got.message == "what to do next"

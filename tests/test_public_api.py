import deeppod


def test_all_is_exactly_the_public_api():
    assert sorted(deeppod.__all__) == sorted(
        ["__version__", "Client", "DeepPodError", "InvalidRequest", "Unauthenticated", "Forbidden", "NotFound",
         "Conflict"])
    for name in deeppod.__all__:
        assert getattr(deeppod, name) is not None
    assert set(dir(deeppod)) == set(deeppod.__all__)


def test_every_error_shares_one_root():
    for name in ("InvalidRequest", "Unauthenticated", "Forbidden", "NotFound", "Conflict"):
        assert issubclass(getattr(deeppod, name), deeppod.DeepPodError)


def test_sdk_rebuilds_api_errors():
    from deeppod.errors import from_response

    err = from_response(403, {"error": {"code": "forbidden", "message": "job 3 belongs to another tenant"}})
    assert isinstance(err, deeppod.Forbidden) and err.code == "forbidden" and "another tenant" in str(err)

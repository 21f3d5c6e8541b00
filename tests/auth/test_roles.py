"""The route check on its own: which token may call which route, before any handler runs."""

import pytest

from deeppod.auth.roles import check_predict, check_route
from deeppod.auth.service import Principal
from deeppod.errors import Forbidden


def who(role="member", scope="all", job_id=None):
    return Principal(2, "ana", 1, "vision", role == "admin", job_id, role, scope)


@pytest.mark.parametrize("principal,method,route,params,ok", [
    (who(), "POST", "/v1/jobs", {}, True),
    (who("viewer"), "GET", "/v1/jobs", {}, True),
    (who("viewer"), "POST", "/v1/jobs", {}, False),
    (who(scope="read"), "DELETE", "/v1/tokens/{token_id}", {"token_id": "3"}, False),
    (who(scope="read"), "GET", "/v1/models", {}, True),
    (who(scope="predict"), "GET", "/v1/models", {}, False),
    (who(scope="predict"), "GET", "/v1/whoami", {}, True),
    (who(job_id=7), "POST", "/v1/jobs/{job_id}/metrics", {"job_id": "7"}, True),
    (who(job_id=7), "POST", "/v1/jobs/{job_id}/metrics", {"job_id": "8"}, False),
    (who(job_id=7), "PUT", "/v1/replicas/{job_id}", {"job_id": "7"}, False),  # a batch job is no replica
    (who(scope="replica", job_id=7), "PUT", "/v1/replicas/{job_id}", {"job_id": "7"}, True),
    (who(scope="replica", job_id=7), "PUT", "/v1/replicas/{job_id}", {"job_id": "8"}, False),
    (who(scope="replica", job_id=7), "GET", "/v1/jobs/{job_id}", {"job_id": "7"}, False),
    (who(scope="replica", job_id=7), "POST", "/v1/jobs/{job_id}/metrics", {"job_id": "7"}, False),
    (who(scope="replica", job_id=7), "POST", "/v1/models/{name}/versions", {"name": "m"}, False),
    (who(job_id=7), "POST", "/v1/jobs/{job_id}/cancel", {"job_id": "7"}, False),
    (who(job_id=7), "POST", "/v1/jobs", {}, False),
    (who("admin", job_id=7), "POST", "/v1/tenants", {}, False),  # an admin's job is still only a job
    # a notebook's token: its owner at work (submit, read a dataset, register), no lasting credentials
    (who(scope="notebook", job_id=7), "POST", "/v1/jobs", {}, True),
    (who(scope="notebook", job_id=7), "GET", "/v1/datasets/{name}", {"name": "d"}, True),
    (who(scope="notebook", job_id=7), "POST", "/v1/models/{name}/versions", {"name": "m"}, True),
    (who(scope="notebook", job_id=7), "POST", "/v1/tokens", {}, False),
    (who(scope="notebook", job_id=7), "POST", "/v1/access-keys", {}, False),
])
def test_check_route(principal, method, route, params, ok):
    if ok:
        check_route(principal, method, route, params)
    else:
        with pytest.raises(Forbidden):
            check_route(principal, method, route, params)


def test_predict_needs_a_user_token_that_may_predict():
    check_predict(who())
    check_predict(who(scope="predict"))
    for p in (who("viewer"), who(scope="read"), who(job_id=1)):
        with pytest.raises(Forbidden):
            check_predict(p)


def test_roles_default_from_is_admin():
    assert Principal(1, "root", 1, "default", True).role == "admin"
    assert Principal(2, "ana", 1, "default", False).role == "member"

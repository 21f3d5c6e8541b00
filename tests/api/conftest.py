import pytest
from fastapi.testclient import TestClient

from deeppod.api.app import create_app
from deeppod.cluster.gpus import LogicalProbe
from deeppod.executor.fake import FakeExecutor
from deeppod.server import bootstrap_admin, build
from deeppod.settings import Settings


class Api:
    def __init__(self, ctx, http: TestClient, admin: str):
        self.ctx, self.http, self.admin = ctx, http, admin

    def as_(self, token):
        return {"Authorization": f"Bearer {token}"}

    def user(self, name: str, tenant: str) -> str:
        self.http.post("/v1/tenants", json={"name": tenant}, headers=self.as_(self.admin))
        r = self.http.post("/v1/users", json={"name": name, "tenant": tenant}, headers=self.as_(self.admin))
        assert r.status_code == 201, r.text
        return r.json()["token"]


@pytest.fixture
def api(tmp_path):
    settings = Settings(home=tmp_path / "home", max_body_bytes=64 * 1024, cpus=8, memory_mb=16384)
    ctx = build(settings, executor=FakeExecutor(), probe=LogicalProbe(4))
    admin = bootstrap_admin(ctx)
    with TestClient(create_app(ctx)) as http:
        yield Api(ctx, http, admin)
    ctx.engine.dispose()

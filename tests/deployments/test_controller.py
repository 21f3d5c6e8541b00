"""The deployment controller's rounds: a steady deployment costs no writes, and health checks
reuse their connections."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from deeppod.contract import JobState
from deeppod.deployments.balancer import Balancer
from deeppod.deployments.controller import DeploymentController, HttpHealth
from deeppod.store.models import Job
from tests.deployments.test_service import replica_jobs


def test_health_checks_reuse_one_connection():
    connections = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            connections.append(self.client_address)
            super().setup()

        def do_GET(self):
            ok = self.path == "/healthz"
            self.send_response(200 if ok else 404)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    health = HttpHealth()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert all(health(url) for _ in range(20))
        assert len(connections) == 1
        assert not health("http://127.0.0.1:1")  # nothing listens: unhealthy, not an error
    finally:
        health.close()
        server.shutdown()


def test_a_steady_round_proves_the_lead_only_when_it_changes_something(deployed):
    sessions, models = deployed
    fences = []
    ctl = DeploymentController(sessions, Balancer(), models_root=models, health=lambda url: True, default_grace=5.0,
                               max_body_bytes=1 << 20, fence=lambda s: fences.append(1))
    ctl.tick()  # starts two replicas: a write, so it fences
    assert len(fences) == 1 and len(replica_jobs(sessions)) == 2
    with sessions.begin() as s:
        for n, job in enumerate(s.query(Job).filter(Job.kind == "serve")):
            job.state, job.endpoint = JobState.RUNNING, f"http://127.0.0.1:{9000 + n}"
    ctl.tick()  # the deployment becomes ready: its state is written
    assert len(fences) == 2
    for _ in range(3):
        ctl.tick()
    assert len(fences) == 2  # nothing changed: no write, no fence
    assert len(ctl.balancer.routes) == 1 and len(next(iter(ctl.balancer.routes.values())).targets) == 2

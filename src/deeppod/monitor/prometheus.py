"""The cluster in Prometheus' text format (``GET /metrics``): jobs by state and tenant, the
queue, each tenant's GPUs (guaranteed, allocated, borrowed), burst nodes and their cost, the
scheduling round, API request latency and the latest GPU samples per node. Read from the
store at each scrape."""

from __future__ import annotations

import time
from collections import Counter

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as CounterMetric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.auth.service import Principal
from deeppod.contract import ACTIVE_STATES, JobState
from deeppod.monitor import service
from deeppod.plans.service import plan_status
from deeppod.store.models import BurstCharge, GpuSample, Job, Node, Tenant

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GPU_GAUGES = (("util", "deeppod_gpu_utilization_percent", "GPU utilization"),
              ("memory_used_mb", "deeppod_gpu_memory_used_megabytes", "GPU memory in use"),
              ("power_w", "deeppod_gpu_power_watts", "GPU power draw"),
              ("temperature_c", "deeppod_gpu_temperature_celsius", "GPU temperature"),
              ("ecc_uncorrected", "deeppod_gpu_ecc_uncorrected_errors", "volatile uncorrectable ECC errors"))


class ApiLatency:
    """API request latency by method, route template and status (one per app), and its
    admission: how many requests it lets in at once and how many it answered 503 busy."""

    def __init__(self, registry: CollectorRegistry):
        self.hist = Histogram("deeppod_api_request_seconds", "API request latency", ["method", "route", "status"],
                              registry=registry, buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.slots = Gauge("deeppod_api_concurrency_limit", "requests the API lets in at once (admission)",
                           registry=registry)
        self.shed = CounterMetric("deeppod_api_shed", "requests answered 503 busy: no turn came in time",
                            registry=registry)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.hist.labels(method, route, str(status)).observe(seconds)


class ClusterCollector:
    def __init__(self, sessions: sessionmaker[Session], round_ms, admin: Principal, window_s: float = 60.0):
        self.sessions, self.round_ms, self.admin, self.window_s = sessions, round_ms, admin, window_s

    def collect(self):
        now = time.time()
        with self.sessions() as s:
            yield from self._jobs(s, now)
            yield from self._tenants(s)
            yield from self._gpus(s, now)
            yield from self._burst(s)
        g = GaugeMetricFamily("deeppod_scheduler_round_milliseconds", "time the last scheduling round took")
        g.add_metric([], float(self.round_ms()))
        yield g

    def _jobs(self, s: Session, now: float):
        by = Counter()
        queue, wait = Counter(), {}
        for state, tenant, submitted in s.execute(select(Job.state, Tenant.name, Job.submitted_at)
                                                  .join(Tenant, Job.tenant_id == Tenant.id)):
            by[(str(state), tenant)] += 1
            if state == JobState.QUEUED:
                queue[tenant] += 1
                wait[tenant] = max(wait.get(tenant, 0.0), now - submitted.timestamp())
        jobs = GaugeMetricFamily("deeppod_jobs", "jobs by state and tenant", labels=["state", "tenant"])
        for (state, tenant), n in sorted(by.items()):
            jobs.add_metric([state, tenant], n)
        yield jobs
        q = GaugeMetricFamily("deeppod_queue_length", "queued jobs by tenant", labels=["tenant"])
        w = GaugeMetricFamily("deeppod_queue_wait_seconds_max", "longest wait of a queued job", labels=["tenant"])
        for tenant in sorted(queue):
            q.add_metric([tenant], queue[tenant])
            w.add_metric([tenant], wait[tenant])
        yield q
        yield w
        active = GaugeMetricFamily("deeppod_active_jobs", "queued and running jobs")
        active.add_metric([], sum(n for (state, _), n in by.items() if state in {str(x) for x in ACTIVE_STATES}))
        yield active

    def _tenants(self, s: Session):
        fams = {k: GaugeMetricFamily(f"deeppod_tenant_gpus_{k}", f"GPUs {k} per tenant", labels=["tenant"])
                for k in ("guaranteed", "allocated", "borrowed", "lent", "waiting")}
        for t in plan_status(s, self.admin):
            for k, v in (("guaranteed", t.guaranteed), ("allocated", t.in_use), ("borrowed", t.borrowed),
                         ("lent", t.lent), ("waiting", t.waiting)):
                fams[k].add_metric([t.name], v)
        yield from fams.values()

    def _burst(self, s: Session):
        cost = CounterMetricFamily("deeppod_burst_cost", "what burst nodes cost, per tenant and burst type "
                                   "(in the plan's currency)", labels=["tenant", "node_type"])
        secs = CounterMetricFamily("deeppod_burst_node_seconds", "burst node time charged, per tenant and burst "
                                   "type", labels=["tenant", "node_type"])
        for tenant, kind, c, t in s.execute(select(BurstCharge.tenant, BurstCharge.node_type,
                                                   func.sum(BurstCharge.cost),
                                                   func.sum(BurstCharge.seconds))
                                            .group_by(BurstCharge.tenant, BurstCharge.node_type)):
            cost.add_metric([tenant, kind], float(c))
            secs.add_metric([tenant, kind], float(t))
        yield cost
        yield secs
        nodes = GaugeMetricFamily("deeppod_burst_nodes", "burst nodes up, per burst type", labels=["node_type"])
        for kind, n in s.execute(select(Node.burst, func.count()).where(Node.burst.is_not(None), Node.up.is_(True))
                                 .group_by(Node.burst)):
            nodes.add_metric([kind], n)
        yield nodes

    def _gpus(self, s: Session, now: float):
        names = dict(s.execute(select(Tenant.id, Tenant.name)).all())
        rows = service.latest(s, self.admin, self.window_s, now)
        fams = {f: GaugeMetricFamily(name, doc, labels=["node", "gpu", "job", "tenant"]) for f, name, doc in GPU_GAUGES}
        for r in rows:
            labels = [r["node"], str(r["gpu"]), str(r["job_id"] or ""), names.get(r["tenant_id"], "")]
            for f, fam in fams.items():
                fam.add_metric(labels, float(r[f]))
        yield from fams.values()
        count = GaugeMetricFamily("deeppod_gpu_samples", "GPU samples stored per node", labels=["node"])
        for node, n in s.execute(select(GpuSample.node, func.count()).group_by(GpuSample.node)):
            count.add_metric([node], n)
        yield count


def render(sessions: sessionmaker[Session], round_ms, admin: Principal, latency_registry: CollectorRegistry) -> bytes:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(sessions, round_ms, admin))
    return generate_latest(registry) + generate_latest(latency_registry)

from datetime import datetime

from pydantic import BaseModel, Field

from deeppod.api.schemas.base import Strict, from_dataclass
from deeppod.plans.service import TenantStatus


class PlanIn(Strict):
    tenants: list[dict] = Field(description="tenants: name, guaranteed, max, lend_limit, weight, pids_per_worker, "
                                            "storage_gb, package_indexes, burst_budget, memory_gb_per_worker, "
                                            "cpus_per_worker, gpu_memory_gb, children")
    reclaim_idle_first: bool | None = Field(None, description="jobs idle on their GPUs give them back first")
    surplus: str | None = Field(None, description="who gets GPUs beyond the guarantees: 'service' (default: the "
                                                  "waiting job with the least attained service) or 'share' (by weight)")
    burst: list[dict] | None = Field(None, description="burst node types Ray's autoscaler adds for some tenants: "
                                                       "name, gpus, max_nodes, cost_per_hour, tenants, idle_minutes, "
                                                       "wait_minutes, start_minutes, cpus, memory_gb, gpu_memory_gb")


TenantStatusOut = from_dataclass(TenantStatus, "TenantStatusOut", BaseModel)  # fields: plans/service.TenantStatus


class PlanOut(BaseModel):
    plan: dict
    applied_at: datetime | None
    applied_by: str | None
    tenants: list[TenantStatusOut]
    warnings: list[str] = Field(default_factory=list, description="when applied: what holds but may surprise "
                                                                   "(burst types on a server without an autoscaler)")

from pydantic import BaseModel, Field

from deeppod.api.schemas.base import Strict


class MetricPoint(Strict):
    step: int = Field(ge=0)
    at: float | None = None
    metrics: dict[str, float | str] | None = None
    histograms: dict[str, dict] | None = None
    trial: int | None = Field(None, ge=0)  # the search trial it belongs to (a process that runs several)


class MetricsIn(Strict):
    points: list[MetricPoint] = Field(max_length=5000)


class MetricsAccepted(BaseModel):
    stored: int
    pruning: list[int] = Field(default_factory=list, description="trials of this job's process a pruner stopped")
    pausing: list[int] = Field(default_factory=list, description="trials of this job's process paused at a rung "
                                                                 "(asha-promote): it keeps their state")


class MetricSeries(BaseModel):
    points: int
    last: list
    series: list[list]


class MetricsOut(BaseModel):
    job_id: int
    metrics: dict[str, MetricSeries]
    trial: int | None = Field(None, description="the search trial shown, for a process that ran several (--reuse)")


class HistogramOut(BaseModel):
    name: str
    step: int
    min: float
    max: float
    counts: list[int]

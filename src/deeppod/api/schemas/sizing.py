from pydantic import Field

from deeppod.api.schemas.base import Out, Strict, from_dataclass
from deeppod.sizing.model import Recommendation


class SizingIn(Strict):
    """A workload to size (docs/scheduler.md, "Sizing"): the fields of ``deeppod size``."""

    images: int = Field(gt=0, le=10**11, description="images in the training dataset")
    epochs: float = Field(ge=0.001, le=10_000, description="epochs a run trains")
    hours: float = Field(ge=0.001, le=10_000, description="the time one run should take")
    images_per_gpu: float = Field(ge=0.001, le=10**7, description="training images/s one GPU sustains")
    image_kb: float = Field(default=110.0, ge=0.001, le=10**6, description="mean stored image in KB")
    users: int = Field(default=1, gt=0, le=100_000, description="people submitting runs")
    runs_per_user_day: float = Field(default=1.0, ge=0.001, le=10_000, description="runs each submits a day")
    wait_minutes: float = Field(default=30.0, ge=0, le=100_000,
                                description="the 95th-percentile wait for GPUs to stay under")
    job_gpus: int | None = Field(default=None, gt=0, le=100_000, description="GPUs a run uses (default: what "
                                                                              "meets the hours)")
    scaling: float = Field(default=0.9, ge=0.01, le=1, description="data-parallel efficiency past one GPU")
    inference_rps: float = Field(default=0.0, ge=0, le=10**9, description="predictions a second to serve")
    rps_per_gpu: float = Field(default=0.0, ge=0, le=10**9, description="predictions a second one GPU serves")
    gpus_per_node: int = Field(default=8, gt=0, le=1024)
    versions: int = Field(default=3, gt=0, le=10_000, description="dataset versions kept")
    simulate: bool = Field(default=True, description="replay the runs in the scheduler's simulator for the wait")


SizingOut = from_dataclass(Recommendation, "SizingOut", Out)  # fields: sizing/model.Recommendation

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class RegisterIn(Strict):
    job_id: int | None = Field(default=None, description="the job whose JOB_DIR/model to register")
    path: str | None = Field(default=None, max_length=4096,
                             description="an artifact folder on the server (model.pt2 + signature.json)")
    description: str | None = Field(default=None, max_length=4000)
    aliases: list[str] = Field(default_factory=list, description="aliases to point at the new version")


class AliasIn(Strict):
    version: str | None = Field(description="a version number or another alias; null removes the alias")


class CompareIn(Strict):
    a: str = Field(description="a version number or alias")
    b: str = Field(description="a version number or alias")
    data: str = Field(description="held-out data: a dataset NAME@VERSION")


class PromoteIn(Strict):
    version: str
    force: bool = False


class EvaluationOut(Out):
    version: int
    job_id: int
    dataset: str
    samples: int
    accuracy: float
    per_class: dict
    created_at: datetime


class VersionOut(Out):
    ref: str
    version: int
    aliases: list[str]
    signature: dict
    metrics: dict
    lineage: dict
    bytes: int
    sha256: str
    path: str = ""
    created_at: datetime


class ModelOut(Out):
    name: str
    owner: str  # the tenant, as for datasets
    created_by: str  # the user who registered its first version
    description: str
    aliases: dict[str, int]
    versions: list[VersionOut]
    evaluations: list[EvaluationOut] = []
    created_at: datetime


class CompareOut(Out):
    job_id: int
    a: int
    b: int
    data: str
    state: str
    evaluations: list[EvaluationOut]


class PromoteOut(Out):
    model: str
    champion: int
    reason: str


def version_out(model, v, root=None) -> VersionOut:
    return VersionOut(path=str(root / v.key) if root is not None else "", ref=f"{model.name}@{v.version}",
                      version=v.version,
                      aliases=sorted(a for a, n in model.aliases.items() if n == v.version), signature=v.signature,
                      metrics=v.metrics, lineage=v.lineage, bytes=v.bytes, sha256=v.sha256, created_at=v.created_at)


def evaluation_out(e, number: int) -> EvaluationOut:
    return EvaluationOut(version=number, job_id=e.job_id, dataset=e.dataset, samples=e.samples, accuracy=e.accuracy,
                         per_class=e.per_class, created_at=e.created_at)


def model_out(model, owners: tuple[str, str], versions, evaluations=()) -> ModelOut:
    numbers = {v.id: v.version for v in versions}
    return ModelOut(name=model.name, owner=owners[0], created_by=owners[1], description=model.description,
                    aliases=model.aliases,
                    versions=[version_out(model, v) for v in versions],
                    evaluations=[evaluation_out(e, numbers.get(e.version_id, 0)) for e in evaluations],
                    created_at=model.created_at)

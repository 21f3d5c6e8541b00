from __future__ import annotations

from datetime import datetime

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class VersionOut(Out):
    ref: str
    version: int
    tier: str
    samples: int
    bytes: int
    classes: list[str]
    stats: dict
    lineage: dict
    quarantined: list[dict]
    labels_without_file: list[str] = []  # labels.csv/jsonl rows whose file is not in the source
    created_at: datetime
    last_used_at: datetime


class DatasetOut(Out):
    name: str
    owner: str
    description: str
    shared: bool
    tags: dict[str, str]
    meta: dict
    policy: dict
    versions: list[VersionOut]
    created_at: datetime


class DatasetPatch(Strict):
    description: str | None = Field(default=None, max_length=4000)
    shared: bool | None = None
    tags: dict[str, str] | None = Field(default=None, description="tags to add or change")
    untag: list[str] | None = Field(default=None, description="tag keys to remove")
    meta: dict | None = Field(default=None, description="free metadata to merge")


class PolicyIn(Strict):
    policy: dict = Field(description="resize (max:N|short:N), format (keep|jpeg|png|webp), quality, "
                                     "mode (keep|RGB|L), tile, val, split_seed")
    replace: bool = Field(default=False, description="replace the whole policy instead of merging")


class StagedOut(Out):
    ref: str
    tier: str
    path: str


class TokenCountsOut(Out):
    """A text version's lengths in one language model's tokens (datasets/tokens.py)."""
    dataset: str
    model: str
    examples: int
    cut_at: int | None = Field(description="counted the first this many examples of each split only; null: all")
    tokens: int
    per_split: dict[str, dict[str, int]]
    context_length: int
    over_context: int = Field(description="examples longer than the model's context")
    chat_template: bool = Field(description="chat examples were rendered through the model's chat template")
    per_example: dict[str, float]
    histogram: dict[str, int]


def version_out(name: str, v) -> VersionOut:
    return VersionOut(ref=f"{name}@{v.version}", version=v.version, tier=v.tier, samples=v.samples, bytes=v.bytes,
                      classes=v.classes, stats=v.stats, lineage=v.lineage,
                      quarantined=(v.report or {}).get("quarantined", []), created_at=v.created_at,
                      labels_without_file=(v.report or {}).get("labels_without_file", []),
                      last_used_at=v.last_used_at)


def dataset_out(ds, owner: str, versions) -> DatasetOut:
    return DatasetOut(name=ds.name, owner=owner, description=ds.description, shared=ds.shared, tags=ds.tags or {},
                      meta=ds.meta or {}, policy=ds.policy or {}, versions=[version_out(ds.name, v) for v in versions],
                      created_at=ds.created_at)

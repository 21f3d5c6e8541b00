import dataclasses
import typing

from pydantic import BaseModel, ConfigDict, Field, create_model


class Strict(BaseModel):
    """Request bodies: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def from_dataclass(spec: type, name: str, base: type[BaseModel] = Strict, exclude: tuple[str, ...] = ()
                   ) -> type[BaseModel]:
    """A request or response body built from the dataclass the service declares it with
    (``job_spec.JobSpec``, ``envs.service.EnvInfo``...): each field's type, default, and the
    bounds and description in its metadata; ``exclude``: fields the API never shows."""
    hints = typing.get_type_hints(spec)
    defs = {}
    for f in dataclasses.fields(spec):
        if f.name in exclude:
            continue
        if f.default_factory is not dataclasses.MISSING:
            info = Field(default_factory=f.default_factory, **f.metadata)
        elif f.default is not dataclasses.MISSING:
            info = Field(default=f.default, **f.metadata)
        else:
            info = Field(**f.metadata)
        defs[f.name] = (hints[f.name], info)
    return create_model(name, __base__=base, __module__=base.__module__, **defs)

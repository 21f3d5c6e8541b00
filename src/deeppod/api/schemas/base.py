import dataclasses
import typing

from pydantic import BaseModel, ConfigDict, Field, create_model


class Strict(BaseModel):
    """Request bodies: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def from_dataclass(spec: type, name: str, base: type[BaseModel] = Strict) -> type[BaseModel]:
    """A request body built from a dataclass declared for client and server (``job_spec.JobSpec``):
    each field's type, default, and the bounds and description in its metadata."""
    hints = typing.get_type_hints(spec)
    defs = {}
    for f in dataclasses.fields(spec):
        if f.default_factory is not dataclasses.MISSING:
            info = Field(default_factory=f.default_factory, **f.metadata)
        elif f.default is not dataclasses.MISSING:
            info = Field(default=f.default, **f.metadata)
        else:
            info = Field(**f.metadata)
        defs[f.name] = (hints[f.name], info)
    return create_model(name, __base__=base, __module__=base.__module__, **defs)

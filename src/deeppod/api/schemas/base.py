from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Request bodies: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)

"""Form values to API bodies: the console checks a form with the API's own pydantic schema,
so a field the API refuses is refused here with the same rule, next to the field."""

from __future__ import annotations

import shlex
from typing import Annotated

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError

from deeppod.errors import DeepPodError, FormErrors, InvalidRequest
from deeppod.units import time_limit_seconds

FORM_ERROR = "_form"  # an error about the whole form, shown above it


def blank_none(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


def number(errors: dict, field: str, value: str | None, kind=int):
    """A form number, or None when blank; a note in ``errors`` when it is not one."""
    value = blank_none(value)
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        errors[field] = f"{value!r} is not a {'whole ' if kind is int else ''}number"
        return None


def time_limit(errors: dict, field: str, value: str | None) -> float | None:
    """A time limit as 'deeppod submit --time' reads it, or None when blank."""
    value = blank_none(value)
    if value is None:
        return None
    try:
        return time_limit_seconds(value, "")
    except InvalidRequest as exc:
        errors[field] = exc.message.lstrip()
        return None


def command(errors: dict, field: str, value: str | None) -> list[str]:
    try:
        argv = shlex.split(value or "")
    except ValueError as exc:
        errors[field] = f"the command does not parse ({exc}): check its quotes"
        return []
    if not argv:
        errors[field] = "give the command every worker runs, e.g. python train.py --epochs 3"
    return argv


def workers(errors: dict, field: str, value: str | None) -> tuple[int | None, int | None]:
    """'N' or 'MIN:MAX' (elastic)."""
    text = (value or "1").strip()
    low, _, high = text.partition(":")
    try:
        lo = int(low)
        hi = int(high) if high else None
    except ValueError:
        errors[field] = f"{text!r}: give a number of workers, or MIN:MAX for an elastic job"
        return None, None
    if hi is not None and hi < lo:
        errors[field] = f"{text!r}: the most workers ({hi}) is fewer than the least ({lo})"
    return lo, hi


def env_lines(errors: dict, field: str, value: str | None) -> dict[str, str]:
    out = {}
    for n, line in enumerate((value or "").splitlines(), 1):
        if not line.strip():
            continue
        key, eq, val = line.partition("=")
        if not eq or not key.strip():
            errors[field] = f"line {n} ({line.strip()[:40]!r}) is not NAME=VALUE"
            continue
        out[key.strip()] = val
    return out


def names(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").replace("\n", ",").split(",") if v.strip()]


def validated(schema: type[BaseModel], body: dict, errors: dict, fields: dict[str, str]) -> BaseModel | None:
    """``body`` checked by ``schema``; its complaints land in ``errors`` under the form's field
    names (``fields``: schema field -> form field)."""
    try:
        model = schema.model_validate(body)
    except ValidationError as exc:
        for e in exc.errors():
            key = str(e["loc"][0]) if e["loc"] else FORM_ERROR
            errors.setdefault(fields.get(key, FORM_ERROR), e["msg"].removeprefix("Value error, "))
        model = None
    if errors:
        raise FormErrors(errors)
    return model


def checked_call(schema: type[BaseModel], body: dict, errors: dict, fields: dict[str, str], call,
                 service_fields: dict[str, str]):
    """``body`` checked by ``schema``, then ``call(checked)``; any refusal, the schema's or
    the service's, lands by the field it is about (FormErrors)."""
    checked = validated(schema, body, errors, fields)
    try:
        return call(checked)
    except DeepPodError as exc:
        raise service_error(exc, service_fields) from None


async def values(request: Request) -> dict[str, str]:
    """A posted form's text fields."""
    return {k: v for k, v in (await request.form()).items() if isinstance(v, str)}


# Read before the handler, on the event loop: a handler that takes it can be a plain def,
# which FastAPI runs in the thread pool, so its database work (on SQLite, waiting for the
# one writer's turn) never holds up the event loop and every other request with it.
FormDep = Annotated[dict[str, str], Depends(values)]


def service_error(exc: DeepPodError, fields: dict[str, str]) -> FormErrors:
    """A service's refusal, put next to the field it names (else above the form)."""
    text = exc.message.lower()
    for word, field in fields.items():
        if word in text:
            return FormErrors({field: exc.message}, exc.status)
    return FormErrors({FORM_ERROR: exc.message}, exc.status)

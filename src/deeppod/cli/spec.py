"""``--spec FILE.yaml``: a command's options written down once, so a run can be versioned,
reviewed and made again. Every option is a field (``gpus-per-worker: 1`` or
``gpus_per_worker: 1``), the command after ``--`` is ``command`` (a list or one string);
options given beside ``--spec`` win over the file's. Relative paths in the file are read from
the file's folder, not from where the command runs."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from deeppod.errors import InvalidRequest

# Fields that name a file or folder: relative to the spec file's folder.
PATHS = {"requirements", "workdir", "code", "space", "data"}
# Fields a spec may also give inline (a downloaded job spec does): requirements as a list of
# lines, a search space as a mapping. The command reads them with inline().
INLINE = {"requirements": list, "space": dict}
NOT_FIELDS = {"spec", "url", "token"}  # where and as whom it runs is not part of what runs


def _load(ctx: typer.Context, value: Path | None) -> Path | None:
    if value is None or ctx.resilient_parsing:
        return value
    fields = read(value)
    params = {p.name: p for p in ctx.command.params if p.name not in NOT_FIELDS}
    defaults: dict[str, Any] = {}
    for key, raw in fields.items():
        name = str(key).replace("-", "_")
        if name not in params:
            import difflib  # only a refusal pays for it

            known = sorted(n.replace("_", "-") for n in params)
            near = difflib.get_close_matches(str(key).replace("_", "-"), known, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise InvalidRequest(f"{value}: '{key}' is not a field of this command{hint}; its fields are "
                                 f"{', '.join(known)}")
        if name in INLINE and isinstance(raw, INLINE[name]):
            ctx.meta[f"deeppod.spec.{name}"] = raw
            continue
        defaults[name] = _value(value, name, raw, params[name])
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def read(path: Path) -> dict:
    fields = read_yaml(path, f"--spec {path}")
    if not isinstance(fields, dict):
        raise InvalidRequest(f"--spec {path} must hold a mapping of fields, e.g. 'workers: 2' and "
                             "'command: python train.py'")
    return fields


def read_yaml(path: Path, what: str):
    """A YAML file's content, or InvalidRequest naming ``what`` and what is wrong with it."""
    import yaml  # here: only a command that reads a file pays for it

    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidRequest(f"{what}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{what} is not valid YAML: {exc}") from None


def _value(path: Path, name: str, raw: Any, param) -> Any:
    """A field's value as the option would have been given on the command line."""
    many = param.nargs == -1 or getattr(param, "multiple", False)
    if name == "command" and isinstance(raw, str):
        raw = shlex.split(raw)
    if name == "env" and isinstance(raw, dict):
        raw = [f"{k}={'' if v is None else v}" for k, v in raw.items()]
    if many:
        items = raw if isinstance(raw, list) else [raw]
        if not all(_scalar(x) for x in items):
            raise InvalidRequest(f"{path}: '{name}' must be a list of values")
        return [_text(x) for x in items]
    if not _scalar(raw):
        raise InvalidRequest(f"{path}: '{name}' must be one value (a string, a number or true/false), "
                             f"not {type(raw).__name__}")
    if isinstance(raw, bool) or raw is None:
        return raw
    if name in PATHS:
        p = Path(str(raw)).expanduser()
        return str(p if p.is_absolute() else path.parent / p)
    return _text(raw)


def _scalar(x: Any) -> bool:
    return x is None or isinstance(x, (str, int, float, bool))


def _text(x: Any) -> str:
    return str(x).lower() if isinstance(x, bool) else str(x)


def inline(ctx: typer.Context, name: str) -> Any:
    """A field the spec gave inline (see INLINE), or None."""
    return ctx.meta.get(f"deeppod.spec.{name}")


def inline_requirements(ctx: typer.Context) -> str | None:
    lines = inline(ctx, "requirements")
    if lines is None:
        return None
    from deeppod.envs.spec import parse

    text = "\n".join(str(x) for x in lines) + "\n"
    parse(text, None)  # a bad line said before anything is sent, as --requirements FILE's
    return text


SpecOpt = Annotated[Path | None, typer.Option(
    "--spec", is_eager=True, callback=_load, show_default=False,
    help="a YAML file of this command's options (every option a field, the command as 'command'); options given "
         "beside it win. 'deeppod job spec ID' writes one from a job")]

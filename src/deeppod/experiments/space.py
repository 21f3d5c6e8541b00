"""Search spaces: parsed from the user's YAML, checked against the trial command, rendered
into each trial's command. Pure: no Optuna, no database.

    lr:           {type: float, low: 0.0001, high: 0.1, log: true}
    batch_size:   {type: int, low: 16, high: 128, step: 16}
    optimizer:    {type: categorical, choices: [sgd, adam]}
    warmup:       {type: int, low: 0, high: 5, env_only: true}   # read from DEEPPOD_PARAM_WARMUP

A parameter reaches the command as ``{name}`` (``{{`` and ``}}`` are literal braces) and
every trial's environment as ``DEEPPOD_PARAM_<NAME>``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from deeppod.errors import InvalidRequest

TYPES = ("float", "int", "categorical")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_KEYS = {"float": {"type", "low", "high", "log", "step", "env_only"},
         "int": {"type", "low", "high", "log", "step", "env_only"},
         "categorical": {"type", "choices", "env_only"}}
MAX_PARAMS = 32
MAX_GRID = 10_000


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    env_only: bool = False  # the script reads DEEPPOD_PARAM_<NAME>; the command need not name it

    def to_dict(self) -> dict:
        d: dict = {"type": self.type}
        if self.type == "categorical":
            d["choices"] = list(self.choices)
        else:
            d.update(low=self.low, high=self.high)
            if self.log:
                d["log"] = True
            if self.step is not None:
                d["step"] = self.step
        if self.env_only:
            d["env_only"] = True
        return d

    def grid(self) -> list | None:
        """Every value, for the grid sampler (None: continuous, it has no grid)."""
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int":
            step = int(self.step or 1)
            return list(range(int(self.low), int(self.high) + 1, step))
        if self.step is None:
            return None
        n = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return [round(self.low + i * self.step, 12) for i in range(n)]


def _number(name: str, key: str, value, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"parameter {name}: '{key}' must be a number (got {value!r})")
    if integer and value != int(value):
        raise InvalidRequest(f"parameter {name}: '{key}' must be a whole number for an int parameter (got {value!r})")
    return int(value) if integer else float(value)


def parse_param(name: str, raw) -> Param:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest(f"parameter name {name!r} is not valid: use lowercase letters, digits and '_' "
                             "(at most 32, starting with a letter), e.g. lr or batch_size")
    if not isinstance(raw, dict):
        raise InvalidRequest(f"parameter {name}: give a mapping such as {{type: float, low: 0.001, high: 0.1}} "
                             f"(got {raw!r})")
    kind = raw.get("type")
    if kind not in TYPES:
        raise InvalidRequest(f"parameter {name}: unknown type {kind!r}; use one of {', '.join(TYPES)} "
                             "(log scale: type: float with log: true)")
    unknown = set(raw) - _KEYS[kind]
    if unknown:
        raise InvalidRequest(f"parameter {name}: unknown key(s) {', '.join(sorted(map(str, unknown)))} for a {kind} "
                             f"parameter; use {', '.join(sorted(_KEYS[kind]))}")
    env_only = raw.get("env_only", False)
    if not isinstance(env_only, bool):
        raise InvalidRequest(f"parameter {name}: env_only must be true or false")
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise InvalidRequest(f"parameter {name}: 'choices' must be a non-empty list, e.g. [sgd, adam]")
        if any(not isinstance(c, (str, int, float, bool)) or c is None for c in choices):
            raise InvalidRequest(f"parameter {name}: choices must be strings, numbers or booleans")
        if len(set(map(repr, choices))) != len(choices):
            raise InvalidRequest(f"parameter {name}: choices repeat a value")
        return Param(name, kind, choices=tuple(choices), env_only=env_only)
    integer = kind == "int"
    for key in ("low", "high"):
        if key not in raw:
            raise InvalidRequest(f"parameter {name}: '{key}' is required for a {kind} parameter")
    low, high = _number(name, "low", raw["low"], integer), _number(name, "high", raw["high"], integer)
    if not low < high:
        raise InvalidRequest(f"parameter {name}: the range [{low}, {high}] is empty; 'low' must be below 'high' "
                             "(a fixed value belongs in the command, not the space)")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise InvalidRequest(f"parameter {name}: log must be true or false")
    if log and low <= 0:
        raise InvalidRequest(f"parameter {name}: a log scale needs low > 0 (got {low})")
    step = raw.get("step")
    if step is not None:
        step = _number(name, "step", step, integer)
        if step <= 0 or step > high - low:
            raise InvalidRequest(f"parameter {name}: step must be above 0 and at most high - low ({high - low})")
        if log:
            raise InvalidRequest(f"parameter {name}: give either log or step, not both")
    return Param(name, kind, low, high, log, step, env_only=env_only)


def parse_space(raw) -> dict[str, Param]:
    """The search space from a YAML/JSON mapping {name: {type, ...}}. Errors say what to fix."""
    if not isinstance(raw, dict) or not raw:
        raise InvalidRequest("the search space must be a mapping of parameters, e.g. "
                             "{lr: {type: float, low: 0.0001, high: 0.1, log: true}}")
    if len(raw) > MAX_PARAMS:
        raise InvalidRequest(f"the search space has {len(raw)} parameters; at most {MAX_PARAMS}")
    return {name: parse_param(name, spec) for name, spec in raw.items()}


def placeholders(command: list[str]) -> list[str]:
    """The ``{name}`` placeholders of a command, in order ({{ and }} are literal braces)."""
    out = []
    for arg in command:
        for m in _PLACEHOLDER.finditer(arg):
            if m.group(1) is not None:
                out.append(m.group(1))
    return out


def check_command(command: list[str], space: dict[str, Param], reuse: bool = False) -> None:
    """Every placeholder names a parameter, and every parameter is used (or marked env_only).
    A search that reuses processes takes no placeholders: its trials' values come from
    ``runtime.trials()``, and the command line would hold only the first trial's."""
    used = placeholders(command)
    if reuse:
        if used:
            name = sorted(used)[0]
            raise InvalidRequest(f"with --reuse one process runs trial after trial, so {{{name}}} in the command "
                                 f"would be the first trial's value for every trial: remove the placeholders and "
                                 f"read trial.params['{name}'] in 'for trial in runtime.trials():'")
        return
    for name in used:
        if name not in space:
            known = ", ".join(sorted(space)) or "none"
            raise InvalidRequest(f"the command uses {{{name}}} but the space has no parameter {name!r} (it has: "
                                 f"{known}); "
                                 "add it to the space, or write a literal brace as {{ or }}")
    for p in space.values():
        if p.name not in used and not p.env_only:
            raise InvalidRequest(f"parameter {p.name} is never used by the command: add {{{p.name}}} to it "
                                 f"(e.g. --{p.name.replace('_', '-')} {{{p.name}}}), remove it from the space, or "
                                 f"mark it env_only: true if the script reads DEEPPOD_PARAM_{p.name.upper()}")


def format_value(value) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render(command: list[str], params: dict) -> list[str]:
    """The command with each placeholder replaced by the trial's value."""
    def one(m: re.Match) -> str:
        if m.group(1) is None:
            return m.group(0)[0]
        return format_value(params[m.group(1)])
    return [_PLACEHOLDER.sub(one, arg) for arg in command]


def grid_size(space: dict[str, Param]) -> int:
    size = 1
    for p in space.values():
        values = p.grid()
        if values is None:
            raise InvalidRequest(f"the grid sampler needs a finite set of values: give parameter {p.name} a 'step' "
                                 "or make it categorical")
        size *= len(values)
        if size > MAX_GRID:
            raise InvalidRequest(f"the grid has more than {MAX_GRID} points; use a coarser step or another sampler")
    return size

"""Search spaces: parsing, the checks against the command, rendering. Pure."""

import pytest

from deeppod.errors import InvalidRequest
from deeppod.experiments.space import check_command, grid_size, parse_space, placeholders, render

SPACE = {"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
         "batch_size": {"type": "int", "low": 16, "high": 64, "step": 16},
         "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]}}
CMD = ["python", "train.py", "--lr", "{lr}", "--batch-size={batch_size}", "--opt", "{optimizer}"]


def test_a_valid_space_parses_and_renders():
    space = parse_space(SPACE)
    assert space["lr"].log and space["batch_size"].step == 16 and space["optimizer"].choices == ("sgd", "adam")
    check_command(CMD, space)
    assert render(CMD, {"lr": 0.01, "batch_size": 32, "optimizer": "adam"}) == [
        "python", "train.py", "--lr", "0.01", "--batch-size=32", "--opt", "adam"]


def test_literal_braces_stay():
    assert placeholders(["python", "-c", "print({{1: 2}}, {lr})"]) == ["lr"]
    assert render(["x={{a}}", "{lr}"], {"lr": 1.5}) == ["x={a}", "1.5"]


@pytest.mark.parametrize("raw, words", [
    ({"lr": {"type": "floatt", "low": 0, "high": 1}}, "unknown type 'floatt'"),
    ({"lr": {"type": "float", "low": 0.1, "high": 0.1}}, "is empty"),
    ({"lr": {"type": "float", "low": 1, "high": 0.1}}, "is empty"),
    ({"n": {"type": "int", "low": 1.5, "high": 4}}, "whole number"),
    ({"lr": {"type": "float", "low": 0, "high": 1, "log": True}}, "log scale needs low > 0"),
    ({"opt": {"type": "categorical", "choices": []}}, "non-empty list"),
    ({"lr": {"type": "float", "low": 0, "high": 1, "scale": "log"}}, "unknown key(s) scale"),
    ({"Learning Rate": {"type": "float", "low": 0, "high": 1}}, "is not valid"),
    ({"lr": 0.1}, "give a mapping"),
    ({}, "must be a mapping of parameters"),
])
def test_bad_spaces_are_refused_with_what_to_fix(raw, words):
    with pytest.raises(InvalidRequest) as e:
        parse_space(raw)
    assert words in str(e.value)


def test_a_parameter_the_command_never_uses_is_refused():
    space = parse_space(SPACE)
    with pytest.raises(InvalidRequest) as e:
        check_command(["python", "train.py", "--lr", "{lr}", "--opt", "{optimizer}"], space)
    assert "batch_size is never used" in str(e.value) and "{batch_size}" in str(e.value)
    env_only = parse_space({**SPACE, "batch_size": {**SPACE["batch_size"], "env_only": True}})
    check_command(["python", "train.py", "--lr", "{lr}", "--opt", "{optimizer}"], env_only)


def test_a_placeholder_with_no_parameter_is_refused():
    with pytest.raises(InvalidRequest) as e:
        check_command([*CMD, "--wd", "{weight_decay}"], parse_space(SPACE))
    assert "{weight_decay}" in str(e.value) and "no parameter 'weight_decay'" in str(e.value)


def test_grid_needs_finite_values():
    assert grid_size(parse_space({"n": {"type": "int", "low": 1, "high": 4},
                                  "o": {"type": "categorical", "choices": [1, 2]}})) == 8
    with pytest.raises(InvalidRequest, match="step"):
        grid_size(parse_space(SPACE))

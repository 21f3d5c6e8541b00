"""A job is declared once (deeppod/job_spec.py): the API's body is made from it, and the CLI's
submit options and the console's form are held to it here, so a field added there and
forgotten in one of them fails."""

import dataclasses

import pytest
import typer

from deeppod.api.schemas.jobs import JobCreate
from deeppod.cli.main import app
from deeppod.errors import InvalidRequest
from deeppod.job_spec import FIELDS, REQUIRED, JobSpec, build, cli_options
from deeppod.ui.routes.jobs import FORM_LEAVES_OUT, SUBMIT_FIELDS


def test_the_apis_body_has_every_field_with_its_default_and_bounds():
    assert tuple(JobCreate.model_fields) == FIELDS and REQUIRED == ("command",)
    for f in dataclasses.fields(JobSpec):
        info = JobCreate.model_fields[f.name]
        assert (info.description or "") == f.metadata.get("description", ""), f.name
        if f.default is not dataclasses.MISSING:
            assert info.default == f.default, f.name
    schema = JobCreate.model_json_schema()["properties"]
    assert schema["workers"]["minimum"] == 1 and schema["workers"]["maximum"] == 4096
    assert schema["command"]["minItems"] == 1
    for bad in ({"code": "not-a-digest"}, {"workers": 0}, {"network": "wide"}, {"wrokers": 2}):
        with pytest.raises(ValueError):  # out of bounds, not a choice, or unknown (as in every request body)
            JobCreate(command=["x"], **bad)


def test_every_field_is_an_option_of_submit():
    submit = typer.main.get_command(app).commands["submit"]
    options = {o.lstrip("-") for p in submit.params for o in getattr(p, "opts", [])} | {"command"}
    missing = {name: cli_options(name) for name in FIELDS if not set(cli_options(name)) <= options}
    assert missing == {}, f"fields with no option on 'deeppod submit' (cli/jobs.py): {missing}"


def test_every_field_is_on_the_consoles_form_or_left_out_with_a_reason():
    on_form = set(SUBMIT_FIELDS)
    assert on_form | set(FORM_LEAVES_OUT) == set(FIELDS) and not on_form & set(FORM_LEAVES_OUT)
    assert all(reason for reason in FORM_LEAVES_OUT.values())


def test_an_unknown_option_is_refused_with_the_nearest_name():
    with pytest.raises(InvalidRequest, match="'wrokers' is not a job option \\(did you mean 'workers'\\?\\)"):
        build(command=["x"], wrokers=2)
    with pytest.raises(InvalidRequest, match="a job needs command"):
        build(workers=2)
    assert build(command=["x"], workers=2).body()["workers"] == 2

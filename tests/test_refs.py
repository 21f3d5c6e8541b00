import pytest

from deeppod.datasets.service import parse_ref as dataset_ref
from deeppod.errors import InvalidRequest
from deeppod.models.service import parse_ref as model_ref
from deeppod.refs import Ref, parse_ref


def test_one_grammar_for_datasets_and_models():
    assert parse_ref("digits", "NAME") == Ref(None, "digits", None)
    assert parse_ref("lab/digits@champion", "NAME") == Ref("lab", "digits", "champion")
    assert model_ref("digits@3") == Ref(None, "digits", "3")
    assert dataset_ref("lab/digits@2").version == 2 and dataset_ref("digits@latest").version is None


@pytest.mark.parametrize("bad", ["", "a@b@c", "A/x", "x@"])
def test_bad_references_say_how_to_write_them(bad):
    with pytest.raises(InvalidRequest, match="write NAME"):
        model_ref(bad)


def test_a_dataset_version_must_be_a_number():
    with pytest.raises(InvalidRequest, match="must be a number or 'latest'"):
        dataset_ref("digits@champion")

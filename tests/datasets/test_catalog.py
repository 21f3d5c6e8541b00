import pytest

from deeppod.datasets.catalog import matches, parse
from deeppod.errors import InvalidRequest

XRAY = {"name": "chest-xray", "owner": "teama", "description": "Pneumonia X-rays", "shared": False,
        "tags": {"xray": "", "site": "lyon"}, "classes": 14, "size": 1 << 30, "samples": 5000, "versions": 2}
DIGITS = {"name": "digits", "owner": "teamb", "description": "", "shared": True, "tags": {},
          "classes": 10, "size": 800_000, "samples": 1797, "versions": 1}


@pytest.mark.parametrize("query,hits", [
    ("tag:xray classes>10 size<2GB owner:teama", ["chest-xray"]),
    ("classes>=10", ["chest-xray", "digits"]),
    ("size<1MB", ["digits"]),
    ("tag:site=lyon", ["chest-xray"]), ("tag:site=paris", []),
    ("name:chest*", ["chest-xray"]), ("pneumonia", ["chest-xray"]), ("shared:true", ["digits"]),
    ("samples>2000 versions=2", ["chest-xray"]), ("", ["chest-xray", "digits"]),
])
def test_search_terms(query, hits):
    terms = parse(query)
    assert [e["name"] for e in (XRAY, DIGITS) if matches(e, terms)] == hits


@pytest.mark.parametrize("bad", ["colour:red", "size<2parsecs", "classes>many", "a<b", "shared:maybe"])
def test_bad_queries_say_how_to_write_them(bad):
    with pytest.raises(InvalidRequest):
        parse(bad)

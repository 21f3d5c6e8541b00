"""The OpenAPI document is part of the API's contract: it changes only on purpose. The committed
copy (docs/reference/openapi.json) is what clients and reviewers read; a change to a route or a
schema shows here as a diff. After a change meant to show, write it again:
DEEPPOD_TEST_WRITE_REFERENCE=1 ./scripts/test tests/api/test_openapi_document.py"""

import difflib
import json
import os
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "openapi.json"


def rendered(spec: dict) -> str:
    return json.dumps(spec, indent=1, sort_keys=True) + "\n"


def test_the_openapi_document_is_the_committed_one(api):
    now = rendered(api.http.get("/openapi.json").json())
    if os.environ.get("DEEPPOD_TEST_WRITE_REFERENCE"):
        REFERENCE.write_text(now)
    diff = "".join(difflib.unified_diff(REFERENCE.read_text().splitlines(True), now.splitlines(True),
                                        "docs/reference/openapi.json", "the API now", n=2))
    assert diff == "", f"the OpenAPI document changed:\n{diff[:6000]}"

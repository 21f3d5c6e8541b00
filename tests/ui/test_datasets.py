"""Console dataset pages: ingest an archive from the browser (streamed past the body limit),
the catalog and its search, a version's statistics, gallery (thumbnails made once) and
quarantined files, and nothing of another tenant's private dataset."""

import io
import re
import zipfile

import pytest

from deeppod.runtime.trainers.digits import write_digits
from tests.ui.conftest import Browser

JSON = {"Accept": "application/json"}


@pytest.fixture
def digits_zip(tmp_path) -> bytes:
    folder = write_digits(tmp_path / "digits")
    (folder / "0" / "broken.png").write_bytes(b"not an image")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(folder.parent))
    return buf.getvalue()


def _upload(b: Browser, name: str, body: bytes, query: str = "", csrf: bool = True):
    headers = {**JSON, **({"X-CSRF-Token": b.csrf} if csrf else {})}
    return b.http.post(f"/datasets/{name}/upload{query}", content=body, headers=headers)


def test_ingest_from_the_browser_then_browse_the_version(api, digits_zip):
    ana = api.user("ana", "vision")
    b = Browser(api, ana)
    assert len(digits_zip) > api.ctx.settings.max_body_bytes  # streamed: the per-ingest limit applies
    r = _upload(b, "digits", digits_zip, "?val=0.2&description=handwritten")
    assert r.status_code == 200, r.text
    assert r.json() == {"ref": "digits@1", "samples": 1797, "classes": 10, "quarantined": 1,
                        "url": "/datasets/vision/digits@1"}
    catalog = b.get("/datasets?q=handwritten").text
    assert 'data-dataset="digits"' in catalog and "1797" in catalog
    assert 'data-dataset="digits"' not in b.get("/datasets?q=xray").text

    page = b.get("/datasets/vision/digits@1").text
    assert page.count('class="thumb"') == 60 and "page 1 of 30" in page
    assert re.search(r"broken.png</td><td>not an image", page)
    assert "train 14" in page and "val 3" in page  # the split
    assert page.count('<div class="bar"') >= 10  # a bar per class
    three = b.get("/datasets/vision/digits@1?label=3&page=2").text
    assert three.count('class="thumb"') == 60 and "of class 3" in three
    index = int(re.search(r'data-index="(\d+)"', three).group(1))

    r = b.get(f"/datasets/vision/digits@1/thumbs/{index}")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg" and r.content[:2] == b"\xff\xd8"
    cached = list((api.ctx.settings.hot_root / ".thumbnails").rglob("*.jpg"))
    assert len(cached) == 1
    before = cached[0].stat().st_mtime_ns
    assert b.get(f"/datasets/vision/digits@1/thumbs/{index}").content == r.content
    assert cached[0].stat().st_mtime_ns == before  # made once


@pytest.mark.parametrize("name,body,query,says", [
    ("Bad Name", b"x", "", "is not valid"),
    ("x", b"", "", "the upload is empty"),
    ("x", b"garbage", "", "not a tar, tar.gz or zip"),
    ("x", b"garbage", "?val=abc", "is not a number"),
])
def test_a_bad_upload_says_what_to_fix_and_leaves_nothing(api, name, body, query, says):
    b = Browser(api, api.admin)
    r = _upload(b, name.replace(" ", "%20"), body, query)
    assert 400 <= r.status_code < 500 and says in r.json()["error"]["message"], r.text
    assert api.http.get("/v1/datasets", headers=api.as_(api.admin)).json() == []


def test_an_upload_needs_the_console_s_csrf_secret(api, digits_zip):
    b = Browser(api, api.admin)
    assert _upload(b, "digits", digits_zip, csrf=False).status_code == 403
    assert api.http.get("/v1/datasets", headers=api.as_(api.admin)).json() == []


def test_another_tenants_private_dataset_stays_private(api, digits_zip):
    ana, bob = api.user("ana", "vision"), api.user("bob", "audio")
    assert _upload(Browser(api, ana), "scans", digits_zip).status_code == 200
    b = Browser(api, bob)
    assert "scans" not in b.get("/datasets").text
    assert b.get("/datasets/vision/scans@1").status_code == 404
    assert b.get("/datasets/vision/scans@1/thumbs/0").status_code == 404


@pytest.mark.parametrize("path", ["/datasets/nosuch", "/datasets/digits@x", "/datasets/digits@9",
                                  "/datasets/digits@1?label=zebra", "/datasets/digits@1?page=0",
                                  "/datasets/digits@1/thumbs/99999", "/datasets/digits@1/thumbs/-1"])
def test_bad_dataset_addresses_get_a_page_that_says_what_to_fix(api, digits_zip, path):
    b = Browser(api, api.admin)
    assert _upload(b, "digits", digits_zip).status_code == 200
    r = b.get(path)
    assert 400 <= r.status_code < 500 and "text/html" in r.headers["content-type"], (path, r.status_code)


def test_the_search_hint_shows_only_syntax_the_search_takes(api):
    """Every example in the catalog's hint parses (shared:yes did not: 'takes true or false'),
    and the command it names is a real one."""
    from typer.main import get_command

    from deeppod.cli.main import app
    from deeppod.datasets.catalog import parse

    html = Browser(api, api.admin).get("/datasets").text
    hint = re.search(r'<p class="hint">Words match.*?</p>', html).group(0)
    codes = [c.replace("&gt;", ">").replace("&lt;", "<") for c in re.findall(r"<code>(.*?)</code>", hint)]
    command = [c for c in codes if c.startswith("deeppod ")]
    assert command == ["deeppod data search QUERY"]
    assert "search" in get_command(app).commands["data"].commands
    for example in codes:
        if not example.startswith("deeppod "):
            parse(example.replace("KEY=VALUE", "kind=xray").replace("TENANT", "a").replace(">N", ">2"))


def test_a_text_dataset_page_shows_its_examples_statistics_and_refused_lines(api):
    import json

    ana = api.user("ana", "vision")
    b = Browser(api, ana)
    rows = [{"messages": [{"role": "user", "content": f"say <b>{i}</b>"}, {"role": "assistant", "content": str(i)}]}
            for i in range(30)]
    body = "\n".join([*map(json.dumps, rows), '{"messages": "oops"}']).encode()
    r = _upload(b, "chats", body, "?val=0.2")
    assert r.status_code == 200, r.text
    assert r.json() == {"ref": "chats@1", "samples": 30, "classes": 0, "quarantined": 1,
                        "url": "/datasets/vision/chats@1"}
    page = b.get("/datasets/vision/chats@1").text
    assert "30 chat examples" in page and "train 24, val 6" in page and "page 1 of 2" in page
    assert page.count('class="example"') == 20 and re.search(r"say &lt;b&gt;\d+&lt;/b&gt;", page)  # escaped
    assert "Label these images" not in page and 'id="length-histogram"' in page
    assert re.search(r"upload.jsonl:31</td><td>&#39;messages&#39; is not a non-empty list", page)
    assert b.get("/datasets/vision/chats@1?page=2").text.count('class="example"') == 10


@pytest.mark.slow  # the count runs in a child process
def test_a_text_dataset_counted_in_a_registered_models_tokens(api, tmp_path):
    import json

    from tests.models.hf_folder import write_tiny_llama

    b = Browser(api, api.admin)
    rows = [{"prompt": f"what is {i} plus {i}?", "completion": str(2 * i)} for i in range(10)]
    assert _upload(b, "sums", "\n".join(map(json.dumps, rows)).encode()).status_code == 200
    page = b.get("/datasets/default/sums@1").text
    assert "Register a language model" in page and 'id="token-summary"' not in page
    folder = write_tiny_llama(tmp_path / "tiny")
    assert api.http.post("/v1/models/tiny/versions", json={"path": str(folder)},
                         headers=api.as_(api.admin)).status_code == 201
    page = b.get("/datasets/default/sums@1").text
    assert '<option value="tiny@1" >tiny@1</option>' in page
    page = b.get("/datasets/default/sums@1?tokenizer=tiny@1").text
    assert re.search(r'id="token-summary">\d+ tokens of tiny@1 in 10 examples', page)
    assert "All fit its 128-token context." in page and page.count("tokens</td>") == 5
    assert b.get("/datasets/default/sums@1?tokenizer=nosuch@1").status_code == 404

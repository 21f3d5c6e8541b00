"""Listing pages as S3 gives them: byte order, common prefixes under a delimiter, and pages
that continue exactly where the last one ended (every key once across the pages)."""

import base64
from datetime import UTC
from pathlib import Path

from deeppod.s3 import listing
from deeppod.s3.namespace import Entry


def entries(keys):
    return sorted((Entry(k, 1, 0.0, "e", Path("/dev/null")) for k in keys), key=lambda e: e.key.encode())


def all_pages(items, **q):
    q = {"list-type": "2", **q}
    seen, tokens = [], 0
    while True:
        p = listing.page(items, q)
        seen += [e.key for e in p.contents] + p.prefixes
        if not p.truncated:
            return seen, tokens
        q["continuation-token"] = base64.urlsafe_b64encode(p.next_marker.encode()).decode()
        tokens += 1


def test_pages_give_every_key_once_in_byte_order():
    keys = [f"cats/v1/c{c}/{i:03d}.png" for c in range(3) for i in range(250)] + ["cats/v1/Z.png", "cats/v10/x"]
    seen, tokens = all_pages(entries(keys), **{"max-keys": "100"})
    assert seen == sorted(keys, key=str.encode) and tokens == len(keys) // 100


def test_a_delimiter_folds_keys_into_common_prefixes_across_pages():
    keys = [f"cats/v1/c{c}/{i}.png" for c in range(5) for i in range(3)] + ["cats/v1/.manifest.jsonl"]
    seen, _ = all_pages(entries(keys), prefix="cats/v1/", delimiter="/", **{"max-keys": "2"})
    assert seen == ["cats/v1/.manifest.jsonl"] + [f"cats/v1/c{c}/" for c in range(5)]
    p = listing.page(entries(keys), {"prefix": "cats/", "delimiter": "/"})
    assert p.prefixes == ["cats/v1/"] and not p.contents


def test_start_after_and_v1_markers():
    items = entries(["a", "b", "c", "d"])
    assert [e.key for e in listing.page(items, {"list-type": "2", "start-after": "b"}).contents] == ["c", "d"]
    p = listing.page(items, {"marker": "a", "max-keys": "2"})
    assert [e.key for e in p.contents] == ["b", "c"] and p.truncated and p.next_marker == "c"
    body = listing.render("inbox", {"marker": "a", "max-keys": "2", "delimiter": "/"}, p, lambda e: e.etag)
    assert b"<NextMarker>c</NextMarker>" in body and b"<IsTruncated>true</IsTruncated>" in body


def test_max_keys_zero_is_an_empty_page_not_a_truncated_one():
    """As S3 answers (ceph/s3-tests test_bucket_list_maxkeys_zero)."""
    for q in ({"max-keys": "0"}, {"list-type": "2", "max-keys": "0"}):
        p = listing.page(entries(["a", "b"]), q)
        assert not p.contents and not p.prefixes and not p.truncated


def test_v1_sends_its_prefix_back_unencoded_and_v2_encoded():
    """With encoding-type=url, AWS encodes a v1 listing's keys but not its Prefix (botocore
    decodes only Delimiter, Marker and NextMarker there): s3-tests' prefix_unreadable."""
    items = entries(["a\nb"])
    v1 = listing.render("inbox", {"prefix": "a\n", "encoding-type": "url"}, listing.page(items, {"prefix": "a\n"}),
                        lambda e: e.etag)
    assert b"<Prefix>a\n</Prefix>" in v1 and b"<Key>a%0Ab</Key>" in v1
    q2 = {"list-type": "2", "prefix": "a\n", "encoding-type": "url"}
    assert b"<Prefix>a%0A</Prefix>" in listing.render("inbox", q2, listing.page(items, q2), lambda e: e.etag)


def test_times_are_written_as_datetime_writes_them_and_completion_keeps_every_field():
    import dataclasses
    import random
    from datetime import datetime

    from deeppod.s3 import xml

    def by_datetime(ts):
        when = datetime.fromtimestamp(ts, UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"

    r = random.Random(1)
    for ts in [0.0, 1.9995, 1_700_000_000.9999996, *(r.uniform(0, 2e9) for _ in range(20_000))]:
        assert xml.iso(ts) == by_datetime(ts), ts
    e = Entry("a/b", -1, 0.0, "etag", "/x/a/b", sidecar=True, guarded=True)
    done = e.with_stat(7, 12.5)
    assert (done.size, done.mtime) == (7, 12.5)
    assert {f.name: getattr(done, f.name) for f in dataclasses.fields(Entry) if f.name not in ("size", "mtime")} == \
        {f.name: getattr(e, f.name) for f in dataclasses.fields(Entry) if f.name not in ("size", "mtime")}

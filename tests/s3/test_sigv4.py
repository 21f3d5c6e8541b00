"""SigV4 as botocore signs it: header-signed and presigned requests verify with the right
secret and fail with a wrong one, a changed path, query or header, or an old date."""

from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qsl, urlsplit

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from deeppod.errors import S3Error
from deeppod.s3 import sigv4

KEY, SECRET = "DPKEXAMPLE0000000001", "secret/with+chars=="


def signed(method, url, headers=None, body=b"", presign=None, when=None):
    req = AWSRequest(method=method, url=url, headers=headers or {}, data=body)
    creds = Credentials(KEY, SECRET)
    if presign is not None:
        S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=presign).add_auth(req)
    else:
        S3SigV4Auth(creds, "s3", "us-east-1").add_auth(req)
    parts = urlsplit(req.url)
    return sigv4.Request(method, parts.path, parse_qsl(parts.query, keep_blank_values=True),
                         {k.lower(): v for k, v in req.headers.items()} | {"host": parts.netloc})


def check(req, secret=SECRET, now=None):
    s = sigv4.parse(req, now or datetime.now(timezone.utc))
    assert s is not None and s.access_key == KEY
    sigv4.verify(req, s, secret)
    return s


def test_header_signed_requests_verify_and_tampering_does_not():
    req = signed("GET", "http://127.0.0.1:7447/s3/datasets/cats/v1/a%20b%2Bc.png?list-type=2&prefix=x%2Fy")
    s = check(req)
    assert s.payload == sigv4.hashlib.sha256(b"").hexdigest() and not s.presigned
    with pytest.raises(S3Error) as e:
        check(req, "wrong")
    assert e.value.code == "SignatureDoesNotMatch" and e.value.status == 403
    for changed in (req.__class__(req.method, req.raw_path + "x", req.query, req.headers),
                    req.__class__(req.method, req.raw_path, [*req.query, ("max-keys", "1")], req.headers),
                    req.__class__("DELETE", req.raw_path, req.query, req.headers),
                    req.__class__(req.method, req.raw_path, req.query, {**req.headers, "host": "evil:1"})):
        with pytest.raises(S3Error):
            check(changed)


def test_a_utf8_header_verifies_as_the_asgi_server_hands_it_over():
    """User metadata in any language: botocore signs its UTF-8 bytes; the server sees them
    decoded as latin-1 (ASGI). s3-tests' set_get_unicode_metadata was refused before."""
    req = signed("PUT", "http://127.0.0.1:7447/s3/inbox/docs/a.txt", headers={"x-amz-meta-meta1": "Hello World\xe9"})
    sent = req.headers["x-amz-meta-meta1"].encode("utf-8").decode("latin-1")  # what uvicorn hands over
    check(req.__class__(req.method, req.raw_path, req.query, {**req.headers, "x-amz-meta-meta1": sent}))


def test_a_request_signed_long_ago_is_too_skewed():
    req = signed("GET", "http://127.0.0.1:7447/s3/")
    with pytest.raises(S3Error) as e:
        check(req, now=datetime.now(timezone.utc) + timedelta(minutes=20))
    assert e.value.code == "RequestTimeTooSkewed"


def test_presigned_urls_verify_until_they_expire():
    req = signed("GET", "http://127.0.0.1:7447/s3/models/m/v1/model.pt2", presign=60)
    assert check(req).presigned
    with pytest.raises(S3Error) as e:
        check(req, now=datetime.now(timezone.utc) + timedelta(seconds=120))
    assert e.value.code == "AccessDenied" and "expired" in e.value.message
    put = signed("PUT", "http://127.0.0.1:7447/s3/inbox/cats/a.png", presign=60)
    check(put)
    with pytest.raises(S3Error):
        check(sigv4.Request("GET", put.raw_path, put.query, put.headers))  # a PUT URL is not a GET


def test_no_signature_is_anonymous_and_other_schemes_are_refused():
    assert sigv4.parse(sigv4.Request("GET", "/s3/", [], {"host": "h"}), datetime.now(timezone.utc)) is None
    with pytest.raises(S3Error) as e:
        sigv4.parse(sigv4.Request("GET", "/s3/", [], {"host": "h", "authorization": "AWS AK:sig"}),
                    datetime.now(timezone.utc))
    assert "s3v4" in e.value.message


def test_an_amz_date_parses_as_strptime_reads_it_and_anything_else_is_refused():
    for text in ("20261127T120000Z", "20240229T235959Z", "19991231T000001Z"):
        assert sigv4._parse_time(text) == datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    for bad in ("", "20261127T120000", "20261127 120000Z", "20261327T120000Z", "20230229T120000Z",
                "2026112T1200000Z", "２０２６1127T120000Z", "+0261127T120000Z", "20261127T12000Z0"):
        with pytest.raises(S3Error) as e:
            sigv4._parse_time(bad)
        assert e.value.code == "AccessDenied" and "20261127T120000Z" in e.value.message

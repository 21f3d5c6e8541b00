"""SigV4 (and V2) as botocore signs them: header-signed and presigned requests verify with the
right secret and fail with a wrong one, a changed path, query or header, or an old date."""

from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from urllib.parse import parse_qsl, urlsplit

import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth, S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from deeppod.errors import S3Error
from deeppod.s3 import sigv4

KEY, SECRET = "DPKEXAMPLE0000000001", "secret/with+chars=="


def signed(method, url, headers=None, body=b"", presign=None, when=None, v2=False, auth_path=None):
    req = AWSRequest(method=method, url=url, headers=headers or {}, data=body)
    req.auth_path = auth_path
    creds = Credentials(KEY, SECRET)
    if v2:
        (HmacV1QueryAuth(creds, expires=presign) if presign is not None else HmacV1Auth(creds)).add_auth(req)
    elif presign is not None:
        S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=presign).add_auth(req)
    else:
        S3SigV4Auth(creds, "s3", "us-east-1").add_auth(req)
    parts = urlsplit(req.url)
    return sigv4.Request(method, parts.path, parse_qsl(parts.query, keep_blank_values=True),
                         {k.lower(): v for k, v in req.headers.items()} | {"host": parts.netloc})


def check(req, secret=SECRET, now=None):
    s = sigv4.parse(req, now or datetime.now(UTC))
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
        check(req, now=datetime.now(UTC) + timedelta(minutes=20))
    assert e.value.code == "RequestTimeTooSkewed"


def test_presigned_urls_verify_until_they_expire():
    req = signed("GET", "http://127.0.0.1:7447/s3/models/m/v1/model.pt2", presign=60)
    assert check(req).presigned
    with pytest.raises(S3Error) as e:
        check(req, now=datetime.now(UTC) + timedelta(seconds=120))
    assert e.value.code == "AccessDenied" and "expired" in e.value.message
    put = signed("PUT", "http://127.0.0.1:7447/s3/inbox/cats/a.png", presign=60)
    check(put)
    with pytest.raises(S3Error):
        check(sigv4.Request("GET", put.raw_path, put.query, put.headers))  # a PUT URL is not a GET


def test_no_signature_is_anonymous_and_other_schemes_are_refused():
    assert sigv4.parse(sigv4.Request("GET", "/s3/", [], {"host": "h"}), datetime.now(UTC)) is None
    for auth in ("Bearer abc", "AWS4-HMAC-SHA1 Credential=x", "AWS HAHAHA", "AWS :sig", "AWS AK:"):
        with pytest.raises(S3Error) as e:
            sigv4.parse(sigv4.Request("GET", "/s3/", [], {"host": "h", "authorization": auth,
                                                          "date": formatdate(usegmt=True)}),
                        datetime.now(UTC))
        assert e.value.code == "InvalidArgument" and e.value.status == 400, auth


def test_a_sigv4_request_dated_by_its_date_header_verifies():
    """botocore signs with the Date header, and sends no X-Amz-Date, when a request has one
    (s3-tests' create_date_and_amz_date): the string to sign holds the same second."""
    req = signed("PUT", "http://127.0.0.1:7447/s3/inbox/cats/a.png", headers={"Date": "x"})
    assert "x-amz-date" not in req.headers and "date" in check(req).signed_headers
    stale = formatdate(datetime.now(UTC).timestamp() - 3600, usegmt=True)
    with pytest.raises(S3Error) as e:  # the Date is what the signature was made at: moved, it no longer verifies
        check(req.__class__(req.method, req.raw_path, req.query, {**req.headers, "date": stale}))
    assert e.value.code == "RequestTimeTooSkewed"
    unsigned = sigv4.Request(req.method, req.raw_path, req.query,
                             {**req.headers, "authorization": req.headers["authorization"].replace("date;", "")})
    with pytest.raises(S3Error) as e:  # a Date that the signature does not cover dates nothing
        check(unsigned)
    assert e.value.code == "AccessDenied" and "X-Amz-Date" in e.value.message


def test_version_2_headers_verify_as_botocore_signs_them_and_tampering_does_not():
    url = "http://127.0.0.1:7447/s3/inbox/cats/a%20b.png?uploadId=7&partNumber=2&x-id=UploadPart"
    for headers in ({}, {"Content-Type": "image/png", "Content-MD5": "rL0Y20zC+Fzt72VPzMSk2A=="},
                    {"x-amz-meta-who": "Hello World\xe9"}, {"x-amz-date": formatdate(usegmt=True)}):
        req = signed("PUT", url, headers=headers, v2=True)
        if "x-amz-meta-who" in req.headers:  # the UTF-8 bytes as uvicorn hands them over
            req.headers["x-amz-meta-who"] = req.headers["x-amz-meta-who"].encode().decode("latin-1")
        s = check(req)
        assert s.v2 and not s.presigned and s.payload == sigv4.UNSIGNED
        with pytest.raises(S3Error) as e:
            check(req, "wrong")
        assert e.value.code == "SignatureDoesNotMatch"
        for changed in (req.__class__(req.method, req.raw_path + "x", req.query, req.headers),
                        req.__class__(req.method, req.raw_path, [("uploadId", "8"), ("partNumber", "2")], req.headers),
                        req.__class__("DELETE", req.raw_path, req.query, req.headers),
                        req.__class__(req.method, req.raw_path, req.query, {**req.headers, "content-type": "x/y"}),
                        req.__class__(req.method, req.raw_path, req.query, {**req.headers, "x-amz-meta-new": "1"})):
            with pytest.raises(S3Error):
                check(changed)
    # the endpoint's own /s3 may be left out of what the client signed (a proxy's path), and a
    # virtual-host-style request signs /BUCKET/KEY with the bucket taken from its host
    bare = signed("GET", "http://127.0.0.1:7447/inbox/cats/a.png", v2=True)
    assert sigv4.verify(sigv4.Request("GET", "/s3/inbox/cats/a.png", [], bare.headers),
                        check(bare), SECRET, "/s3") == b""
    vhost = signed("GET", "http://inbox.s3.example:7447/cats/a.png", v2=True, auth_path="/inbox/cats/a.png")
    s = sigv4.parse(vhost, datetime.now(UTC))
    with pytest.raises(S3Error):
        sigv4.verify(vhost, s, SECRET, "/s3")
    sigv4.verify(sigv4.Request("GET", "/cats/a.png", [], vhost.headers, v2_resource="/inbox/cats/a.png"), s, SECRET)


def test_a_version_2_request_is_dated_by_x_amz_date_first_then_date():
    """As s3-tests' test_headers *_aws2 check it: a bad or empty date is AccessDenied, a date
    far from this server's clock RequestTimeTooSkewed, and no date at all is refused."""
    now = datetime.now(UTC)
    for amz_date, code in (("Bad Date", "AccessDenied"), ("", "AccessDenied"),
                           ("Tue, 07 Jul 1950 21:53:04 GMT", "AccessDenied"),
                           ("Tue, 07 Jul 2010 21:53:04 GMT", "RequestTimeTooSkewed"),
                           ("Tue, 07 Jul 9999 21:53:04 GMT", "RequestTimeTooSkewed")):
        req = signed("PUT", "http://127.0.0.1:7447/s3/inbox/cats/a.png", headers={"x-amz-date": amz_date}, v2=True)
        with pytest.raises(S3Error) as e:  # the Date botocore adds is good; x-amz-date comes first
            sigv4.parse(req, now)
        assert (e.value.code, e.value.status) == (code, 403), amz_date
    req = signed("GET", "http://127.0.0.1:7447/s3/inbox/cats/a.png", v2=True)
    with pytest.raises(S3Error) as e:
        sigv4.parse(req, now + timedelta(minutes=16))
    assert e.value.code == "RequestTimeTooSkewed"
    with pytest.raises(S3Error) as e:
        sigv4.parse(sigv4.Request("GET", req.raw_path, [], {k: v for k, v in req.headers.items() if k != "date"}), now)
    assert e.value.code == "AccessDenied" and "Date" in e.value.message


def test_version_2_presigned_urls_verify_until_they_expire():
    req = signed("GET", "http://127.0.0.1:7447/s3/models/m/v1/model.pt2", presign=60, v2=True)
    s = check(req)
    assert s.presigned and s.v2
    with pytest.raises(S3Error) as e:
        check(req, now=datetime.now(UTC) + timedelta(seconds=120))
    assert "expired" in e.value.message
    with pytest.raises(S3Error):
        check(sigv4.Request("PUT", req.raw_path, req.query, req.headers))


def test_a_version_2_presigned_url_lives_a_week_at_most_as_version_4s_do():
    """Issue 70: ExpiresIn=10**9 (31 years) answered 200; V4 refuses more than 604800 s."""
    week = signed("GET", "http://127.0.0.1:7447/s3/models/m/v1/model.pt2", presign=7 * 24 * 3600, v2=True)
    assert check(week).presigned
    for far in (10**9, 8 * 24 * 3600):
        req = signed("GET", "http://127.0.0.1:7447/s3/models/m/v1/model.pt2", presign=far, v2=True)
        with pytest.raises(S3Error, match="expires more than a week from now") as e:
            check(req)
        assert e.value.code == "AccessDenied" and e.value.status == 403
    v4 = signed("GET", "http://127.0.0.1:7447/s3/models/m/v1/model.pt2", presign=8 * 24 * 3600)
    with pytest.raises(S3Error, match="604800"):
        check(v4)


def test_a_signature_that_is_not_ascii_is_wrong_not_an_error():
    for req in (signed("GET", "http://127.0.0.1:7447/s3/", v2=True), signed("GET", "http://127.0.0.1:7447/s3/")):
        auth = req.headers["authorization"]
        bad = sigv4.Request("GET", req.raw_path, [], {**req.headers, "authorization": auth[:-3] + "\xe9\xe9\xe9"})
        with pytest.raises(S3Error) as e:
            check(bad)
        assert e.value.code == "SignatureDoesNotMatch"


def test_an_amz_date_parses_as_strptime_reads_it_and_anything_else_is_refused():
    for text in ("20261127T120000Z", "20240229T235959Z", "19991231T000001Z"):
        assert sigv4._parse_time(text) == datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    for bad in ("", "20261127T120000", "20261127 120000Z", "20261327T120000Z", "20230229T120000Z",
                "2026112T1200000Z", "２０２６1127T120000Z", "+0261127T120000Z", "20261127T12000Z0"):
        with pytest.raises(S3Error) as e:
            sigv4._parse_time(bad)
        assert e.value.code == "AccessDenied" and "20261127T120000Z" in e.value.message

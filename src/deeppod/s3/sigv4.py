"""AWS Signature Version 4, as S3 checks it, and Version 2 (presigned URLs, which boto3 still
makes by default for a path-style endpoint, and the ``AWS KEY:SIGNATURE`` header of older
clients and devices): the Authorization header or a presigned URL's query, the canonical
request rebuilt from what arrived, the key derived from the secret for the request's day,
region and service. Pure: a request in, the access key id and what the payload must hash to
out, or an :class:`S3Error` that says which S3 error it is.

https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-authenticating-requests.html
https://docs.aws.amazon.com/AmazonS3/latest/userguide/RESTAuthentication.html (Version 2)
"""

from __future__ import annotations

import base64
import email.utils
import functools
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote

from deeppod.errors import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
V2_SCHEME = "AWS"  # Signature Version 2's Authorization header: "AWS KEY:SIGNATURE"
UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
SKEW = timedelta(minutes=15)  # S3's: a signed request older or newer than this is refused
MAX_EXPIRES = 7 * 24 * 3600  # a presigned URL lives at most a week
_CREDENTIAL = re.compile(r"^([A-Za-z0-9]+)/(\d{8})/([a-z0-9-]+)/([a-z0-9]+)/aws4_request$")
_SPACES = re.compile(r" +")


@dataclass(frozen=True)
class Request:
    """What the signature covers, as it arrived."""

    method: str
    raw_path: str  # percent-encoded, as sent
    query: list[tuple[str, str]]  # decoded pairs, in order
    headers: dict[str, str]  # lower-case names
    v2_resource: str = ""  # /BUCKET/KEY where the bucket is in the host (virtual-host-style): what V2 signs


@dataclass(frozen=True)
class Signed:
    """A request whose signature is to be checked once the key's secret is known."""

    access_key: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    amz_date: str
    signed_headers: tuple[str, ...]
    signature: str
    payload: str  # the x-amz-content-sha256 value (UNSIGNED-PAYLOAD for a presigned URL or any V2 request)
    presigned: bool
    v2: bool = False  # Signature Version 2 (HMAC-SHA1): a presigned URL or an "AWS KEY:SIGNATURE" header
    v2_date: str = ""  # the date line a V2 signature covers: a presigned URL's Expires, or the Date header

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def _uri_encode(text: str, slash: bool) -> str:
    return quote(text, safe="-_.~" + ("/" if not slash else ""))


def canonical_uri(raw_path: str) -> str:
    """Each segment encoded once, as S3 (unlike other services) signs it."""
    return _uri_encode(unquote(raw_path), slash=False) or "/"


def canonical_query(pairs: list[tuple[str, str]]) -> str:
    encoded = sorted((_uri_encode(k, True), _uri_encode(v, True)) for k, v in pairs if k != "X-Amz-Signature")
    return "&".join(f"{k}={v}" for k, v in encoded)


def _parse_time(amz_date: str) -> datetime:
    """20261127T120000Z (by slicing: strptime took a fifth of a small request's signature check)."""
    d = amz_date
    if len(d) == 16 and d.isascii() and d[8] == "T" and d[15] == "Z" and d[:8].isdigit() and d[9:15].isdigit():
        try:
            return datetime(int(d[:4]), int(d[4:6]), int(d[6:8]), int(d[9:11]), int(d[11:13]), int(d[13:15]),
                            tzinfo=UTC)
        except ValueError:
            pass
    raise S3Error("AccessDenied", f"X-Amz-Date {amz_date!r} is not a date of the form 20261127T120000Z")


def _credential(value: str) -> tuple[str, str, str, str]:
    m = _CREDENTIAL.match(value.strip())
    if not m:
        raise S3Error("AuthorizationQueryParametersError" if "/" in value else "InvalidAccessKeyId",
                      f"the credential {value!r} is not KEY/YYYYMMDD/REGION/s3/aws4_request")
    return m.group(1), m.group(2), m.group(3), m.group(4)


def parse(req: Request, now: datetime) -> Signed | None:
    """The request's signature, its age checked; None when it carries none (anonymous)."""
    query = dict(req.query)
    auth = req.headers.get("authorization")
    if auth is not None:
        if auth.startswith(V2_SCHEME + " "):
            return _v2_header(req, auth[len(V2_SCHEME) + 1:], now)
        if not auth.startswith(ALGORITHM + " "):
            raise S3Error("InvalidArgument", "the Authorization header must be AWS Signature Version 4 "
                          "(AWS4-HMAC-SHA256 ...) or Version 2 (AWS KEY:SIGNATURE): configure the client for "
                          "signature version s3v4")
        fields = dict(part.strip().split("=", 1) for part in auth[len(ALGORITHM) + 1:].split(",") if "=" in part)
        if not {"Credential", "SignedHeaders", "Signature"} <= set(fields):
            raise S3Error("AuthorizationHeaderMalformed", "the Authorization header needs Credential, "
                          "SignedHeaders and Signature")
        key, date, region, service = _credential(fields["Credential"])
        signed_headers = tuple(fields["SignedHeaders"].split(";"))
        amz_date = req.headers.get("x-amz-date") or ""
        if amz_date:
            when = _parse_time(amz_date)
        elif req.headers.get("date") and "date" in signed_headers:
            # the spec's other way, botocore's when a request has a Date header: the string to sign
            # holds the same second in the X-Amz-Date form; signed, so it cannot be moved to replay it
            when = _http_date(req.headers["date"], "Date")
            amz_date = f"{when:%Y%m%dT%H%M%SZ}"
        else:
            raise S3Error("AccessDenied", "a signed request needs an X-Amz-Date header (or a signed Date header)")
        _check_skew(when, now)
        payload = req.headers.get("x-amz-content-sha256")
        if not payload:
            raise S3Error("InvalidRequest", "a signed request needs an x-amz-content-sha256 header")
        return Signed(key, date, region, service, amz_date, signed_headers, fields["Signature"], payload, False)
    if query.get("X-Amz-Algorithm") is not None:
        if query["X-Amz-Algorithm"] != ALGORITHM:
            raise S3Error("AuthorizationQueryParametersError", "X-Amz-Algorithm must be AWS4-HMAC-SHA256")
        missing = [k for k in ("X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
                               "X-Amz-Signature") if k not in query]
        if missing:
            raise S3Error("AuthorizationQueryParametersError", f"the presigned URL lacks {', '.join(missing)}")
        key, date, region, service = _credential(query["X-Amz-Credential"])
        when = _parse_time(query["X-Amz-Date"])
        try:
            expires = int(query["X-Amz-Expires"])
        except ValueError:
            expires = -1
        if not 0 <= expires <= MAX_EXPIRES:  # refused as AWS refuses it (ceph/s3-tests' expires_out_*_range)
            raise S3Error("AccessDenied", "X-Amz-Expires must be between 0 and 604800 seconds (a week): ask for a "
                          "presigned URL that lives at most that long")
        if now > when + timedelta(seconds=expires):
            raise S3Error("AccessDenied", "Request has expired: the presigned URL was good until "
                          f"{when + timedelta(seconds=expires):%Y-%m-%d %H:%M:%S} UTC; ask for a new one")
        if when - now > SKEW:
            raise S3Error("AccessDenied", "the presigned URL is dated in the future: fix the client's clock")
        return Signed(key, date, region, service, query["X-Amz-Date"], tuple(query["X-Amz-SignedHeaders"].split(";")),
                      query["X-Amz-Signature"], req.headers.get("x-amz-content-sha256") or UNSIGNED, True)
    if "AWSAccessKeyId" in query and "Signature" in query and "Expires" in query:
        if not query["Expires"].isdigit():
            raise S3Error("AccessDenied", "the presigned URL's Expires is not a time")
        if now.timestamp() > int(query["Expires"]):
            raise S3Error("AccessDenied", "Request has expired: ask for a new presigned URL")
        if int(query["Expires"]) > now.timestamp() + MAX_EXPIRES + SKEW.total_seconds():
            # V2 signs the end, not the start: a URL still usable more than a week from now lives too long
            raise S3Error("AccessDenied", "the presigned URL expires more than a week from now (at most 604800 "
                                          "seconds, as for Signature Version 4): ask for one that expires sooner")
        return Signed(query["AWSAccessKeyId"], "", "", "s3", "", (), query["Signature"], UNSIGNED, True,
                      v2=True, v2_date=query["Expires"])
    return None


def _check_skew(when: datetime, now: datetime) -> None:
    if abs(now - when) > SKEW:
        raise S3Error("RequestTimeTooSkewed", f"the request was signed at {when:%Y-%m-%d %H:%M:%S} UTC and "
                      f"this server's time is {now:%Y-%m-%d %H:%M:%S} UTC: more than 15 minutes apart; "
                      "fix the client's clock")


def _http_date(value: str, header: str) -> datetime:
    """An HTTP date (RFC 1123: Tue, 01 Dec 2026 12:00:00 GMT) as UTC; before 1970 is no date."""
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        when = None
    if when is None or when.year < 1970:
        raise S3Error("AccessDenied", f"the {header} header {value[:64]!r} is not a date of the form "
                      "'Tue, 01 Dec 2026 12:00:00 GMT'")
    return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)


def _v2_header(req: Request, credential: str, now: datetime) -> Signed:
    """``Authorization: AWS KEY:SIGNATURE``, dated by X-Amz-Date where sent, else by Date
    (both within 15 minutes of this server's clock, as S3 checks them)."""
    key, sep, signature = credential.strip().partition(":")
    if not (sep and key and signature):
        raise S3Error("InvalidArgument", "a Signature Version 2 Authorization header is 'AWS ACCESS_KEY_ID:SIGNATURE'")
    amz_date, date = req.headers.get("x-amz-date"), req.headers.get("date")
    if amz_date is None and not date:
        raise S3Error("AccessDenied", "a signed request needs a Date or an X-Amz-Date header")
    _check_skew(_http_date(amz_date, "X-Amz-Date") if amz_date is not None else _http_date(date, "Date"), now)
    return Signed(key, "", "", "s3", "", (), signature, UNSIGNED, False, v2=True, v2_date=date or "")


# the sub-resources a Version 2 signature covers (the rest of the query is not signed): botocore's
# list, which holds S3's documented one
_V2_SUBRESOURCES = {"accelerate", "acl", "analytics", "cors", "defaultObjectAcl", "delete", "inventory", "lifecycle",
                    "location", "logging", "metrics", "notification", "object-lock", "partNumber", "policy",
                    "replication", "requestPayment", "restore", "select", "select-type", "storageClass", "tagging",
                    "torrent", "uploadId", "uploads", "versionId", "versioning", "versions", "website",
                    "response-content-type", "response-content-language", "response-expires",
                    "response-cache-control", "response-content-disposition", "response-content-encoding"}


def _same(expected: str, given: str) -> bool:
    """Constant-time, and a signature with other than ASCII in it is simply wrong (not a 500)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))


def _verify_v2(req: Request, s: Signed, secret: str, prefix: str) -> bool:
    """HMAC-SHA1 over method, Content-MD5, Content-Type, the date line, the x-amz- headers and
    the resource. The resource is tried as sent, without the endpoint's own prefix, and as
    /BUCKET/KEY for a virtual-host-style request; the date line as sent and, where X-Amz-Date
    dates the request, empty (S3's rule, which botocore does not follow)."""
    h = req.headers
    amz = "".join(f"{k}:{_as_sent(v).strip()}\n" for k, v in sorted(h.items()) if k.startswith("x-amz-"))
    sub = sorted((k, v) for k, v in req.query if k in _V2_SUBRESOURCES)
    resource_q = ("?" + "&".join(f"{k}={v}" if v else k for k, v in sub)) if sub else ""
    paths = {req.raw_path, req.raw_path[len(prefix):] if prefix and req.raw_path.startswith(prefix) else "",
             req.v2_resource} - {""}
    dates = {s.v2_date} | ({""} if not s.presigned and "x-amz-date" in h else set())
    for date in dates:
        head = "\n".join([req.method, h.get("content-md5", "").strip(), h.get("content-type", "").strip(), date])
        for path in paths:
            text = head + "\n" + amz + path + resource_q
            digest = hmac.new(secret.encode(), text.encode("utf-8", "surrogateescape"), hashlib.sha1).digest()
            if _same(base64.b64encode(digest).decode(), s.signature):
                return True
    return False


@functools.lru_cache(maxsize=1024)  # the same for a key's every request of a day: four HMACs saved each
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def _as_sent(value: str) -> str:
    """The value as signed: ASGI's latin-1 text back to UTF-8 (surrogateescape keeps the rest)."""
    return value if value.isascii() else value.encode("latin-1").decode("utf-8", "surrogateescape")


def canonical_request(req: Request, s: Signed) -> str:
    headers = "".join(f"{h}:{_SPACES.sub(' ', _as_sent(req.headers.get(h, '')).strip())}\n" for h in s.signed_headers)
    return "\n".join([req.method, canonical_uri(req.raw_path), canonical_query(req.query), headers,
                      ";".join(s.signed_headers), s.payload])


def verify(req: Request, s: Signed, secret: str, prefix: str = "") -> bytes:
    """Check ``s`` with the key's ``secret``; the signing key (streaming chunks sign with it).
    ``prefix``: the endpoint's own path (/s3), which a Version 2 signature may leave out."""
    if s.v2:
        if not _verify_v2(req, s, secret, prefix):
            raise S3Error("SignatureDoesNotMatch", "the request signature we calculated does not match the "
                          "signature you provided: check your secret access key and signing method")
        return b""
    if "host" not in s.signed_headers:
        raise S3Error("AccessDenied", "the signature must cover the Host header")
    key = signing_key(secret, s.date, s.region, s.service)
    to_sign = "\n".join([ALGORITHM, s.amz_date, s.scope, hashlib.sha256(canonical_request(req, s).encode("utf-8",
                                                                                                         "surrogateescape")).hexdigest()])
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not _same(expected, s.signature):
        raise S3Error("SignatureDoesNotMatch", "the request signature we calculated does not match the signature "
                      "you provided: check your secret access key and signing method")
    return key


def chunk_signature(key: bytes, s: Signed, previous: str, chunk_sha256: str) -> str:
    """A signed streaming upload's chunk signature (each chains to the one before)."""
    to_sign = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", s.amz_date, s.scope, previous,
                         hashlib.sha256(b"").hexdigest(), chunk_sha256])
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()

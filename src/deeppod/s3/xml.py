"""S3's XML: the answers' bodies and the error body, written as S3 writes them, and the few
request bodies it takes (CompleteMultipartUpload, DeleteObjects) read safely."""

from __future__ import annotations

import functools
import math
import time
from datetime import UTC, datetime
from xml.sax.saxutils import escape

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'


def iso(ts: float | datetime) -> str:
    if isinstance(ts, datetime):
        when = ts.astimezone(UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    frac, second = math.modf(ts)  # rounded to the microsecond as datetime.fromtimestamp rounds
    us = round(frac * 1e6)
    if us >= 1_000_000:
        second, us = second + 1, us - 1_000_000
    elif us < 0:
        second, us = second - 1, us + 1_000_000
    return _second(int(second)) + f".{us // 1000:03d}Z"


@functools.lru_cache(maxsize=4096)
def _second(second: int) -> str:
    """A second's text: a listing's files were mostly written in the same few seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def element(name: str, value) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"<{name}>{escape(str(value))}</{name}>"


def document(root: str, body: str) -> bytes:
    return (HEAD + f'<{root} xmlns="{NS}">{body}</{root}>').encode()


def error(code: str, message: str, resource: str, request_id: str) -> bytes:
    return (HEAD + "<Error>" + element("Code", code) + element("Message", message) + element("Resource", resource)
            + element("RequestId", request_id) + "</Error>").encode()


def parse(body: bytes, what: str):
    """A request's XML body: no DTDs or entities (a billion-laughs body is refused)."""
    import xml.etree.ElementTree as ET

    from deeppod.errors import S3Error

    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise S3Error("MalformedXML", f"the {what} body may not declare a DTD or entities")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise S3Error("MalformedXML", f"the {what} body is not well-formed XML ({exc})") from None
    for e in root.iter():  # S3's namespace or none: compare local names
        e.tag = e.tag.rsplit("}", 1)[-1]
    return root

"""Reading a predict request: multipart image uploads, JSON (base64 images or tensors),
or the raw bytes of one image. Every refusal says what was expected."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from deeppod.errors import BadInput, TooLarge, UnsupportedMediaType

MAX_ITEMS = 256  # images or tensors in one request
DEFAULT_TOP_K = 5
USAGE = ("send an image as multipart form field 'image' (curl -F image=@cat.jpg), the raw image bytes with "
         "Content-Type image/*, or JSON {\"images\": [\"<base64>\"...]} or {\"tensors\": [[[...]]]}")


async def read_body(request, limit: int, hint: str) -> bytes:
    """The whole body, refused with 413 as soon as it is over ``limit`` (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request is {declared} bytes, over the {limit}-byte limit{hint}: "
                       "send smaller or fewer images")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the request is over the {limit}-byte limit{hint}: send smaller or fewer images")
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class Items:
    images: list[bytes]  # encoded images, in request order, before tensors
    tensors: list  # nested lists, one per input
    top_k: int


def _top_k(raw) -> int:
    if raw is None or raw == "":
        return DEFAULT_TOP_K
    try:
        k = int(raw)
    except (TypeError, ValueError):
        raise BadInput(f"top_k {raw!r} is not a whole number") from None
    if not 1 <= k <= 1000:
        raise BadInput(f"top_k must be between 1 and 1000 (got {k})")
    return k


def _count(n: int) -> None:
    if n == 0:
        raise BadInput(f"the request holds no image or tensor: {USAGE}")
    if n > MAX_ITEMS:
        raise TooLarge(f"the request holds {n} inputs; send at most {MAX_ITEMS} per request")


def from_json(body: bytes, query_top_k=None) -> Items:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"the body is not valid JSON ({exc}): {USAGE}") from None
    if not isinstance(doc, dict):
        raise BadInput(f"the JSON body must be an object: {USAGE}")
    unknown = set(doc) - {"images", "tensors", "top_k"}
    if unknown:
        raise BadInput(f"unknown field(s) {', '.join(sorted(unknown))}: the body takes images, tensors and top_k")
    images, tensors = doc.get("images") or [], doc.get("tensors") or []
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise BadInput("'images' must be a list of base64 strings")
    if not isinstance(tensors, list):
        raise BadInput("'tensors' must be a list of inputs, each nested lists shaped like the model's input")
    _count(len(images) + len(tensors))
    decoded = []
    for n, text in enumerate(images):
        try:
            decoded.append(base64.b64decode(text.split(",", 1)[-1] if text.startswith("data:") else text,
                                            validate=True))
        except (binascii.Error, ValueError):
            raise BadInput(f"images[{n}] is not valid base64") from None
    return Items(decoded, tensors, _top_k(doc.get("top_k", query_top_k)))


async def from_form(request, query_top_k=None) -> Items:
    form = await request.form(max_files=MAX_ITEMS + 1, max_fields=16)
    try:
        files = [v for k, v in form.multi_items() if hasattr(v, "read")]
        _count(len(files))
        images = [await f.read() for f in files]
        return Items(images, [], _top_k(form.get("top_k") or query_top_k))
    finally:
        await form.close()


async def read(request, content_type: str, body: bytes | None = None) -> Items:
    """``body``: already read (JSON and raw bytes); multipart is parsed from the request."""
    ctype = content_type.split(";")[0].strip().lower()
    k = request.query_params.get("top_k")
    if ctype == "multipart/form-data":
        return await from_form(request, k)
    if body is None:
        body = await request.body()
    if ctype in ("application/json", ""):
        if not body:
            raise BadInput(f"the request body is empty: {USAGE}")
        return from_json(body, k)
    if ctype.startswith("image/") or ctype == "application/octet-stream":
        if not body:
            raise BadInput(f"the image is empty: {USAGE}")
        return Items([body], [], _top_k(k))
    raise UnsupportedMediaType(f"Content-Type {ctype!r} is not understood: {USAGE}")

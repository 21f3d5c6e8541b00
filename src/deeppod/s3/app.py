"""The S3 endpoint: ``/s3`` on the API's own port (path-style: ``http://HOST:PORT/s3/BUCKET/KEY``;
boto3, the aws CLI and s3fs take it as their endpoint URL), and with ``--s3-port`` at the root
of a port of its own (``http://HOST:S3PORT/BUCKET/KEY``: clients that take a host, not a URL,
such as MinIO's SDK and mc). A raw ASGI app: every request is
signed (SigV4 or V2, header or presigned), its access key names the user and tenant it acts for,
and what it may see is that tenant's namespace (s3/namespace.py). Bodies stream to and from
files; nothing is held whole in memory. docs/datasets.md, "S3", lists the operations."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from urllib.parse import parse_qsl, quote, unquote

import anyio

from deeppod.errors import DeepPodError, S3Error
from deeppod.s3 import access_keys, inbox, listing, metadata, multipart_checksums, sigv4, upload, xml
from deeppod.s3.body import Digests
from deeppod.s3.namespace import (
    BUCKETS,
    COMMIT,
    READ_ONLY,
    Entry,
    Namespace,
    completed,
    etag_of,
    etags_in,
    file_md5,
    open_object,
    request_key,
)
from deeppod.transport import direct_body, zerocopy

log = logging.getLogger(__name__)
PREFIX = "/s3"
BLOCK = 1 << 20
KEY_CACHE_S = 1.0  # a revoked key stops working within this
LISTING_SNAPSHOT_S = 30.0  # a paged listing's later pages come from its first page's snapshot this long
_SUBRESOURCES_NOT_BUILT = {"acl", "policy", "cors", "lifecycle", "tagging", "versioning", "versions", "website",
                           "logging", "notification", "replication", "encryption", "object-lock", "retention",
                           "legal-hold", "torrent", "restore", "select", "accelerate", "analytics", "inventory",
                           "metrics", "ownershipControls", "publicAccessBlock", "requestPayment", "intelligent-tiering"}


def endpoint_of(request) -> str:
    """The endpoint URL a client should be given: this server's, as the caller reached it (its
    own S3 port where it has one: every client takes that)."""
    port = request.app.state.ctx.settings.s3_port
    if port:
        return f"{request.url.scheme}://{_host(request.url.hostname or '127.0.0.1')}:{port}"
    return str(request.base_url).rstrip("/") + PREFIX


def _host(name: str) -> str:
    return f"[{name}]" if ":" in name else name


def is_s3(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class S3App:
    def __init__(self, ctx, prefix: str = PREFIX):
        self.ctx, self.prefix = ctx, prefix  # "" on a port of its own
        self.ns = Namespace(ctx.data, ctx.settings.models_dir, ctx.settings.jobs_dir)
        self._keys: dict[str, tuple[float, access_keys.KeyHolder, str]] = {}
        self._etags: dict[tuple[str, float, int], str] = {}
        self._listings: dict[tuple, tuple[float, list[Entry]]] = {}
        self._lock = threading.Lock()
        self.domain = ctx.settings.s3_domain.strip().lower().strip(".")

    def _address(self, raw: str, host: str) -> tuple[str, str, str]:
        """(bucket, key as sent, resource) of a request: the bucket from the path (path-style), or
        from the host, BUCKET.<s3_domain> (virtual-host-style, where a domain is set)."""
        rest = raw[len(self.prefix):].lstrip("/")
        name = host.rsplit(":", 1)[0].lower() if not host.startswith("[") else ""
        if self.domain and name.endswith("." + self.domain):  # a name not a bucket's: NoSuchBucket
            bucket = name[:-len(self.domain) - 1]
            return bucket, rest, f"/{bucket}/{rest}"
        bucket, _, key_raw = rest.partition("/")
        return unquote(bucket), key_raw, "/" + rest if rest else "/"

    # -- the protocol ------------------------------------------------------------------------
    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        rid = uuid.uuid4().hex[:16].upper()
        raw = scope.get("raw_path")
        raw = raw.decode("latin-1") if raw else quote(scope["path"])
        headers: dict[str, str] = {}
        for k, v in scope.get("headers") or []:
            name = k.decode("latin-1").lower()
            headers[name] = headers[name] + "," + v.decode("latin-1") if name in headers else v.decode("latin-1")
        bucket, key_raw, resource = self._address(raw, headers.get("host", ""))
        try:
            key = request_key(key_raw)
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            if scope["method"] == "OPTIONS":  # a browser's CORS preflight: no CORS rules are kept here
                raise S3Error("InvalidRequest", "CORS is not configured on DeepPod's S3 endpoint (an OPTIONS "
                              "request needs an Origin and a bucket's CORS rules)")
            req = sigv4.Request(scope["method"], raw, query, headers, v2_resource=resource)
            who, signed, signing_key = await self._authenticate(req)
            scope.setdefault("state", {})["principal"] = who.principal  # for the audit log
            offers = scope.get("extensions") or {}
            files = zerocopy.EXTENSION in offers  # large bodies by sendfile
            direct = offers.get(direct_body.EXTENSION)  # large uploads read off the loop
            await self._dispatch(receive, send, req, who, bucket, key, signed, signing_key, rid, files, direct)
        except S3Error as exc:
            await _error(send, exc.code, exc.status, exc.message, resource, rid, scope["method"])
        except DeepPodError as exc:  # a service refused (a bad dataset name, an empty inbox...): say why in S3's form
            code = {404: "NoSuchKey", 403: "AccessDenied", 409: "InvalidRequest"}.get(exc.status, "InvalidRequest")
            await _error(send, code, exc.status if exc.status < 500 else 500, exc.message, resource, rid,
                         scope["method"])
        except Exception:  # noqa: BLE001 - S3's answer, and the details in the server log
            log.exception("S3 request %s %s failed", scope["method"], raw)
            await _error(send, "InternalError", 500, "we encountered an internal error; try again", resource, rid,
                         scope["method"])

    async def _authenticate(self, req: sigv4.Request):
        signed = sigv4.parse(req, datetime.now(UTC))
        if signed is None:
            raise S3Error("AccessDenied", "anonymous requests are not accepted: sign them with an access key "
                          "('deeppod keys create')")
        hit = self._keys.get(signed.access_key)
        if hit is not None and hit[0] > time.monotonic():  # the usual case: no hop off the loop
            who, secret = hit[1], hit[2]
        else:
            who, secret = await anyio.to_thread.run_sync(self._holder, signed.access_key)
        return who, signed, sigv4.verify(req, signed, secret, self.prefix)

    def _holder(self, key_id: str) -> tuple[access_keys.KeyHolder, str]:
        now = time.monotonic()
        hit = self._keys.get(key_id)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        with self.ctx.sessions() as s:
            who, secret = access_keys.holder(s, key_id)
        with self._lock:
            if len(self._keys) > 10_000:
                self._keys.clear()
            self._keys[key_id] = (now + KEY_CACHE_S, who, secret)
        return who, secret

    async def _dispatch(self, receive, send, req, who, bucket, key, signed, signing_key, rid, files=False,
                        direct=None):
        method, q = req.method, dict(req.query)
        if not bucket:
            if method not in ("GET", "HEAD"):
                raise S3Error("MethodNotAllowed", "only GET lists the buckets")
            return await _xml(send, 200, listing.buckets(BUCKETS), rid)
        if bucket not in BUCKETS:
            raise S3Error("NoSuchBucket", f"the specified bucket does not exist: {bucket} (the buckets are "
                          f"{', '.join(BUCKETS)})")
        for sub in q:
            if sub in _SUBRESOURCES_NOT_BUILT:
                raise S3Error("NotImplemented", f"?{sub} is not implemented by DeepPod's S3 endpoint")
        if method not in ("GET", "HEAD"):
            if not who.writes:
                raise S3Error("AccessDenied", "this access key is read-only: create one with --scope write")
            if bucket in READ_ONLY:
                raise S3Error("AccessDenied", f"the {bucket} bucket is read-only: write to the inbox bucket "
                              "(inbox/NAME/...) and commit it into a new version")
        tenant = who.principal.tenant_id
        if not key:
            return await self._bucket(receive, send, req.method, q, tenant, bucket, rid)
        if method in ("GET", "HEAD"):
            if "uploadId" in q:
                return await self._list_parts(send, q, tenant, bucket, key, rid)
            if "attributes" in q:
                return await self._attributes(send, req, tenant, bucket, key, rid)
            return await self._get(send, req, q, tenant, bucket, key, rid, files)
        if method == "PUT":  # (writes reach only the inbox: the others were refused above)
            return await self._put(receive, send, req, q, who, key, signed, signing_key, rid, direct)
        if method == "DELETE":
            if "uploadId" in q:
                await anyio.to_thread.run_sync(inbox.abort, inbox.upload_folder(self.ns, tenant, q["uploadId"], key))
            else:
                await anyio.to_thread.run_sync(inbox.delete, self.ns, tenant, key)
            return await _send(send, 204, [], b"", rid)
        if method == "POST" and "uploads" in q:
            spec = multipart_checksums.requested(req.headers)
            upload_id = await anyio.to_thread.run_sync(inbox.create_upload, self.ns, tenant, key, {
                **metadata.from_request(req.headers), **({inbox.CHECKSUM_SPEC: spec} if spec else {})})
            said = [(b"x-amz-checksum-algorithm", spec["algorithm"].encode()),
                    (b"x-amz-checksum-type", spec["type"].encode())] if spec else []
            return await _send(send, 200, [(b"content-type", b"application/xml"), *said], xml.document(
                "InitiateMultipartUploadResult", xml.element("Bucket", bucket) + xml.element("Key", key)
                + xml.element("UploadId", upload_id)), rid)
        if method == "POST" and "uploadId" in q:
            etag, checksums = await self._complete_upload(receive, req, q, tenant, key)
            return await _xml(send, 200, xml.document("CompleteMultipartUploadResult", xml.element(
                "Location", f"{self.prefix}/{bucket}/{key}") + xml.element("Bucket", bucket) + xml.element("Key", key)
                + xml.element("ETag", f'"{etag}"') + _checksum_xml(checksums)), rid)
        raise S3Error("NotImplemented", f"{method} on an object is not implemented (only PUT, GET, HEAD, DELETE and "
                      "the multipart upload calls)")

    async def _attributes(self, send, req, tenant, bucket, key, rid):
        """GetObjectAttributes: the ETag, checksum, parts, storage class and size asked for."""
        e, meta, _ = await anyio.to_thread.run_sync(self._object, tenant, bucket, key)
        asked = {a.strip().lower() for a in req.headers.get("x-amz-object-attributes", "").split(",") if a.strip()}
        if not asked:
            raise S3Error("InvalidArgument", "x-amz-object-attributes must name at least one of ETag, Checksum, "
                          "ObjectParts, StorageClass, ObjectSize")
        body = xml.element("ETag", self._etag_of(e)) if "etag" in asked else ""
        sums = meta.get(metadata.CHECKSUMS) or {}
        if "checksum" in asked and sums:
            body += "<Checksum>" + _checksum_xml(sums) + "</Checksum>"
        if "objectparts" in asked and meta.get(metadata.PARTS):
            body += _object_parts(meta, req.headers)
        body += xml.element("StorageClass", "STANDARD") if "storageclass" in asked else ""
        body += xml.element("ObjectSize", e.size) if "objectsize" in asked else ""
        return await _send(send, 200, [(b"content-type", b"application/xml"),
                                       (b"last-modified", formatdate(e.mtime, usegmt=True).encode())],
                           xml.document("GetObjectAttributesResponse", body), rid)

    async def _complete_upload(self, receive, req, q, tenant, key) -> tuple[str, dict]:
        try:
            folder = inbox.upload_folder(self.ns, tenant, q["uploadId"], key)
        except S3Error:  # completed already (the client's retry of an answer it lost): the same answer
            done = await anyio.to_thread.run_sync(inbox.completed, self.ns, tenant, q["uploadId"], key)
            if done is None:
                raise
            return done
        asked = listing.completed_parts(await _read_small(receive, 1 << 20))
        return await anyio.to_thread.run_sync(inbox.complete, self.ns, tenant, folder, key, asked,
                                              inbox.Condition.of(req.headers), req.headers)

    async def _bucket(self, receive, send, method, q, tenant, bucket, rid):
        if method == "HEAD":
            return await _send(send, 200, [(b"x-amz-bucket-region", b"us-east-1")], b"", rid)
        if method == "GET" and "location" in q:
            return await _xml(send, 200, xml.document("LocationConstraint", ""), rid)
        if method == "GET" and "uploads" in q:
            return await _xml(send, 200, await anyio.to_thread.run_sync(listing.uploads, self.ns, tenant, bucket), rid)
        if method == "GET":
            entries = await anyio.to_thread.run_sync(self._listed, tenant, bucket, q)
            page = listing.page(entries, q)
            page.contents = await anyio.to_thread.run_sync(self._complete, page.contents)
            return await _xml(send, 200, listing.render(bucket, q, page, self._etag_of), rid)
        if method == "POST" and "delete" in q:
            body = await _read_small(receive, 2 << 20)
            keys, quiet = listing.delete_request(body)
            done, failed = await anyio.to_thread.run_sync(inbox.delete_many, self.ns, tenant, keys)
            return await _xml(send, 200, listing.deleted(done, failed, quiet), rid)
        if method == "PUT":
            raise S3Error("NotImplemented", f"the buckets are fixed ({', '.join(BUCKETS)}): {bucket} exists already")
        raise S3Error("NotImplemented", f"{method} on a bucket is not implemented")

    def _entries(self, tenant: int, bucket: str, prefix: str) -> list[Entry]:
        with self.ctx.sessions() as s:
            return list(self.ns.entries(s, tenant, bucket, prefix))

    def _listed(self, tenant: int, bucket: str, q: dict) -> list[Entry]:
        """The objects a listing pages through, sorted. A first page reads them afresh; the pages
        after it (a continuation token or marker) page through that same snapshot while it is
        recent, so a listing of 100,000 keys reads them once, not once per page."""
        prefix = q.get("prefix", "")
        cache_key = (tenant, bucket, prefix)
        now = time.monotonic()
        if q.get("continuation-token") or q.get("marker") or q.get("start-after"):
            hit = self._listings.get(cache_key)
            if hit is not None and hit[0] > now:
                return hit[1]
        entries = sorted(self._entries(tenant, bucket, prefix), key=lambda e: e.key.encode())
        with self._lock:
            if len(self._listings) > 64:
                self._listings.clear()
            self._listings[cache_key] = (now + LISTING_SNAPSHOT_S, entries)
        return entries

    def _find(self, tenant: int, bucket: str, key: str) -> Entry:
        with self.ctx.sessions() as s:
            return self.ns.find(s, tenant, bucket, key)

    def _object(self, tenant: int, bucket: str, key: str, first: int = 0, small_only: bool = False):
        """An object's entry with its ETag, its metadata (inbox objects keep theirs) and, with
        ``first``, its file open with up to ``first`` bytes read from the start (a small object's
        whole body; with ``small_only``, nothing read from a larger one, which goes by sendfile):
        in one worker-thread call, since each hop off the event loop costs a wake-up (about 0.5
        ms on a busy 2-core machine: a third of a small GET's time)."""
        e = self._find(tenant, bucket, key)
        self._fill_etags([e])
        meta = metadata.read(e.path) if bucket == "inbox" else {}
        if not first or e.size <= 0:
            return e, meta, None
        return e, meta, _open_at(e, 0, 0 if small_only and e.size > first else min(first, e.size))

    def _etag_of(self, e: Entry) -> str:
        return e.etag or self._etags.get((str(e.path), e.mtime, e.size)) or ""

    def _complete(self, entries: list[Entry]) -> list[Entry]:
        """A page's objects with their sizes, times and ETags (those gone meanwhile left out)."""
        done = [e for e in map(completed, entries) if e is not None]
        self._fill_etags(done)
        return done

    def _fill_etags(self, entries: list[Entry]) -> None:
        """The ETags of a page's objects: known, read beside an inbox file, or hashed once."""
        for e in entries:
            if e.etag:
                continue
            st_key = (str(e.path), e.mtime, e.size)
            if st_key not in self._etags:
                with self._lock:
                    if len(self._etags) > 100_000:
                        self._etags.clear()
                self._etags[st_key] = etag_of(e) or file_md5(e)

    # -- objects -------------------------------------------------------------------------------
    async def _get(self, send, req, q, tenant, bucket, key, rid, files=False):
        h = req.headers  # a conditional GET may well be answered 304: its body is read only if sent
        whole = req.method == "GET" and "range" not in h and "partNumber" not in q and not (h.keys() & _CONDITIONS)
        e, meta, opened = await anyio.to_thread.run_sync(self._object, tenant, bucket, key, BLOCK * 4 if whole else 0,
                                                         files)
        try:
            await self._answer_get(send, req, q, key, e, meta, opened, rid, files)
        finally:
            if opened is not None:
                opened[0].close()

    async def _answer_get(self, send, req, q, key, e, meta, opened, rid, files=False):
        """``opened``: the file and its first block, read with the entry (a whole-object GET);
        ``files``: the rest may go from the file to the socket (transport/zerocopy.py)."""
        etag = f'"{self._etag_of(e)}"'
        h = req.headers
        modified = datetime.fromtimestamp(int(e.mtime), UTC)
        # the endpoint shares the console's origin: what it serves never runs as the console
        base = [(b"etag", etag.encode()), (b"last-modified", formatdate(e.mtime, usegmt=True).encode()),
                (b"accept-ranges", b"bytes"), (b"content-security-policy", b"sandbox"),
                (b"x-content-type-options", b"nosniff"), *metadata.headers(meta, key, q)]
        if "if-match" in h and etag not in etags_in(h["if-match"]) and "*" not in h["if-match"]:
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold "
                          "(If-Match)")
        if "if-unmodified-since" in h and "if-match" not in h and _after(modified, h["if-unmodified-since"]):
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold "
                          "(If-Unmodified-Since)")
        if ("if-none-match" in h and (etag in etags_in(h["if-none-match"]) or "*" in h["if-none-match"])) or \
                ("if-modified-since" in h and "if-none-match" not in h and not _after(modified,
                                                                                      h["if-modified-since"])):
            return await _send(send, 304, base, b"", rid)
        start, end, status = 0, e.size - 1, 200
        wanted = h.get("range")
        if "partNumber" in q:  # one part of a multipart object (part 1 of any other is all of it)
            start, end, count = metadata.part_range(meta, inbox.part_number(q["partNumber"]), e.size)
            status = 206
            base += [(b"content-range", f"bytes {start}-{end}/{e.size}".encode()),
                     (b"x-amz-mp-parts-count", str(count).encode())]
        elif wanted:
            start, end = _range(wanted, e.size)
            status = 206
            base.append((b"content-range", f"bytes {start}-{end}/{e.size}".encode()))
        length = max(0, end - start + 1)
        base.append((b"content-length", str(length).encode()))
        if h.get("x-amz-checksum-mode", "").upper() == "ENABLED" and (status == 200 or "partNumber" in q):
            # the whole object's checksums for the whole object, a part's for a part, none for a
            # range: current SDKs ask on every GET and check the body against what comes
            base += metadata.checksum_headers(meta, int(q["partNumber"]) if "partNumber" in q else None)
        await send({"type": "http.response.start", "status": status,
                    "headers": base + [(b"x-amz-request-id", rid.encode())]})
        if req.method == "HEAD" or length == 0:
            return await send({"type": "http.response.body", "body": b""})
        if opened is not None:  # from the start: a whole-object GET (closed by _get)
            return await _stream(send, *opened, length, files)
        first = 0 if files and length > BLOCK * 4 else min(BLOCK * 4, length)
        f, block = await anyio.to_thread.run_sync(_open_at, e, start, first)
        try:
            await _stream(send, f, block, length, files)
        finally:
            f.close()

    async def _put(self, receive, send, req, q, who, key, signed, signing_key, rid, direct=None):
        tenant, h = who.principal.tenant_id, req.headers
        name = inbox.dataset_of(key)
        part = None
        if "uploadId" in q or "partNumber" in q:
            part = (inbox.upload_folder(self.ns, tenant, q.get("uploadId", ""), key),
                    inbox.part_number(q.get("partNumber", "")))
        if "x-amz-copy-source" in h:
            return await self._copy(send, req, who, key, part, rid)
        meta, condition = metadata.from_request(h), inbox.Condition.of(h)
        body = await upload.receive(receive, h, signed, signing_key, inbox.temp_path(self.ns, tenant), direct)
        if body is None:
            return  # the client went away: nothing was kept
        commit = part is None and key == f"{name}/{COMMIT}"

        def keep() -> tuple[str, dict]:  # in one call off the loop: the file finished, checked and put in place
            body.keep()
            tmp, etag, checksums = body.tmp, body.digests.md5.hexdigest(), body.digests.checksums()
            if checksums:
                meta[metadata.CHECKSUMS] = checksums
            try:
                if part is not None:
                    spec = inbox.upload_checksum(part[0])
                    if spec:
                        multipart_checksums.part_value(spec, checksums)
                    inbox.put_part(part[0], part[1], tmp, etag, checksums)
                elif commit:  # a device's "that is all": the inbox becomes the next version
                    tmp.unlink(missing_ok=True)
                else:
                    inbox.place(self.ns, tenant, key, tmp, etag, meta, condition)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return etag, checksums

        etag, checksums = await anyio.to_thread.run_sync(keep)
        if commit:
            self._commit_in_background(who, name)
        return await _send(send, 200, [(b"etag", f'"{etag}"'.encode()),
                                       *((k.encode(), v.encode()) for k, v in checksums.items())], b"", rid)

    async def _copy(self, send, req, who, key, part, rid):
        """CopyObject (``part`` None) or UploadPartCopy: the source's bytes (a range of them for a
        part) into the inbox, never a link to them."""
        h = req.headers
        source = request_key(h["x-amz-copy-source"].split("?", 1)[0]).lstrip("/")
        if self.prefix and source.startswith(self.prefix.lstrip("/") + "/"):
            source = source[len(self.prefix):]
        src_bucket, _, src_key = source.partition("/")
        if src_bucket not in BUCKETS or not src_key:
            raise S3Error("InvalidArgument", "x-amz-copy-source must be BUCKET/KEY of this endpoint")
        tenant = who.principal.tenant_id
        e, src_meta, _ = await anyio.to_thread.run_sync(self._object, tenant, src_bucket, src_key)
        _check_copy_source(h, f'"{self._etag_of(e)}"', datetime.fromtimestamp(int(e.mtime), UTC))
        first, last = (0, e.size - 1) if "x-amz-copy-source-range" not in h or part is None else \
            _range(h["x-amz-copy-source-range"], e.size, strict=True)
        replace = h.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE"
        if part is None and src_bucket == "inbox" and src_key == key and not replace:
            raise S3Error("InvalidRequest", "This copy request is illegal because it is trying to copy an object to "
                          "itself without changing the object's metadata: add x-amz-metadata-directive: REPLACE")
        meta = metadata.from_request(h) if replace else {k: v for k, v in src_meta.items() if k != metadata.PARTS}
        if metadata.CHECKSUMS in meta:  # the copy is one part: a composite (parts') checksum says nothing of it
            meta[metadata.CHECKSUMS] = {k: v for k, v in meta[metadata.CHECKSUMS].items()
                                        if k != "x-amz-checksum-type" and "-" not in v}

        def copy() -> tuple[str, float]:
            tmp = inbox.temp_file(self.ns, tenant)
            with open_object(e) as f, open(tmp, "wb") as out:
                digests = Digests(set())  # the ETag's MD5 only
                f.seek(first)
                left = last - first + 1
                for block in iter(lambda: f.read(min(BLOCK, left)) if left > 0 else b"", b""):
                    left -= len(block)
                    digests.update(block)
                    out.write(block)
            etag = digests.md5.hexdigest()
            if part is not None:
                inbox.put_part(part[0], part[1], tmp, etag)
            else:
                inbox.place(self.ns, tenant, key, tmp, etag, meta, inbox.Condition.of(h))
            return etag, time.time()

        etag, when = await anyio.to_thread.run_sync(copy)
        result = "CopyObjectResult" if part is None else "CopyPartResult"
        return await _xml(send, 200, xml.document(result, xml.element("LastModified", xml.iso(when))
                                                  + xml.element("ETag", f'"{etag}"')), rid)

    async def _list_parts(self, send, q, tenant, bucket, key, rid):
        folder = inbox.upload_folder(self.ns, tenant, q["uploadId"], key)
        have = await anyio.to_thread.run_sync(inbox.parts, folder)
        sums = {n: _checksum_xml(await anyio.to_thread.run_sync(inbox.part_checksums, folder, n)) for n, *_ in have}
        return await _xml(send, 200, listing.parts(bucket, key, q["uploadId"], have, sums), rid)

    def _commit_in_background(self, who, name: str) -> None:
        def run():
            try:
                inbox.commit(self.ctx.sessions, self.ns, who.principal, name, via=f"s3 by {who.key_id}")
            except Exception as exc:  # noqa: BLE001 - the files are back in the inbox; say why in the log
                log.warning("commit of the %s inbox (by a PUT of %s/.commit, key %s) failed: %s", name, name,
                            who.key_id, exc)

        threading.Thread(target=run, name=f"s3-commit-{name}", daemon=True).start()


async def _stream(send, f, block: bytes, length: int, files: bool = False) -> None:
    """``length`` bytes of ``f`` to the client, ``block`` (already read) first. With ``files``,
    the rest goes from the file to the socket (transport/zerocopy.py), not through Python."""
    left = length - len(block)
    if block:
        await send({"type": "http.response.body", "body": block, "more_body": left > 0})
    if left > 0:  # a file that shrank under us (an inbox object replaced) ends short: the client retries
        await zerocopy.send_file(send, f, f.tell(), left, zero_copy=files)


def _open_at(e: Entry, start: int, first: int):
    """The object's file open at ``start``, and its first ``first`` bytes (a small object's all)."""
    f = open_object(e)
    try:
        f.seek(start)
        return f, f.read(first)
    except BaseException:
        f.close()
        raise


_CONDITIONS = frozenset({"if-match", "if-none-match", "if-modified-since", "if-unmodified-since"})


class Router:
    """ASGI: /s3 and below to S3, the rest on to the app (before its routing, which would
    redirect a bare /s3 to /s3/, as no S3 client expects)."""

    def __init__(self, app, s3: S3App):
        self.app, self.s3 = app, s3

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and is_s3(scope.get("path", "")):
            return await self.s3(scope, receive, send)
        return await self.app(scope, receive, send)


def own_port_app(ctx) -> S3App:
    """S3 at the root, for a port of its own (server.serve runs it beside the API)."""
    return S3App(ctx, prefix="")


def install(app) -> S3App:
    """Serve S3 at /s3 of ``app`` (its ``state.ctx``: the server's context)."""
    s3 = S3App(app.state.ctx)
    inbox.recover(s3.ns, time.time())
    app.add_middleware(Router, s3=s3)
    return s3


async def _send(send, status: int, headers: list, body: bytes, rid: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode()), (b"x-amz-request-id",
                                                                                     rid.encode())]})
    await send({"type": "http.response.body", "body": body})


async def _xml(send, status: int, body: bytes, rid: str) -> None:
    await _send(send, status, [(b"content-type", b"application/xml")], body, rid)


async def _error(send, code: str, status: int, message: str, resource: str, rid: str, method: str) -> None:
    body = b"" if method == "HEAD" or status == 304 else xml.error(code, message, resource, rid)
    headers = [(b"content-type", b"application/xml"), (b"x-amz-error-code", code.encode())]
    if method in ("PUT", "POST"):  # a body we did not read must not be taken for the next request
        headers.append((b"connection", b"close"))
    try:
        await _send(send, status, headers, body, rid)
    except RuntimeError:  # the response had begun (a file that failed mid-way): nothing more can be said
        pass


async def _read_small(receive, limit: int) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise S3Error("IncompleteBody", "the client went away mid-request")
        body += message.get("body", b"")
        if len(body) > limit:
            raise S3Error("EntityTooLarge", f"this request's body may be at most {limit} bytes")
        if not message.get("more_body"):
            return bytes(body)


def _range(value: str, size: int, strict: bool = False) -> tuple[int, int]:
    """A Range header's first range within ``size``; ``strict`` (a copy's source range): both
    ends given and inside the object."""
    unit, _, spec = value.partition("=")
    first = spec.split(",")[0].strip()
    a, dash, b = first.partition("-")
    try:
        if unit.strip() != "bytes" or not dash or (strict and "," in spec):
            raise ValueError
        if strict and (a == "" or b == "" or int(a) > int(b)):
            raise S3Error("InvalidArgument", f"the copy source range {value!r} must be bytes=FIRST-LAST")
        if strict and int(b) >= size:
            raise S3Error("InvalidRange", f"the copy source range {value!r} is outside the source's {size} bytes")
        if a == "":
            n = int(b)
            start, end = max(0, size - n), size - 1
        else:
            start, end = int(a), min(int(b), size - 1) if b else size - 1
    except ValueError:
        raise S3Error("InvalidArgument" if strict else "InvalidRange",
                      f"the range {value!r} is not bytes=START-END") from None
    if start >= size or start > end:
        raise S3Error("InvalidRange", f"the requested range is not satisfiable (the object is {size} bytes)")
    return start, end


def _checksum_xml(sums: dict) -> str:
    """Kept checksum headers as S3's XML elements (x-amz-checksum-sha256 -> ChecksumSHA256)."""
    return "".join(xml.element("ChecksumType" if k == "x-amz-checksum-type" else
                               "Checksum" + k.removeprefix("x-amz-checksum-").upper(), v) for k, v in sums.items())


def _object_parts(meta: dict, h) -> str:
    """GetObjectAttributes' ObjectParts: a multipart object's parts (their sizes and checksums),
    a page of x-amz-max-parts after x-amz-part-number-marker."""
    sizes, sums = meta[metadata.PARTS], meta.get(metadata.PART_CHECKSUMS) or []
    algorithm = next((k.removeprefix("x-amz-checksum-").upper() for k in meta.get(metadata.CHECKSUMS) or {}
                      if k != "x-amz-checksum-type"), None)
    try:
        limit = max(0, min(1000, int(h.get("x-amz-max-parts", "1000"))))
        marker = max(0, int(h.get("x-amz-part-number-marker", "0")))
    except ValueError:
        raise S3Error("InvalidArgument", "x-amz-max-parts and x-amz-part-number-marker are numbers") from None
    numbers = list(range(marker + 1, len(sizes) + 1))[:limit]
    rows = "".join("<Part>" + xml.element("PartNumber", n) + xml.element("Size", sizes[n - 1])
                   + (xml.element(f"Checksum{algorithm}", sums[n - 1]) if algorithm and n <= len(sums) else "")
                   + "</Part>" for n in numbers)
    truncated = bool(numbers) and numbers[-1] < len(sizes)
    return ("<ObjectParts>" + xml.element("PartsCount", len(sizes)) + xml.element("PartNumberMarker", marker)
            + (xml.element("NextPartNumberMarker", numbers[-1]) if numbers else "")
            + xml.element("MaxParts", limit) + xml.element("IsTruncated", truncated) + rows + "</ObjectParts>")


def _check_copy_source(h, etag: str, modified: datetime) -> None:
    """A copy's conditions on its source (x-amz-copy-source-if-*), as GET's on an object."""
    failed = ("x-amz-copy-source-if-match" in h and etag not in etags_in(h["x-amz-copy-source-if-match"])) or \
        ("x-amz-copy-source-if-none-match" in h and etag in etags_in(h["x-amz-copy-source-if-none-match"])) or \
        ("x-amz-copy-source-if-unmodified-since" in h and _after(modified,
                                                                 h["x-amz-copy-source-if-unmodified-since"])) \
        or ("x-amz-copy-source-if-modified-since" in h and
            not _after(modified, h["x-amz-copy-source-if-modified-since"]))
    if failed:
        raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold "
                      "(x-amz-copy-source-if-*): nothing was copied")


def _after(modified: datetime, header: str) -> bool:
    try:
        return modified > parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return False

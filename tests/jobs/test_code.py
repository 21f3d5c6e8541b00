"""Code sent with jobs: kept per tenant by digest, checked before it is kept, unpacked safely."""

import hashlib
import io
import os
import tarfile

import pytest

from deeppod.errors import InvalidRequest, NotFound, TooLarge
from deeppod.jobs.code import CodeStore
from deeppod.sdk.code import pack  # how clients make them


def tgz(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> tuple[bytes, str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return raw, hashlib.sha256(raw).hexdigest()


def file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.fixture
def store(tmp_path):
    return CodeStore(tmp_path / "code", max_bytes=1 << 20, tenant_bytes=4 << 20)


def test_code_is_kept_per_tenant(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.py").write_text("1")
    p = pack(tmp_path / "p")
    store.put(1, p.digest, p.data)
    assert store.has(1, p.digest) and not store.has(2, p.digest)
    with pytest.raises(NotFound, match="send it with PUT /v1/code"):
        store.unpack(2, p.digest, tmp_path / "other")  # knowing a digest gives nothing of another tenant


@pytest.mark.parametrize("what,members,message", [
    ("a path out of the folder", [file("../evil.py")], "send only files"),
    ("an absolute path", [file("/etc/cron.d/evil")], "send only files"),
    ("a link out", [link("l", "/etc/shadow")], "send only files"),
    ("a hard link out", [link("h", "/etc/shadow", tarfile.LNKTYPE)], "send only files"),
    ("a device", [(lambda i: (setattr(i, "type", tarfile.CHRTYPE), (i, None))[1])(tarfile.TarInfo("dev"))],
     "send only files"),
])
def test_what_would_unpack_outside_is_refused_before_it_is_kept(store, what, members, message):
    raw, digest = tgz(members)
    with pytest.raises(InvalidRequest, match=message):
        store.put(1, digest, raw)
    assert not store.has(1, digest)


def test_bad_archives_get_a_clear_error(store, tmp_path):
    raw, digest = tgz([file("a.py")])
    with pytest.raises(InvalidRequest, match="SHA-256"):
        store.put(1, "0" * 64, raw)
    with pytest.raises(InvalidRequest, match="not a SHA-256"):
        store.put(1, "../../x", raw)
    junk = b"not gzip"
    with pytest.raises(InvalidRequest, match="not a readable tar.gz"):
        store.put(1, hashlib.sha256(junk).hexdigest(), junk)
    big = os.urandom((1 << 20) + 1)
    with pytest.raises(TooLarge, match="limit is 1 MiB"):
        store.put(1, hashlib.sha256(big).hexdigest(), big)
    bomb, bomb_digest = tgz([file("zeros", b"\0" * (5 << 20))])  # compresses well, unpacks past 4 x 1 MiB
    with pytest.raises(InvalidRequest, match="unpacked"):
        store.put(1, bomb_digest, bomb)


def test_a_tenant_keeps_at_most_its_share_least_recently_used_out(store, tmp_path):
    digests = []
    for i in range(6):  # 1 MiB of random bytes each, 4 MiB allowed
        raw, digest = tgz([file("w", os.urandom(900 << 10))])
        store.put(1, digest, raw)
        os.utime(store._path(1, digest), (1000 + i, 1000 + i))
        digests.append(digest)
    raw, digest = tgz([file("w", os.urandom(900 << 10))])
    store.put(1, digest, raw)
    kept = [d for d in digests if store.has(1, d)]
    assert store.has(1, digest) and digests[0] not in kept and len(kept) <= 3
    assert store.prune(older_than_s=60) == len(kept)  # the old ones (mtime 1970) go
    assert store.has(1, digest)

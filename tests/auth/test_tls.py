"""The server's certificate: self-signed once and reused, given files checked with a clear error."""

import pytest

from deeppod.auth import tls
from deeppod.errors import InvalidRequest


def test_self_signed_is_made_once_for_its_hosts_and_trusted_by_copy(tmp_path):
    cert, key, trust = tls.prepare(tmp_path, tls.SELF_SIGNED, "", "", ["127.0.0.1", "localhost", "node-1"])
    assert key.stat().st_mode & 0o777 == 0o600
    assert trust.read_bytes() == cert.read_bytes() and trust.stat().st_mode & 0o777 == 0o644
    made = cert.read_bytes()
    again, _, _ = tls.prepare(tmp_path, tls.SELF_SIGNED, "", "", ["localhost", "node-1", "127.0.0.1"])
    assert again.read_bytes() == made  # same hosts: reused
    other, _, _ = tls.prepare(tmp_path, tls.SELF_SIGNED, "", "", ["127.0.0.1", "node-2"])
    assert other.read_bytes() != made  # a new host: made again


def test_given_files_are_checked(tmp_path):
    with pytest.raises(InvalidRequest, match="needs --tls-key"):
        tls.prepare(tmp_path, str(tmp_path / "c.pem"), "", "", ["127.0.0.1"])
    with pytest.raises(InvalidRequest, match="cannot read"):
        tls.prepare(tmp_path, str(tmp_path / "c.pem"), str(tmp_path / "k.pem"), "", ["127.0.0.1"])
    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    with pytest.raises(InvalidRequest, match="not a PEM certificate"):
        tls.prepare(tmp_path, str(tmp_path / "c.pem"), str(tmp_path / "k.pem"), "", ["127.0.0.1"])
    cert, key, _ = tls.prepare(tmp_path / "made", tls.SELF_SIGNED, "", "", ["127.0.0.1"])
    # public CA: no trust file
    assert tls.prepare(tmp_path, str(cert), str(key), "", ["127.0.0.1"]) == (cert, key, None)

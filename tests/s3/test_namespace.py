"""A request's key as text: UTF-8 without control characters, checked segment by segment."""

import os

import pytest

from deeppod.errors import S3Error
from deeppod.s3.namespace import request_key, segments


def test_a_key_decodes_from_its_percent_escapes_and_its_raw_utf8_bytes():
    assert request_key("cats/a%20b%2Bc.png") == "cats/a b+c.png"
    assert request_key("chats/%C3%A9t%C3%A9.png") == "chats/été.png"
    # a header or path with UTF-8 not percent-encoded: ASGI hands its bytes over as latin-1
    assert request_key("chats/été.png".encode().decode("latin-1")) == "chats/été.png"
    assert request_key("") == ""


@pytest.mark.parametrize("sent", ["cats/%FF.png", "cats/%C3.png", "cats/%ED%A0%80", "cats/\xff.png"])
def test_a_key_that_is_not_utf8_is_refused_not_replaced(sent):
    """Before, every bad byte became U+FFFD, so %FE and %FF were one key, one file."""
    with pytest.raises(S3Error) as e:
        request_key(sent)
    assert (e.value.code, e.value.status) == ("InvalidURI", 400) and "UTF-8" in e.value.message


@pytest.mark.parametrize("sent", ["%C2%AE%C2%8A-", "cats/a%0Ab.png", "cats/a%00", "cats/%7F", "cats/a%09b"])
def test_a_key_with_a_control_character_is_refused(sent):
    """s3-tests' test_object_read_unreadable sends U+008A; a newline would split a file's name
    across lines of every listing and log that shows it."""
    with pytest.raises(S3Error) as e:
        request_key(sent)
    assert (e.value.code, e.value.status) == ("InvalidURI", 400) and "U+00" in e.value.message


def test_segments_refuse_control_characters_too():
    assert segments("cats/a b.png", inbox=True) == ["cats", "a b.png"]
    for key in ("cats/a\nb.png", "cats/\x85", "cats/\x00"):
        with pytest.raises(S3Error) as e:
            segments(key, inbox=True)
        assert e.value.code == "InvalidArgument" and "control" in e.value.message


def test_a_job_file_swapped_for_a_link_is_no_such_key_not_a_server_error(tmp_path, caplog):
    """Issue 70: a job that swaps a file of its outputs for a link between the lookup and the
    read made GETs answer 500 with a traceback in the server's log (ELOOP, uncaught)."""
    import logging

    from deeppod.s3.namespace import Entry, open_object

    out = tmp_path / "outputs"
    out.mkdir()
    (out / "real").write_bytes(b"42")
    (out / "swapped").symlink_to("/etc/hostname")
    os.mkfifo(out / "pipe")
    entry = Entry("7/outputs/real", 2, 0.0, None, out / "real", guarded=True)
    with open_object(entry) as f:
        assert f.read() == b"42"
    caplog.set_level(logging.INFO, logger="deeppod.s3.namespace")
    for name in ("swapped", "pipe", "gone"):
        with pytest.raises(S3Error) as e:
            open_object(Entry(f"7/outputs/{name}", 2, 0.0, None, out / name, guarded=True))
        assert e.value.code == "NoSuchKey" and e.value.status == 404, name
    assert len(caplog.records) == 3 and not any(r.exc_info for r in caplog.records)

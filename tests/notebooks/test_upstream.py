"""Reaching a notebook's server: its own socket in its own folder, or nothing (a link the job
planted, a socket of someone else's, a plain file are refused without being followed)."""

import os
import socket
import threading
from datetime import UTC, datetime, timedelta

import pytest

from deeppod.errors import Unavailable
from deeppod.notebooks import upstream
from deeppod.notebooks.upstream import SOCKET_NAME


@pytest.fixture
def listening(tmp_path):
    """A server on a socket named as a notebook's, in a folder (long past what a socket address holds)."""
    folder = tmp_path / ("x" * 100) / "code"
    folder.mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(folder)  # bound by a relative name, as Jupyter does: the path is too long for an address
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(SOCKET_NAME)
    finally:
        os.chdir(cwd)
    server.listen(4)

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"hello")
            conn.close()
    threading.Thread(target=answer, daemon=True).start()
    yield folder
    server.close()


def test_the_notebooks_own_socket_is_reached_through_a_path_too_long_for_an_address(listening):
    assert len(str(listening / SOCKET_NAME)) > 108
    with upstream.connect(str(listening), timeout=5) as s:
        assert s.recv(5) == b"hello"


def test_what_a_job_could_plant_there_is_refused_not_followed(listening, tmp_path):
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / SOCKET_NAME).symlink_to(listening / SOCKET_NAME)  # a link to a socket (the Docker daemon's, say)
    with pytest.raises(Unavailable, match="no socket of its own server"):
        upstream.connect(str(planted))
    (planted / SOCKET_NAME).unlink()
    (planted / SOCKET_NAME).write_text("not a socket")
    with pytest.raises(Unavailable, match="no socket of its own server"):
        upstream.connect(str(planted))
    link = tmp_path / "linked-folder"
    link.symlink_to(listening)  # the folder itself a link: not followed either
    with pytest.raises(Unavailable, match="folder is gone"):
        upstream.connect(str(link))
    with pytest.raises(Unavailable, match="not listening yet"):
        upstream.connect(str(tmp_path))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the socket to another identity needs root")
def test_a_socket_of_another_identity_in_the_folder_is_refused(listening):
    os.chown(listening / SOCKET_NAME, 54321, 54321, follow_symlinks=False)  # another tenant's, hard-linked in
    with pytest.raises(Unavailable, match="no socket of its own server"):
        upstream.connect(str(listening))


def test_activity_is_the_latest_kernel_or_terminal_and_a_busy_kernel_is_now(monkeypatch):
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    answers = {"api/kernels": [{"execution_state": "idle", "last_activity": "2026-12-07T11:40:00.000000Z"}],
               "api/terminals": [{"last_activity": "2026-12-07T11:50:00.000000Z"}]}
    monkeypatch.setattr(upstream, "get_json", lambda job_id, workdir, path: answers[path])
    assert upstream.last_activity(1, "/x", now) == now - timedelta(minutes=10)
    answers["api/kernels"].append({"execution_state": "busy", "last_activity": "2026-12-07T10:00:00Z"})
    assert upstream.last_activity(1, "/x", now) == now
    answers.update({"api/kernels": [], "api/terminals": []})
    assert upstream.last_activity(1, "/x", now) is None

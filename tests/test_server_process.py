"""The server process itself: it tells local clients where it is, and cleans up when stopped."""

import json
import signal


def test_the_server_announces_itself_and_forgets_on_sigterm(fresh_server):
    fresh_server.start()
    here = json.loads((fresh_server.home / "server.json").read_text())
    last = json.loads((fresh_server.home / "local-server.json").read_text())  # beside DEEPPOD_CONFIG
    assert here["url"] == fresh_server.url and here["pid"] == fresh_server.proc.pid == last["pid"]
    assert last["home"] == str(fresh_server.home)
    fresh_server.proc.send_signal(signal.SIGTERM)
    code = fresh_server.proc.wait(20)
    assert code in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
    assert not (fresh_server.home / "server.json").exists()
    assert not (fresh_server.home / "local-server.json").exists()

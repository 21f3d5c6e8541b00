"""The SDK with several server URLs (a failover control plane): the first that answers."""

import socket

import pytest

from deeppod import Client
from deeppod.errors import DeepPodError


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_client_moves_to_the_server_that_answers(live_server):
    dead = dead_url()
    c = Client(f"{dead}, {live_server.url}/", live_server.admin_token)
    assert c.urls == [dead, live_server.url]
    assert c.whoami()["user"] == "admin" and c.url == live_server.url
    assert c.nodes()  # and stays there
    with pytest.raises(DeepPodError, match="cannot reach the DeepPod server at .*" + dead.split("//")[1]) as info:
        Client(f"{dead},{dead_url()}", live_server.admin_token).whoami()
    assert info.value.code == "unreachable"


def test_an_administrator_sizes_a_cluster_from_the_sdk(live_server):
    c = Client(live_server.url, live_server.admin_token)
    got = c.size(images=1_281_167, epochs=90, hours=24, images_per_gpu=1200, users=4, runs_per_user_day=1)
    assert got["training_gpus"] >= 4 and got["nodes"] >= 1 and got["why"]
    with pytest.raises(DeepPodError) as e:
        c.size(images=10, epochs=0, hours=1, images_per_gpu=1)
    assert "epochs" in str(e.value)

"""The store's nodes made what the executor reports (cluster/service.py), on SQLite and PostgreSQL."""

from sqlalchemy import select

from deeppod.cluster.gpus import LogicalProbe
from deeppod.cluster.inventory import NodeInfo
from deeppod.cluster.service import sync_nodes
from deeppod.store.models import Node


def _info(name: str, healthy: bool = True, reason: str = "") -> NodeInfo:
    return NodeInfo(name, "10.0.0.7", 8, 16384, tuple(LogicalProbe(2).probe()), healthy=healthy, reason=reason)


def _up(sessions) -> dict[str, bool]:
    with sessions() as s:
        return {n.name: n.up for n in s.scalars(select(Node))}


def test_a_slurm_node_that_was_down_is_taken_back_when_slurm_says_it_is_up(sessions):
    with sessions.begin() as s:
        sync_nodes(s, [_info("gpu-01"), _info("gpu-02")], names_kept=True)
    with sessions.begin() as s:  # drained, or DOWN: not healthy in sinfo
        assert sync_nodes(s, [_info("gpu-01"), _info("gpu-02", healthy=False)], names_kept=True) == ["gpu-02"]
    assert _up(sessions) == {"gpu-01": True, "gpu-02": False}
    with sessions.begin() as s:  # resumed by its administrator: the same node
        assert sync_nodes(s, [_info("gpu-01"), _info("gpu-02")], names_kept=True) == []
    assert _up(sessions) == {"gpu-01": True, "gpu-02": True}


def test_a_ray_node_once_lost_stays_down(sessions):
    with sessions.begin() as s:
        sync_nodes(s, [_info("ray-a1")])
    with sessions.begin() as s:
        assert sync_nodes(s, []) == ["ray-a1"]
    with sessions.begin() as s:  # the same id seen again is not taken for a node that came back
        sync_nodes(s, [_info("ray-a1")])
    assert _up(sessions) == {"ray-a1": False}


def test_a_down_node_says_why_in_its_clusters_words_until_it_is_back(sessions):
    def why() -> dict[str, str | None]:
        with sessions() as s:
            return {n.name: n.down_reason for n in s.scalars(select(Node))}

    with sessions.begin() as s:
        sync_nodes(s, [_info("gpu-01"), _info("gpu-02")], names_kept=True)
    with sessions.begin() as s:
        sync_nodes(s, [_info("gpu-01"), _info("gpu-02", False, "drained in Slurm: fan failure")], names_kept=True)
    assert why() == {"gpu-01": None, "gpu-02": "drained in Slurm: fan failure"}
    with sessions.begin() as s:  # still down, and Slurm now says something else: the newest word
        sync_nodes(s, [_info("gpu-01"), _info("gpu-02", False, "down* in Slurm: Not responding")], names_kept=True)
    assert why() == {"gpu-01": None, "gpu-02": "down* in Slurm: Not responding"}
    with sessions.begin() as s:  # resumed: no reason left over
        sync_nodes(s, [_info("gpu-01"), _info("gpu-02")], names_kept=True)
    assert why() == {"gpu-01": None, "gpu-02": None} and _up(sessions) == {"gpu-01": True, "gpu-02": True}
    with sessions.begin() as s:  # one that is no longer reported at all has no reason to give
        sync_nodes(s, [_info("gpu-01")], names_kept=True)
    assert why() == {"gpu-01": None, "gpu-02": None} and _up(sessions)["gpu-02"] is False

"""Topology-aware GPU choice, one step at a time on fake topologies of real machines (DGX-1's
hybrid cube-mesh, an 8-GPU NVSwitch node, an 8-GPU PCIe box): a worker gets the tightest set
of the node's free GPUs, where taking the first free ones would cross a socket."""

from itertools import combinations

import pytest

from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.snapshot import NodeState
from deeppod.scheduler.topology import NODE, NV, PIX, SYS, Topology, describe, dgx1, nvswitch8, pcie_box, tightest


def test_nvidia_smis_matrix_is_read():
    t = Topology.parse([["X", "NV4", "SYS"], ["NV4", "X", "PIX"], ["SYS", "PIX", "X"]])
    assert t.span([0, 1]) == NV and t.span([1, 2]) == PIX and t.span([0, 1, 2]) == SYS
    with pytest.raises(ValueError):
        Topology.parse([["X", "FAST"], ["FAST", "X"]])


def test_dgx1_takes_a_fully_linked_quad_not_the_first_free_gpus():
    t = dgx1()
    assert tightest(list(range(8)), 4, t) == (0, 1, 2, 3)
    free = [0, 1, 4, 5, 6]
    assert t.span(free[:3]) == SYS  # the first three free cross the sockets
    assert tightest(free, 3, t) == (4, 5, 6) and t.span((4, 5, 6)) == NV
    assert describe(t, (4, 5, 6)) == "GPUs 4,5,6 over NVLink"


def test_a_pcie_box_keeps_a_pair_on_its_switch():
    t = pcie_box()
    free = [1, 2, 3, 5, 6]
    assert t.span(free[:2]) == NODE
    assert tightest(free, 2, t) == (2, 3) and t.span((2, 3)) == PIX


def test_the_choice_leaves_the_tightest_sets_for_the_next_worker():
    t = pcie_box()
    free = [0, 1, 2, 4, 5]
    # (0,1) and (4,5) are both on a switch; either leaves the other pair whole: the lower is taken
    assert tightest(free, 2, t) == (0, 1)
    t = dgx1()
    taken, free = [], list(range(8))
    for _ in range(4):  # four 2-GPU workers, each on an NVLinked pair
        pair = tightest(free, 2, t)
        taken.append(pair)
        free = [g for g in free if g not in pair]
    assert all(t.span(p) == NV for p in taken)


def test_a_large_node_is_searched_greedily_and_still_stays_in_one_nvlink_domain():
    two = Topology(tuple(tuple(0 if i == j else (NV if i // 8 == j // 8 else SYS) for j in range(16))
                         for i in range(16)))
    free = [1, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    chosen = tightest(free, 8, two)
    assert len(chosen) == 8 and two.span(chosen) == NV and set(chosen) == set(range(8, 16))


def test_without_a_topology_nothing_changes():
    assert tightest([3, 1, 2], 2, None) == (3, 1)
    assert tightest([0, 1, 2, 3], 2, nvswitch8()) == (0, 1)


def test_the_pool_places_workers_on_tight_sets_when_the_node_says_how_it_is_linked():
    linked = NodeState("dgx", free_gpus=(0, 1, 4, 5, 6), free_cpus=64, free_memory_mb=1 << 20, topology=dgx1())
    plain = NodeState("plain", free_gpus=(0, 1, 4, 5, 6), free_cpus=64, free_memory_mb=1 << 20)
    got = FreePool((linked,)).place(1, 3)
    assert got[0].gpus == (4, 5, 6)
    assert FreePool((plain,)).place(1, 3)[0].gpus == (0, 1, 4)
    two = FreePool((NodeState("box", free_gpus=tuple(range(8)), free_cpus=64, free_memory_mb=1 << 20,
                              topology=pcie_box()),)).place(4, 2)
    assert [w.gpus for w in two] == [(0, 1), (2, 3), (4, 5), (6, 7)]


@pytest.mark.parametrize("make", [dgx1, nvswitch8, pcie_box])
def test_the_chosen_set_is_the_tightest_there_is(make):
    t = make()
    free = [0, 2, 3, 5, 6, 7]
    for k in (2, 3, 4):
        best = min(t.span(c) for c in combinations(free, k))
        assert t.span(tightest(free, k, t)) == best


def test_of_equally_full_nodes_the_one_with_a_tighter_set_is_taken():
    spread = NodeState("a", free_gpus=(0, 2, 4, 6), free_cpus=64, free_memory_mb=1 << 20, topology=pcie_box())
    together = NodeState("b", free_gpus=(0, 1, 2, 3), free_cpus=64, free_memory_mb=1 << 20, topology=pcie_box())
    got = FreePool((spread, together)).place(1, 4)
    assert got[0].node == "b" and pcie_box().span(got[0].gpus) == NODE
    assert FreePool((spread, together)).place(1, 1)[0].node == "a"  # one GPU: no links to weigh


def test_the_start_says_how_its_gpus_are_linked():
    from deeppod.scheduler import schedule
    from deeppod.scheduler.plan import Plan
    from deeppod.scheduler.snapshot import PendingJob, Snapshot

    node = NodeState("dgx", free_gpus=(0, 1, 4, 5, 6), free_cpus=64, free_memory_mb=1 << 20, topology=dgx1())
    d = schedule(Snapshot(nodes=(node,), running=(), queued=(PendingJob(1, "a", 1, gpus_per_worker=3),),
                          plan=Plan(()), now=0.0))
    assert d.starts[0].placement[0].gpus == (4, 5, 6)
    assert d.starts[0].reason.endswith("; GPUs 4,5,6 over NVLink")

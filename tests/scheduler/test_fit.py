"""scheduler/fit.py: a job that can never start beside what is never preempted."""

from deeppod.scheduler.fit import Ask, Room, never_fits, workers_fitting


def test_a_replica_holding_a_cpu_for_good_leaves_room_for_one_worker_not_two():
    node = Room("local", gpus=0, cpus=2, memory_mb=8192, held_cpus=1)
    assert workers_fitting(node, Ask(2)) == 1
    why = never_fits(Ask(2), [node])
    assert why is not None
    assert "2 workers x (1 CPUs) must run at once" in why and "local: 1 of 2 CPUs" in why
    assert "only 1 such worker fits" in why and "scale a deployment down" in why
    assert never_fits(Ask(1), [node]) is None


def test_room_on_several_nodes_adds_up_and_each_resource_counts():
    a = Room("a", gpus=4, cpus=16, memory_mb=65536, held_gpus=3, held_cpus=3, held_memory_mb=4096)
    b = Room("b", gpus=4, cpus=16, memory_mb=65536)
    assert never_fits(Ask(5, gpus_per_worker=1, cpus_per_worker=2), [a, b]) is None  # 1 on a, 4 on b
    why = never_fits(Ask(6, gpus_per_worker=1, cpus_per_worker=2), [a, b])
    assert why is not None and "a: 3 of 4 GPUs, 3 of 16 CPUs, 4096 of 65536 MB" in why and "only 5 such workers" in why
    # memory binds: 40 GB workers, one per node
    assert never_fits(Ask(2, memory_mb_per_worker=40960), [a, b]) is None
    assert "only 1 such worker fits" in never_fits(Ask(2, memory_mb_per_worker=62000), [a, b])


def test_without_work_that_is_never_preempted_nothing_is_warned_of():
    """A job larger than the cluster itself is refused at submit: that is not this warning's business."""
    assert never_fits(Ask(9, cpus_per_worker=1), [Room("a", gpus=0, cpus=2, memory_mb=1024)]) is None

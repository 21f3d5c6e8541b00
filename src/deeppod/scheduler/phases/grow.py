"""Idle GPUs nobody queued can use grow elastic jobs toward their maximum (``Config.grow``)."""

from __future__ import annotations

from dataclasses import replace

from deeppod.scheduler.round_state import RoundState, slots
from deeppod.scheduler.snapshot import Resize


def enabled(st: RoundState) -> bool:
    return st.cfg.grow and st.pool.total_free > 0


def run(st: RoundState) -> None:
    tenants = st.tenants
    # the elastic ones among the jobs that may be stopped (the cache keeps them apart)
    elastic = (j for j in st.derived.elastic if id(j) in st.victim_ids) if st.derived is not None \
        else (j for t in st.victims for j in st.victims[t])
    growable = [j for j in elastic
                if j.id not in st.planned and j.max_workers > j.workers and j.gpus_per_worker
                and st.now - j.started_at >= st.cfg.resize_window(j.in_place)]
    growable.sort(key=lambda j: (st.share_used(j.tenant), j.id))
    for job in growable:
        extra = min(job.max_workers - job.workers, slots(st.avail(), job.gpus_per_worker),
                    slots(tenants.cap_room(job.tenant), job.gpus_per_worker))
        if job.gpu_memory_mb:  # only free GPUs with its memory are room for it
            extra = min(extra, slots(st.pool.free_with(job.gpu_memory_mb), job.gpus_per_worker))
        if extra < max(1, job.workers // 4):
            continue
        why = f"grow from {job.workers} to {job.workers + extra} workers into idle GPUs"
        if job.in_place:
            # the running workers stay where they are; the new ones go where GPUs are free
            w0 = job.placement[0]
            added = st.pool.place(extra, job.gpus_per_worker, w0.cpus, w0.memory_mb, gmem=job.gpu_memory_mb)
            if added is None:
                continue
            added = tuple(replace(w, rank=job.workers + i) for i, w in enumerate(added))
            st.out.resizes.append(Resize(job.id, job.workers + extra, why, True, added))
        else:
            trial = st.pool.copy()
            trial.release(job.placement)
            if trial.place(job.workers + extra, job.gpus_per_worker, gmem=job.gpu_memory_mb) is None:
                continue
            st.pool = trial
            st.out.resizes.append(Resize(job.id, job.workers + extra, why))
        tenants.add(job.tenant, extra * job.gpus_per_worker)

"""After health: the jobs later phases may shrink or preempt, and which of them borrow."""

from __future__ import annotations

from deeppod.scheduler.round_state import RoundState, borrowing_jobs


def run(st: RoundState) -> None:
    victims, ids, gone = st.victims, st.victim_ids, st.gone
    if st.derived is not None and st.derived.all_healthy:  # nothing gone: the cache's, as they are
        for t, jobs in st.derived.victims.items():
            victims[t] = jobs
        st.victim_ids = st.derived.victim_ids
        st.borrowers = st.derived.borrowers
        return
    for job in st.running:
        if job.preemptible and not job.stopping and job.id not in gone:
            victims[job.tenant].append(job)
            ids.add(id(job))
    st.borrowers = borrowing_jobs(st.running, st.tenants.guaranteed)

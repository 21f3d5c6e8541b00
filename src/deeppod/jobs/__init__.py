"""Jobs: the lifecycle service (submit, cancel, stop, resume, events, retention) and the
job controller, the scheduling loop that joins store, scheduler and executor."""

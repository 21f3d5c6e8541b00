"""Job lifecycle: submit, follow, cancel; the reconcile loop joining store, scheduler and executor."""

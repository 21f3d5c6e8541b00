"""Hyperparameter search experiments run as ordinary jobs (docs/tune.md)."""

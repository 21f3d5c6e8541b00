"""Built-in trainers: job programs written on ``deeppod.runtime`` (no user code needed)."""

"""Benchmarks users run from the CLI (``deeppod bench ...``); runs no server code."""

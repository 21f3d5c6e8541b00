"""The Python SDK: ``deeppod.Client``. The CLI is built on it."""

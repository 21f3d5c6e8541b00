"""Datasets: ingest with policies, immutable versions, manifests and training shards,
catalog and search, hot and cold tiers. The reading side lives in ``deeppod.runtime.data``."""

"""Inference service: replicas with dynamic batching, routing, rolling update and rollback."""

"""Tenants, users and bearer tokens (stored hashed)."""

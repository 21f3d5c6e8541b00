"""Fixtures the deployment files share."""

from tests.deployments.test_service import deployed  # noqa: F401 - a fixture, offered to every file here

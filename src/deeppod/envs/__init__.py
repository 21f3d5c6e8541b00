"""Per-job Python environments: a job's requirements, built once per tenant and node into a
virtual environment (uv, or venv and pip), cached, shared by the tenant's jobs with the same
spec, mounted read-only in their sandboxes (docs/jobs.md)."""

"""GPU and host samples over time, attributed to jobs and tenants; idle and faulty GPUs; the
cluster's Prometheus endpoint."""

"""A serving replica: the process that runs inside a deployment's job (``replica``), its
dynamic batching, request decoding and Prometheus metrics. Imports no server code; the
control-plane half (deployments, rollouts, routing) is ``deeppod.deployments``."""

"""Deployments, the control-plane half of serving: create, update, roll back, route
predict requests to replicas, and the controller that carries out the rollout policy.
Replicas run as jobs (``deeppod.serve.replica``)."""

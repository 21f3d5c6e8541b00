"""Cluster inventory: nodes, GPU slots (NVML when present, logical slots otherwise), health."""

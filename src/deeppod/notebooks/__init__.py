"""Notebooks: JupyterLab as a job of kind ``notebook`` in its tenant's sandbox, reached only
through the control plane (docs/notebooks.md)."""

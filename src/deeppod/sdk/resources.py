"""``client.NOUN``: one object per resource, named as the API names it. Calling it lists (what
``client.jobs()`` always did); its methods act on that resource, with one verb for one act
whatever the noun: ``client.jobs.stop(7)``, ``client.experiments.stop("lr-search")``,
``client.deployments.delete("digits")``. The flat names (``client.stop``,
``client.stop_experiment``) stay as aliases for one release."""

from __future__ import annotations

import functools
from collections.abc import Callable


def _verb(flat: Callable) -> Callable:
    """A resource's method that is the client's flat method ``flat`` (same signature, same doc)."""

    @functools.wraps(flat)
    def verb(self, *args, **kwargs):
        return flat(self._client, *args, **kwargs)

    return verb


class Resource:
    _list: Callable  # the client's listing of this noun

    def __init__(self, client) -> None:
        self._client = client

    def __call__(self, *args, **kwargs) -> list[dict]:
        return type(self)._list(self._client, *args, **kwargs)


def resources(client_class) -> dict[str, type[Resource]]:
    """The resource classes of ``client_class`` (deeppod.Client), by attribute name."""
    c = client_class

    def noun(name: str, listing: Callable, **verbs: Callable) -> type[Resource]:
        return type(name, (Resource,), {"_list": staticmethod(listing), "__doc__": f"client.{name.lower()}",
                                        **{v: _verb(f) for v, f in verbs.items()}})

    return {
        "jobs": noun("Jobs", c._list_jobs, get=c.job, submit=c.submit, cancel=c.cancel, stop=c.stop, resume=c.resume,
                     wait=c.wait, logs=c.logs, events=c.events, metrics=c.metrics, histograms=c.histograms,
                     gpus=c.job_gpus, usage=c.job_usage, spec=c.job_spec, remove_files=c.remove_job_files,
                     purge=c.purge_jobs),
        "datasets": noun("Datasets", c._list_datasets, get=c.dataset, ingest=c.ingest, update=c.update_dataset,
                         set_policy=c.set_data_policy, remove_version=c.remove_dataset_version, stage=c.stage,
                         manifest=c.manifest),
        "experiments": noun("Experiments", c._list_experiments, get=c.experiment, create=c.create_experiment,
                            stop=c.stop_experiment, resume=c.resume_experiment),
        "models": noun("Models", c._list_models, get=c.model, version=c.model_version, register=c.register_model,
                       remove=c.remove_model, set_alias=c.set_alias, compare=c.compare, comparison=c.comparison,
                       compare_and_wait=c.compare_and_wait, promote=c.promote),
        "deployments": noun("Deployments", c._list_deployments, get=c.deployment, create=c.deploy,
                            update=c.update_deployment, rollback=c.rollback, delete=c.delete_deployment,
                            create_key=c.create_deployment_key, keys=c.deployment_keys,
                            revoke_key=c.revoke_deployment_key, wait=c.wait_deployment, predict=c.predict,
                            direct=c.direct, direct_token=c.direct_token, revoke_direct=c.revoke_direct),
        "nodes": noun("Nodes", c._list_nodes, set_health=c.set_node_health, gpus=c.gpus, hosts=c.hosts,
                      burst=c.burst),
        "servers": noun("Servers", c._list_servers),
        "tenants": noun("Tenants", c._list_tenants, create=c.create_tenant),
        "users": noun("Users", c._list_users, create=c.create_user, set_role=c.set_role),
        "tokens": noun("Tokens", c._list_tokens, create=c.create_token, revoke=c.revoke_token),
    }

"""The key a deployment's direct tokens are signed with (derived from the server's key, stored
nowhere), and how its replicas are given it: in their job's sealed environment."""

from __future__ import annotations

from deeppod.contract import ENV_DEPLOYMENT_ID, ENV_DIRECT_KEY
from deeppod.store import sealed


def deployment_key(deployment_id: int) -> bytes:
    return sealed.derive(f"direct:{deployment_id}")


def replica_env(deployment_id: int) -> dict[str, str]:
    """What a replica needs to check its deployment's direct tokens (sealed with its job's env)."""
    return {ENV_DIRECT_KEY: deployment_key(deployment_id).hex(), ENV_DEPLOYMENT_ID: str(deployment_id)}

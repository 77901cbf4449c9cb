"""Registry credentials of an image's DockerAuth, from the user's secret store (as the user).

truss's DockerAuth names secrets; :func:`registry_login` turns them into (username, password) as
registries take them: ``REGISTRY_SECRET`` holds ``username:password``; ``GCP_SERVICE_ACCOUNT_JSON`` is
the ``_json_key`` user with the key as password (what Artifact Registry/GCR accept); ``AWS_IAM``
exchanges the user's AWS keys for an ECR token. Used at submit (pin) and by the staging job (mirror),
and on the node by slurm_bt/steps/registry_auth.py for runtimes that pull themselves.
"""

from __future__ import annotations

import base64
import re
from typing import TYPE_CHECKING

from slurm_bt.errors import Problem, SecretError

if TYPE_CHECKING:
    from slurm_bt.job_spec import DockerAuthSpec
    from slurm_bt.secrets_store import SecretStore

__all__ = ["auth_field", "registry_login"]


def auth_field(auth: DockerAuthSpec) -> str:
    """The config field whose secret is the credential (for "bad credentials" messages)."""
    return {"REGISTRY_SECRET": "job.image.docker_auth.registry_secret_docker_auth",
            "GCP_SERVICE_ACCOUNT_JSON": "job.image.docker_auth.gcp_service_account_json_docker_auth",
            "AWS_IAM": "job.image.docker_auth.aws_iam_docker_auth"}[auth.auth_method]


def registry_login(auth: DockerAuthSpec, store: SecretStore) -> tuple[str, str]:
    """(username, password) for ``auth.registry``."""
    names = dict(auth.secrets)
    if auth.auth_method == "REGISTRY_SECRET":
        value = store.get(names["secret_ref"])
        user, sep, password = value.partition(":")
        if not sep:
            raise SecretError("registry", [Problem(auth_field(auth),
                                                   f"secret {names['secret_ref']!r} must hold 'username:password'")])
        return user, password
    if auth.auth_method == "GCP_SERVICE_ACCOUNT_JSON":
        return "_json_key", store.get(names["service_account_json_secret_ref"])
    return _ecr_login(auth.registry, store.get(names["access_key_secret_ref"]),
                      store.get(names["secret_access_key_secret_ref"]))


def _ecr_login(registry: str, key_id: str, secret_key: str) -> tuple[str, str]:
    """Exchange AWS keys for an ECR token (boto3 is an optional extra, imported only here)."""
    import boto3

    match = re.search(r"\.ecr\.([a-z0-9-]+)\.amazonaws\.com", registry)
    region = match.group(1) if match else "us-east-1"
    client = boto3.client("ecr", region_name=region, aws_access_key_id=key_id,
                          aws_secret_access_key=secret_key)
    token = client.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    user, _, password = base64.b64decode(token).decode().partition(":")
    return user, password

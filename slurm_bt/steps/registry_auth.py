"""Registry credentials for private images, resolved on the node at run time (as the job user).

truss's DockerAuth names secrets; here they become what each container runtime reads:

* pyxis/enroot: a netrc-style ``$ENROOT_CONFIG_PATH/.credentials`` file (0600, in the job's 0700
  tmpfs runtime directory; the batch script points ``ENROOT_CONFIG_PATH`` at it);
* Apptainer: ``APPTAINER_DOCKER_USERNAME`` / ``APPTAINER_DOCKER_PASSWORD`` in the node's environment
  file, which the entry script unsets again inside the container.

Never in the script, a command line or the job's submit environment.
"""

from __future__ import annotations

import base64
import re

from slurm_bt.errors import Problem, SecretError
from slurm_bt.job_spec import JobSpec
from slurm_bt.secrets_store import SecretStore

__all__ = ["enroot_credentials", "registry_login"]


def registry_login(spec: JobSpec, store: SecretStore) -> tuple[str, str]:
    """(username, password) for ``spec.docker_auth.registry``."""
    auth = spec.docker_auth
    assert auth is not None
    names = dict(auth.secrets)
    if auth.auth_method == "REGISTRY_SECRET":
        value = store.get(names["secret_ref"])
        user, sep, password = value.partition(":")
        if not sep:
            raise SecretError("registry", [Problem("job.image.docker_auth.registry_secret_docker_auth",
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


def enroot_credentials(registry: str, user: str, password: str) -> bytes:
    """One netrc entry as enroot reads it (values may not contain whitespace in netrc)."""
    if re.search(r"\s", user + password + registry):
        raise SecretError("registry", [Problem("job.image.docker_auth",
                                               "registry credentials cannot contain whitespace for enroot")])
    return f"machine {registry} login {user} password {password}\n".encode()

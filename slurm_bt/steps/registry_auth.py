"""Registry credentials for private images, resolved on the node at run time (as the job user).

truss's DockerAuth names secrets; here they become what each container runtime reads:

* pyxis/enroot: a netrc-style ``$ENROOT_CONFIG_PATH/.credentials`` file (0600, in the job's 0700
  tmpfs runtime directory; the batch script points ``ENROOT_CONFIG_PATH`` at it);
* Apptainer: ``APPTAINER_DOCKER_USERNAME`` / ``APPTAINER_DOCKER_PASSWORD`` in the node's environment
  file, which the entry script unsets again inside the container.

Never in the script, a command line or the job's submit environment.
"""

from __future__ import annotations

import re

from slurm_bt.errors import Problem, SecretError
from slurm_bt.images.credentials import registry_login as _login
from slurm_bt.job_spec import JobSpec
from slurm_bt.secrets_store import SecretStore

__all__ = ["enroot_credentials", "registry_login"]


def registry_login(spec: JobSpec, store: SecretStore) -> tuple[str, str]:
    """(username, password) for ``spec.docker_auth.registry`` (slurm_bt/images/credentials.py)."""
    auth = spec.docker_auth
    assert auth is not None
    return _login(auth, store)


def enroot_credentials(registry: str, user: str, password: str) -> bytes:
    """One netrc entry as enroot reads it (values may not contain whitespace in netrc)."""
    if re.search(r"\s", user + password + registry):
        raise SecretError("registry", [Problem("job.image.docker_auth",
                                               "registry credentials cannot contain whitespace for enroot")])
    return f"machine {registry} login {user} password {password}\n".encode()

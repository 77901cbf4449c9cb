"""Step 1 of every job, on every node, as the job user: directories, secrets, the node's environment.

Why a separate step before the start commands: secrets must reach only the start commands' processes,
never the batch script's environment or anything Slurm stores. This step reads them from the user's
own secret store (as the user, on the node, at run time) and hands them to ``node_entry.sh`` through a
0600 file in a 0700 directory on tmpfs, which the entry script deletes as soon as it has read it.

It also creates the per-job directories the ``BT_*`` variables name. On clusters whose admins install
the slurm-bt prolog these already exist (root prepares team caches and scratch with the right owners);
creating them here, as the user, keeps jobs working on clusters without the hooks.

Before anything else it reads what the root prolog left for this job on this node
(:mod:`slurm_bt.posix.job_notes`): a ``prolog-error`` note makes this step exit 1 with the prolog's
reason, which is how a user-caused prolog problem fails the job without draining the node; the
``prolog.json`` record names the team group whose caches the prolog prepared. Without a prolog
(no notes at all) the step falls back to creating scratch and per-user caches itself, which needs a
world-writable sticky scratch root (docs/admin.md §Without the prolog).
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping
from pathlib import Path

from slurm_bt.atomic import make_private_dir, write_file_atomic
from slurm_bt.errors import BtError, PrologRefusedError, StorageError
from slurm_bt.job_spec import JobSpec, read_job_spec
from slurm_bt.node.job_paths import job_layout
from slurm_bt.posix.job_notes import read_hook_state
from slurm_bt.secrets_store import SecretStore
from slurm_bt.site.settings import expand_path, user_path
from slurm_bt.steps.registry_auth import enroot_credentials, registry_login
from slurm_bt.trusted_files import check_own_dir

__all__ = ["encode_env", "main", "node_environment", "prepare_node"]


def node_environment(spec: JobSpec, environ: Mapping[str, str], store: SecretStore,
                     team: str | None = None) -> list[tuple[str, str]]:
    """The per-node variables: layout paths, ranks, identity, then the resolved secrets (last)."""
    job_id = environ["SLURM_JOB_ID"]
    node_id = environ.get("SLURM_NODEID", "0")
    layout = job_layout(spec, job_id=job_id, node=environ.get("SLURMD_NODENAME"),
                        account=environ.get("SLURM_JOB_ACCOUNT"), team=team)
    pw = pwd.getpwuid(os.getuid())
    values = list(layout.env)
    values += [("BT_NODE_RANK", node_id), ("NODE_RANK", node_id)]
    # Identity defaults; a value the config sets explicitly wins (it is already in the environment).
    configured = {name for name, _ in spec.env}
    values += [(k, v) for k, v in (("HOME", pw.pw_dir), ("USER", pw.pw_name), ("LOGNAME", pw.pw_name))
               if k not in configured]
    values += [(key, store.get(name)) for key, name in spec.secret_env]
    # A pinned image is already on the node (the prolog staged it): registry credentials reach only the
    # staging job (docs/containers.md); an unpinned job.json still pulls on the node, as before.
    if spec.docker_auth is not None and spec.container_runtime == "apptainer" and spec.image_pin is None:
        user, password = registry_login(spec, store)
        values += [("APPTAINER_DOCKER_USERNAME", user), ("APPTAINER_DOCKER_PASSWORD", password)]
    return values


def encode_env(values: list[tuple[str, str]]) -> bytes:
    """NUL-terminated ``NAME=value`` records: read by bash with ``read -d ''``, never evaluated."""
    out = bytearray()
    for name, value in values:
        if "\0" in value:
            raise StorageError(name, "environment values cannot contain NUL bytes")
        out += f"{name}={value}".encode() + b"\0"
    return bytes(out)


def _team_from_prolog(node: str | None, job_id: str, state_root: str | None) -> str | None:
    """The prolog's verdict for this job here: raises its refusal, returns the team it prepared."""
    if not node:
        return None
    state = read_hook_state(node, job_id) if state_root is None else read_hook_state(node, job_id, state_root)
    if state.error is not None:
        raise PrologRefusedError(f"the slurm-bt prolog refused this job on node {node}: {state.error}")
    team = state.record.get("team") if state.record else None
    return team if isinstance(team, str) and team else None


def _make_scratch(scratch: Path) -> None:
    if not scratch.is_dir():
        try:
            scratch.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        if scratch.parent.is_dir() and not os.access(scratch.parent, os.W_OK):
            raise StorageError(str(scratch), "was not created by the slurm-bt prolog and its root is not "
                               "writable: the prolog did not run for this job on this node (ask an admin to "
                               "check Prolog= in slurm.conf and /var/log/slurm-bt/hooks.log)")
    make_private_dir(scratch)


def _make_user_runtime(path: Path) -> None:
    """``<runtime root>/slurm-bt-<uid>``: normally the prolog's (root-created, ours); adopt or create it.

    Without the prolog, another user may have created the name first in the world-writable runtime
    root (a squat); step 1 runs as the user and cannot remove it, so say who can.
    """
    try:
        make_private_dir(path)
    except StorageError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        if "owned by uid" not in reason and not reason.startswith("exists but"):
            raise
        raise StorageError(str(path), f"{reason}; someone else took this name first, so your jobs cannot use it "
                           "on this host: an admin must remove it (the slurm-bt prolog, when installed, moves "
                           "such entries aside by itself)") from None


def prepare_node(spec_path: Path, environ: Mapping[str, str], *, state_root: str | None = None) -> Path:
    """Create this node's directories and write its environment file. Returns the file's path.

    Raises:
        PrologRefusedError: the root prolog refused this job on this node (its reason is the message).
    """
    job_id = environ["SLURM_JOB_ID"]
    node = environ.get("SLURMD_NODENAME")
    team = _team_from_prolog(node, job_id, state_root)
    spec = read_job_spec(spec_path)
    layout = job_layout(spec, job_id=job_id, node=node, account=environ.get("SLURM_JOB_ACCOUNT"), team=team)
    cache_root = expand_path(spec.storage["cache"], user=spec.context.user, uid=spec.context.uid,
                             home=spec.context.home, node=node) + "/"
    for path in layout.make_dirs:
        p = Path(path)
        if path == layout.scratch:
            _make_scratch(p)
        elif path.startswith(cache_root):
            # Group bits let the prolog's default ACL share new cache dirs with the team; without
            # the prolog the umask (0077 in jobs) keeps them private.
            p.mkdir(parents=True, exist_ok=True, mode=0o770)
        else:
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
            check_own_dir(p)
    for link, target in layout.links:
        if not os.path.islink(link):
            os.symlink(target, link)
    if spec.checkpointing.enabled:  # a squatted file:// project name fails the job now, not after training
        from slurm_bt.checkpoints.store import check_upload_location

        check_upload_location(spec.storage["checkpoint_store"], spec.project_id, job_id,
                              account=team or environ.get("SLURM_JOB_ACCOUNT"))
    if spec.load_checkpoint.enabled or spec.load_checkpoint.resume:
        # Pinned at submit, or on a restart the job's own newest complete checkpoint (automatic
        # resume); verified by sha256 (docs/checkpoints.md).
        from slurm_bt.checkpoints.download import host_load_dir
        from slurm_bt.checkpoints.resume import resume_or_load

        load_dir = host_load_dir(spec, job_id, environ.get("SLURMD_NODENAME"))
        if load_dir is not None:
            resume_or_load(spec, environ, load_dir, account=team or environ.get("SLURM_JOB_ACCOUNT"))
    store = SecretStore(Path(user_path(spec.storage["secrets"])))
    runtime = Path(layout.runtime)
    _make_user_runtime(runtime.parent)
    make_private_dir(runtime)
    if spec.docker_auth is not None and spec.container_runtime == "pyxis" and spec.image_pin is None:
        make_private_dir(runtime / "enroot")
        user, password = registry_login(spec, store)
        write_file_atomic(runtime / "enroot" / ".credentials",
                          enroot_credentials(spec.docker_auth.registry, user, password), mode=0o600)
    # -- weights (slurm_bt.weights.node_stage): the prolog's node-cache snapshots, else the cluster
    # cache snapshot (no-prolog fallback); host jobs also get the bubblewrap argv file.
    # The image (docs/containers.md): the prolog staged it like weights; wait here if its node copy
    # still runs, and report its tier beside the weights' (weights/status-<node>.json).
    image_entries: list[dict[str, object]] = []
    if spec.image_pin is not None and spec.container_runtime != "none":
        from slurm_bt.weights.node_stage import prepare_job_image

        image_entries = [prepare_job_image(spec, environ)]
    weights_env: list[tuple[str, str]] = []
    if spec.weights:
        from slurm_bt.weights.node_stage import prepare_job_weights

        weights_env = prepare_job_weights(spec, environ, runtime_dir=str(runtime), workdir=layout.workdir,
                                          extra_status=image_entries).env
    elif image_entries:
        from slurm_bt.weights.delivery_report import write_node_status

        write_node_status(spec.context.job_dir, environ.get("SLURMD_NODENAME", "node"), image_entries)
    # -- end weights
    env_file = runtime / f"node-{environ.get('SLURM_NODEID', '0')}.env"
    write_file_atomic(env_file, encode_env(node_environment(spec, environ, store, team) + weights_env),
                      mode=0o600)
    return env_file


def main(argv: list[str] | None = None) -> int:
    """``python -I -m slurm_bt.steps.prepare JOB_JSON``: exit 1 with one line on any failure."""
    args = sys.argv[1:] if argv is None else argv
    node = os.environ.get("SLURMD_NODENAME", "?")
    if len(args) != 1:
        print("usage: python -m slurm_bt.steps.prepare JOB_JSON", file=sys.stderr)
        return 2
    try:
        prepare_node(Path(args[0]), os.environ)
    except BtError as exc:
        for line in exc.lines():
            print(f"slurm-bt prepare on {node}: {line}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:
        print(f"slurm-bt prepare on {node}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

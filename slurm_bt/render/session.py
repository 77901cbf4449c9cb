"""What an interactive session runs on a node of a running job (``slurm-bt ssh``). Pure: no I/O.

The shell is a new step of the job (``srun --overlap --pty``, :mod:`slurm_bt.slurm.srun`), so it
does not inherit the start commands' environment. Step 2's ``node_entry.sh`` saves that environment
(minus secrets and ``SLURM_*``) in ``<runtime>/node-<rank>.session`` when the config has an
``interactive_session`` (:func:`slurm_bt.render.batch_script.session_env_path`); the session script
below loads it, changes to the start commands' working directory and starts an interactive bash (or
runs one command). Where it runs:

* ``none``: on the host, like the start commands, and inside the same bubblewrap view of the
  weights when step 2 runs in one (weights read-only at their ``mount_location``);
* ``pyxis``: inside the job's running container when the site runs pyxis with ``container_scope=job``
  (site ``pyxis_container_scope_job``: step 2 is named ``bt-session-<job id>`` and pyxis's
  ``--container-name=NAME:exec`` enters its namespaces); otherwise in a new container of the job's
  image with the job's mounts (a named container would outlive the job under pyxis's default scope);
* ``apptainer``: in a new ``apptainer exec`` of the job's image with the job's bind mounts (apptainer
  has no "enter the running instance" for a plain ``exec``);
* ``charliecloud``: in a new ``ch-run`` of the node's copy of the job's image with the job's binds
  (ch-run containers have no name to join; a new one on the same squashfs and binds sees the same
  files, and the saved environment gives it the same variables).

With a pinned image (``image_pin``), every runtime starts the node's copy of the image that the
prolog staged for the job (``<node_cache>/jobs/<job id>/img/image.sqfs``), never the registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_bt.job_spec import JobSpec
from slurm_bt.node.job_paths import image_path, job_layout, runtime_dir
from slurm_bt.render.batch_script import (
    CH_IMAGE_ROOT,
    CH_RUN_PRELUDE,
    SESSION_CONTAINER_PREFIX,
    container_image_ref,
    session_env_path,
)

__all__ = ["SESSION_ENV_WAIT_S", "SESSION_SCRIPT", "SessionCommand", "session_command"]

# $1: the saved environment, $2: the working directory, $3: seconds to wait for $1 (a session opened
# as the job starts comes before step 2 has saved it), $4 (optional): one command for bash -c.
# Only names made of [A-Za-z0-9_] are exported, and never SLURM_*: the attach step has its own.
# Nothing but bash builtins: in a container this runs in the user's image, which may have no coreutils.
# The half-second wait is ``read -t`` on a pipe no one writes to (opened read-write, so it never
# reaches end of file), not ``sleep``.
SESSION_SCRIPT = r"""bt_env="$1"; bt_dir="$2"; bt_wait=$(( ${3:-0} * 2 ))
if [ ! -f "$bt_env" ] && [ "$bt_wait" -gt 0 ]; then
  echo "slurm-bt: waiting for the job's start commands to begin on this node (Ctrl-C to give up)" >&2
  while [ ! -f "$bt_env" ] && [ "$bt_wait" -gt 0 ]; do read -rt 0.5 <> <(:); bt_wait=$((bt_wait - 1)); done
fi
if [ -f "$bt_env" ] && [ -r "$bt_env" ]; then
  while IFS= read -r -d '' bt_kv; do
    case "${bt_kv%%=*}" in SLURM_*|''|*[!A-Za-z0-9_]*) ;; *) export "$bt_kv" ;; esac
  done < "$bt_env"
else
  echo "slurm-bt: the job's environment is not available on this node (its start commands have not" \
       "started here yet, or the config has no interactive_session): BT_* variables are not set" >&2
fi
cd -- "$bt_dir" 2>/dev/null || cd || true
bt_view=()  # a host job's bubblewrap weights view, when step 2 runs in one (batch_script.py)
if [ -f "${bt_env%.session}.session-bwrap" ]; then mapfile -d '' -t bt_view < "${bt_env%.session}.session-bwrap"; fi
if [ -n "${4:-}" ]; then
  bt_cmd="$4"; unset bt_env bt_dir bt_kv bt_wait; exec "${bt_view[@]}" /bin/bash -c "$bt_cmd"
fi
unset bt_env bt_dir bt_kv bt_wait
exec "${bt_view[@]}" /bin/bash -i
"""


SESSION_ENV_WAIT_S = 120
"""How long a session waits for step 2 to save the node's environment (step 1 may be staging checkpoints)."""


@dataclass(frozen=True)
class SessionCommand:
    """The node side of a session: srun container options, the command, the step's time limit, and
    variables srun itself needs (pyxis reads a private registry's credentials from ``ENROOT_CONFIG_PATH``)."""

    container_args: tuple[str, ...]
    command: tuple[str, ...]
    time_limit_min: int | None
    srun_env: tuple[tuple[str, str], ...] = ()


def session_command(spec: JobSpec, job_id: str, node: str, rank: int, command: str | None = None) -> SessionCommand:
    """What ``srun`` runs for a session on ``node`` (node ``rank`` of the job).

    ``timeout_minutes`` bounds an ``on_startup``/``on_demand`` shell (the step's ``--time``); an
    ``on_failure`` shell is bounded by the hold that keeps the job (docs/cli.md).
    """
    layout = job_layout(spec, job_id=job_id, node=node)
    env_file = session_env_path(spec, job_id, rank)
    # Only a job with a session saves its environment: waiting for it is pointless otherwise.
    wait_s = SESSION_ENV_WAIT_S if spec.interactive is not None else 0
    script = ["/bin/bash", "-c", SESSION_SCRIPT, "bt-session", env_file, layout.workdir, str(wait_s)]
    if command is not None:
        script.append(command)
    limit = None
    if spec.interactive is not None and spec.interactive.trigger != "on_failure":
        limit = spec.interactive.timeout_minutes
    if spec.container_runtime == "pyxis":
        workdir = f"--container-workdir={layout.workdir}"
        if spec.interactive is not None and spec.interactive.enter_container:
            return SessionCommand((f"--container-name={SESSION_CONTAINER_PREFIX}{job_id}:exec", workdir),
                                  tuple(script), limit)
        mounts = ",".join(f"{b.source}:{b.target}" + (":ro" if b.read_only else "") for b in layout.binds)
        pinned = spec.image_pin is not None
        args = [f"--container-image={image_path(spec, job_id, node) if pinned else container_image_ref(spec.image)}"]
        if mounts:
            args.append(f"--container-mounts={mounts}")
        # step 1 wrote the registry credentials there for step 2; they stay until the epilog
        env = ((("ENROOT_CONFIG_PATH", f"{runtime_dir(spec, job_id)}/enroot"),)
               if spec.docker_auth and not pinned else ())
        return SessionCommand((*args, workdir), tuple(script), limit, env)
    if spec.container_runtime == "apptainer":
        binds: list[str] = []
        for b in layout.binds:
            binds += ["--bind", f"{b.source}:{b.target}" + (":ro" if b.read_only else "")]
        image = image_path(spec, job_id, node) if spec.image_pin is not None else f"docker://{spec.image}"
        wrapped = ["apptainer", "exec", "--nv", *binds, "--pwd", layout.workdir, image, *script]
        return SessionCommand((), tuple(wrapped), limit)
    if spec.container_runtime == "charliecloud":
        ch_binds: list[str] = []
        for b in layout.binds:
            ch_binds += ["-b", f"{b.source}:{b.target}"]
        # The same ch-run choice as node_entry.sh (--write-fake when this Charliecloud has it, else the
        # image step 2 unpacked in the job's scratch); the image goes last, before the "--".
        launcher = "\n".join([
            'bt_img=$1; bt_root=$2; shift 2',
            CH_RUN_PRELUDE,
            'bt_args=(); while [ "$#" -gt 0 ] && [ "$1" != -- ]; do bt_args+=("$1"); shift; done',
            'exec "${bt_ch[@]}" "${bt_args[@]}" "$bt_img" "$@"',
        ])
        wrapped = ["/bin/bash", "-c", launcher, "bt-ch-run", image_path(spec, job_id, node),
                   f"{layout.scratch}/{CH_IMAGE_ROOT}", *ch_binds, "-c", layout.workdir, "--", *script]
        return SessionCommand((), tuple(wrapped), limit)
    return SessionCommand((), tuple(script), limit)

"""Render a JobSpec into the sbatch script and the per-node entry script. Pure: no I/O.

Shape of a job (see docs/architecture.md):

1. The batch script (stored by Slurm, shown by ``bt-sbatch --dry-run``) carries the ``#SBATCH``
   request, the non-secret job environment and two ``srun`` steps, one task per node each:
2. ``slurm_bt.steps.prepare`` on every node, as the job user: creates the job's directories, resolves
   secrets from the user's store and writes the node's environment to a 0600 NUL-separated file in a
   0700 tmpfs directory;
3. ``node_entry.sh`` on every node (inside the container when one is used): loads and deletes that
   file, then runs the start commands in order from the config snapshot.

So secret values never appear in the script, on a command line, in the job's submit environment, or in
the batch step's environment: only the start commands' processes receive them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from slurm_bt.job_spec import JobSpec
from slurm_bt.node.job_paths import BindMount, image_path, job_layout, runtime_dir
from slurm_bt.render.quoting import Var, sbatch_directive_value, shq, shq_concat

__all__ = [
    "CH_IMAGE_ROOT",
    "CH_RUN_PRELUDE",
    "ENTRY_NAME",
    "SESSION_CONTAINER_PREFIX",
    "SESSION_READY_SUFFIX",
    "charliecloud_argv_lines",
    "container_image_ref",
    "render_batch_script",
    "render_node_entry",
    "sbatch_directives",
    "session_env_path",
    "session_publisher",
]

ENTRY_NAME = "node_entry.sh"
_JOB = "\x00JOB\x00"  # placeholder for the job id while rendering; becomes "${SLURM_JOB_ID}"
# Placeholder for the node name in the per-node entry script; becomes "${SLURMD_NODENAME}", so that
# charliecloud's and apptainer's binds and image path may use the site's ``%n`` node-local roots.
_NODE = "\x00NODE\x00"
_BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def _word(value: str) -> str:
    """Quote a value that may contain the job-id or node-name placeholder."""
    parts: list[str | Var] = []
    for piece in re.split(f"({_JOB}|{_NODE})", value):
        if piece == _JOB:
            parts.append(Var("SLURM_JOB_ID"))
        elif piece == _NODE:
            parts.append(Var("SLURMD_NODENAME"))
        elif piece:
            parts.append(piece)
    return shq_concat(parts)


def _comment(text: str) -> str:
    """A comment line that cannot break out of the comment (control characters replaced)."""
    return "# " + re.sub(r"[\x00-\x1f\x7f]", "?", text)


def sbatch_directives(spec: JobSpec) -> list[str]:
    """The ``#SBATCH`` options of a job, in a stable order (without the ``#SBATCH`` prefix)."""
    opts = [
        f"--job-name={spec.slurm_job_name}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.cpus_per_task}",
        f"--mem={spec.mem_mib}M",
        f"--partition={spec.partition}",
    ]
    if spec.gpus_per_node:
        opts.append(f"--gres=gpu:{spec.gres_type}:{spec.gpus_per_node}")
    opts += [
        f"--chdir={spec.context.job_dir}",
        f"--output={spec.log_dir}/slurm-%j.out",
        "--open-mode=append",
        "--export=NONE",
        "--requeue" if spec.requeue else "--no-requeue",
        # The batch shell's time-limit warning (docs/long-runs.md); also what a preemption sends with
        # PreemptParameters=send_user_signal. Only a fallback for the watcher (steps/restart.py).
        f"--signal=B:USR2@{spec.restarts.stop_grace_s}",
        f"--comment=slurm-bt:{spec.context.submit_id}",
    ]
    return [sbatch_directive_value(o) for o in opts]


def container_image_ref(image: str) -> str:
    """Docker reference → enroot/pyxis form (``nvcr.io/nvidia/pytorch:24.01`` → ``nvcr.io#nvidia/pytorch:24.01``).

    enroot separates the registry from the path with ``#``; Docker Hub images stay as they are.
    """
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def _mounts_arg(binds: Sequence[BindMount], flag_style: str) -> list[str]:
    if flag_style == "pyxis":
        joined = ",".join(f"{b.source}:{b.target}" + (":ro" if b.read_only else "") for b in binds)
        return [_word(f"--container-mounts={joined}")] if joined else []
    out = []
    for b in binds:
        if flag_style == "charliecloud":
            # ch-run's -b has no read-only flag: weights are read-only by the node cache's permissions
            # (root-owned 0444 files in 0555 directories; slurm_bt/weights/cache_layout.py).
            out += ["-b", _word(f"{b.source}:{b.target}")]
        else:
            out += ["--bind", _word(f"{b.source}:{b.target}" + (":ro" if b.read_only else ""))]
    return out


def _pyxis_image(spec: JobSpec) -> str:
    """``--container-image``: the node's copy of the pinned squashfs (enroot accepts a squashfs file);
    a job.json from before images were pinned (no ``image_pin``) still names the registry image."""
    if spec.image_pin is not None:
        return _word(image_path(spec, _JOB, None))
    return shq(container_image_ref(spec.image))


def _env_lines(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [f"export {name}={shq(value)}" for name, value in pairs]


def render_batch_script(spec: JobSpec) -> str:
    """The complete sbatch script for ``spec`` (what ``--dry-run`` prints and what is submitted)."""
    ctx = spec.context
    layout = job_layout(spec, job_id=_JOB, node=None)
    python = shq(ctx.python)
    lines = [
        "#!/bin/bash",
        _comment(f"Generated by slurm-bt {ctx.version} from {ctx.config_path}: edit the config, not this file."),
        _comment(f"project {spec.project_name!r}, job {spec.job_name or '(unnamed)'!r}, "
                 f"submission {ctx.submit_id}"),
        # Where the CPU and memory request came from (a GPU job may get its GPUs' share; job_spec.py).
        *(_comment(note) for note in spec.resource_notes),
    ]
    lines += [f"#SBATCH {d}" for d in sbatch_directives(spec)]
    lines += [
        "",
        "set -euo pipefail",
        # First thing: Slurm's --signal=B:USR2 warning may come within the first second of a short run,
        # and an untrapped USR2 kills the batch shell (docs/long-runs.md).
        "bt_stop_asked=0",
        "trap 'bt_stop_asked=1' USR2",
        "umask 0077",
        f"export PATH={shq(_BASE_PATH)}",
        "",
        "# Job environment (literal values only).",
    ]
    lines += _env_lines([
        ("BT_TRAINING_PROJECT_NAME", spec.project_name),
        ("BT_TRAINING_PROJECT_ID", spec.project_id),
        ("BT_TRAINING_JOB_NAME", spec.job_name or spec.slurm_job_name),
        ("BT_NUM_GPUS", str(spec.gpus_per_node)),
    ])
    lines += [
        'export BT_TRAINING_JOB_ID="${SLURM_JOB_ID}"',
        'export BT_RETRY_COUNT="${SLURM_RESTART_COUNT:-0}"',
        'export BT_GROUP_SIZE="${SLURM_JOB_NUM_NODES}"',
        f'export BT_LEADER_ADDR="$({python} -I -m slurm_bt.steps.leader)"',
        'export MASTER_ADDR="${BT_LEADER_ADDR}"',
        f'export MASTER_PORT="$(({spec.master_port_base} + SLURM_JOB_ID % 10000))"',
        'export NNODES="${SLURM_JOB_NUM_NODES}"',
        f"export BT_JOB_SPEC={shq(spec.spec_path)}",
    ]
    if spec.env:
        lines += ["", "# environment_variables from the config."]
        lines += _env_lines(spec.env)
    if spec.secret_env or spec.docker_auth:
        lines += ["", "# Secrets, resolved on each node at run time from the user's secret store:"]
        lines += [_comment(f"  {key} <- secret {name!r}") for key, name in spec.secret_env]
        if spec.docker_auth:
            lines.append(_comment(f"  registry credentials for {spec.docker_auth.registry} "
                                  f"({spec.docker_auth.auth_method})"))
    if spec.weights:
        lines += ["", "# Weights (read-only at their mount locations):"]
        lines += [_comment(f"  {w.source} -> {w.mount_location}") for w in spec.weights]
    for warning in spec.warnings:
        lines.append(_comment(f"note: {warning}"))

    srun = ('srun --export=ALL --nodes="${SLURM_JOB_NUM_NODES}" --ntasks="${SLURM_JOB_NUM_NODES}" '
            "--ntasks-per-node=1 --kill-on-bad-exit=1")
    entry = shq(f"{ctx.job_dir}/{ENTRY_NAME}")
    node_log = shq(f"{spec.log_dir}/slurm-%j.node%n.out")
    lines += _restart_lines(spec, python)
    lines += [
        "",
        "# Step 1, every node: directories, secrets and the node's environment (as you, not root).",
        f"{srun} --job-name=bt-prepare {python} -I -m slurm_bt.steps.prepare {shq(spec.spec_path)}"
        # A restarted run whose step 1 fails is requeued again (steps/restart.py `prepare-failed`).
        ' || { bt_rc=$?; bt_restart prepare-failed "$bt_rc" || bt_rc=$?; exit "$bt_rc"; }',
    ]
    if spec.checkpointing.enabled:
        lines += _checkpoint_uploader_lines(spec, srun, python)
    if spec.container_runtime == "pyxis" and spec.interactive is not None:
        lines += _pyxis_session_publisher(spec, srun)
    lines += [
        "",
        "# Step 2, every node: the start commands, in order, from the config snapshot.",
    ]
    step = f"{srun} --job-name=bt-train --output={node_log}"
    # -- interactive sessions (slurm_bt/cli/isession_cmd.py): say how to attach, once it runs.
    if spec.interactive is not None and spec.interactive.trigger == "on_startup":
        lines += _session_notice("interactive session (on_startup)")
    # -- end interactive sessions
    if spec.container_runtime == "pyxis":
        if spec.docker_auth and spec.image_pin is None:
            lines.append(f"export ENROOT_CONFIG_PATH={_word(runtime_dir(spec, _JOB) + '/enroot')}")
        flags = [f"--container-image={_pyxis_image(spec)}"]
        if spec.interactive is not None and spec.interactive.enter_container:  # `slurm-bt ssh` enters it
            flags.append(_word(f"--container-name={SESSION_CONTAINER_PREFIX}{_JOB}"))
        flags += _mounts_arg(layout.binds, "pyxis")
        flags.append(f"--container-workdir={shq(layout.workdir)}")
        lines.append(" \\\n    ".join([step, *flags, f"/bin/bash {entry}"]))
    else:
        lines.append(f"{step} /bin/bash {entry}")
    lines[-1] += " &"
    lines += _supervise_lines(spec)
    if spec.container_runtime == "pyxis" and spec.interactive is not None:
        lines.append('kill "$bt_publisher" 2>/dev/null || true  # step 2 has ended: nothing left to publish')
    if spec.interactive is not None and spec.interactive.trigger == "on_failure":
        lines += _failure_hold(spec.interactive.timeout_minutes)
    lines += [
        "",
        "# The run is over: complete, fail, or requeue by cause (slurm_bt/steps/restart.py).",
        "bt_rc=0",
        'bt_restart after "$bt_train_rc" "$bt_stopped" || bt_rc=$?',
        'exit "$bt_rc"',
    ]
    return "\n".join(lines) + "\n"


# -- long runs (docs/long-runs.md): stop before the end, requeue by cause.
def _restart_lines(spec: JobSpec, python: str) -> list[str]:
    """Before step 1: the restart cap and the time-limit watcher.

    The USR2 trap (set first thing in the script) only sets a flag: bash runs it when ``wait``
    returns, and the supervising loop (:func:`_supervise_lines`) asks ``restart stop`` whether the
    warning is real.
    """
    return [
        "",
        f"# Long runs (docs/long-runs.md): SIG{spec.restarts.stop_signal} to the start commands "
        f"{spec.restarts.stop_grace_s} s before the time limit",
        f"# (or on preemption), then requeue: at most {spec.restarts.max_restarts} time(s) after a time "
        f"limit, preemption or node failure, {spec.restarts.retry_on_failure} after a failure.",
        f'bt_restart() {{ {python} -I -m slurm_bt.steps.restart "$1" {shq(spec.spec_path)} "${{@:2}}"; }}',
        "bt_restart begin",
        'bt_restart watch "$$" &',
        "bt_watcher=$!",
    ]


def _supervise_lines(spec: JobSpec) -> list[str]:
    """Wait for step 2; on the stop warning signal it; then ship the checkpoints it saved.

    ``wait`` returns early for a trapped signal, so the loop waits again until the step has ended;
    ``bt_train_rc`` is its exit status, ``bt_stopped`` says whether the stop signal was sent.
    """
    lines = [
        "bt_train=$!",
        "bt_train_rc=0",
        "bt_stopped=0",
        "while :; do",
        '  wait "$bt_train" || true',
        '  if [ "$bt_stop_asked" = 1 ]; then',
        "    bt_stop_asked=0",
        '    if [ "$bt_stopped" = 0 ] && bt_restart stop; then bt_stopped=1; fi',
        "  fi",
        '  kill -0 "$bt_train" 2>/dev/null || break',
        "done",
        'wait "$bt_train" || bt_train_rc=$?',
        'kill "$bt_watcher" 2>/dev/null || true',
    ]
    if spec.checkpointing.enabled:
        lines.append("bt_finish_checkpoints  # before any requeue: the next run resumes from what they saved")
    return lines
# -- end long runs


# -- interactive sessions: what the batch script says and does for InteractiveSession (docs/cli.md).
SESSION_CONTAINER_PREFIX = "bt-session-"
"""pyxis container name of a job's step 2 (``bt-session-<job id>``) when it has an interactive session."""


def _session_notice(what: str) -> list[str]:
    """Print the attach command into the job's batch log (``slurm-bt logs`` shows it as ``[batch]``)."""
    return [
        "# Interactive session: how to open a shell on a node of this job (printed into its log).",
        f'echo "slurm-bt: {what}: open a shell on a node of this job with '
        '\\`slurm-bt ssh ${SLURM_JOB_ID} --node RANK\\` or \\`slurm-bt train isession --job-id ${SLURM_JOB_ID} '
        '--node RANK\\` (RANK 0..$((SLURM_JOB_NUM_NODES - 1)), nodes ${SLURM_JOB_NODELIST})"',
    ]


def _pyxis_session_publisher(spec: JobSpec, srun: str) -> list[str]:
    """pyxis: a host step on every node renames the environment step 2 saves inside the image.

    pyxis starts step 2's tasks in the image, so no part of node_entry.sh runs on the host, and the
    image may have no ``mv`` (python:3.11-slim's has none): this overlapping step, outside the
    container, waits for the ready marker and publishes by rename (:func:`session_publisher`). It is
    stopped once step 2 has ended (``bt_publisher``).
    """
    return [
        "",
        "# Interactive session: step 2 saves its environment in the image, which may lack mv; this host",
        "# step on every node renames it into place for `slurm-bt ssh`.",
        # No --kill-on-bad-exit: a failed publish must not stop the job (sessions then say so).
        f"{srun.replace(' --kill-on-bad-exit=1', '')} --overlap --job-name=bt-session-env "
        f"/bin/bash -c {shq(session_publisher(_session_word(spec), None))} &",
        "bt_publisher=$!",
    ]


def _failure_hold(minutes: int) -> list[str]:
    """on_failure: keep the allocation ``minutes`` after the start commands failed, then end the run.

    ``sleep & wait`` rather than a foreground sleep so a trapped signal (scancel, the time limit's
    warning) is handled at once instead of after the whole hold. The run then ends through the
    restart helper like any failed run (not a bare ``exit``): it decides fail or retry and, on Slurm
    >= 25.11, clears the job's requeue flag before a final failure, without which 26.05 holds a failed
    ``--requeue=expedite`` job (REQUEUE_HOLD) instead of ending it FAILED (docs/slurm-releases.md).
    """
    return [
        'if [ "$bt_train_rc" -ne 0 ] && [ "${bt_stopped:-0}" = 0 ]; then',
        *("  " + line for line in _session_notice(
            f"the start commands failed (exit $bt_train_rc); interactive session (on_failure): "
            f"the allocation is kept for {minutes} min")),
        f"  sleep {minutes * 60} & wait $! || true",
        '  echo "slurm-bt: interactive session (on_failure) ended after '
        f'{minutes} min; the run ends as its start commands did (exit $bt_train_rc)"',
        "fi",
    ]
# -- end interactive sessions


def _checkpoint_uploader_lines(spec: JobSpec, srun: str, python: str) -> list[str]:
    """Start the checkpoint uploader on every node; on exit, tell it the start commands ended and wait.

    A separate, overlapping step (not a child of the entry script) so that it runs on the host for
    every container runtime; see ``slurm_bt.steps.checkpoint_agent``.
    """
    finish = _word(f"{spec.context.job_dir}/checkpoints.finish.{_JOB}")
    return [
        "",
        "# Checkpoint uploader, every node, in the background (as you): ships each completed checkpoint",
        "# in $BT_CHECKPOINT_DIR while the start commands run, and the rest once they have ended.",
        # No --kill-on-bad-exit: one node's uploader failing must not stop the others (or the job).
        # A requeued run has the same job id: the previous run's finish file must not stop this one.
        f"rm -f -- {finish}",
        f"{srun.replace(' --kill-on-bad-exit=1', '')} --overlap --job-name=bt-checkpoints "
        f"{python} -I -m slurm_bt.steps.checkpoint_agent "
        f"{shq(spec.spec_path)} &",
        "bt_uploader=$!",
        "bt_finish_checkpoints() {",
        '  [ -z "${bt_finished:-}" ] || return 0',
        "  bt_finished=1",
        f"  : > {finish}",
        '  wait "$bt_uploader" || echo "slurm-bt: some checkpoints were not uploaded; the epilog retries" >&2',
        "}",
        "trap bt_finish_checkpoints EXIT",
    ]


def render_node_entry(spec: JobSpec) -> str:
    """The per-node entry script: load the node's environment, then run the start commands."""
    # charliecloud and apptainer start here, on the node: their binds may use %n node-local roots.
    node = _NODE if spec.container_runtime in ("charliecloud", "apptainer") else None
    layout = job_layout(spec, job_id=_JOB, node=node)
    env_file = runtime_dir(spec, _JOB) + "/node-"
    entry = shq(f"{spec.context.job_dir}/{ENTRY_NAME}")
    lines = [
        "#!/bin/bash",
        _comment(f"slurm-bt per-node entry for project {spec.project_name!r}, "
                 f"submission {spec.context.submit_id}."),
        "# Runs on every node as the job user; loads the environment the prepare step wrote.",
        "set -uo pipefail",
        'if [ "${1:-}" != --in-container ]; then',
        f'  bt_env={_word(env_file)}"${{SLURM_NODEID}}.env"',
        *(_env_load_in_image_lines() if spec.container_runtime == "pyxis" else _env_load_host_lines()),
        "fi",
    ]
    if spec.container_runtime == "none" and spec.weights:
        # -- weights (slurm_bt.weights.node_stage): host jobs re-run this script under bubblewrap,
        # with each weights snapshot read-only at its mount_location for this job only; step 1
        # wrote the argv (NUL-separated) when bwrap is usable on this node.
        lines += [
            f'bt_wrap={_word(runtime_dir(spec, _JOB) + "/node-")}"${{SLURM_NODEID}}.bwrap"',
            'if [ "${1:-}" != --in-container ] && [ -f "$bt_wrap" ]; then',
            "  mapfile -d '' -t bt_argv < \"$bt_wrap\" && rm -f -- \"$bt_wrap\" || exit 1",
            *_session_bwrap_lines(spec),
            '  exec "${bt_argv[@]}"',
            "fi",
            "unset bt_wrap",
        ]
        # -- end weights
    if spec.container_runtime == "apptainer":
        binds = _mounts_arg(layout.binds, "apptainer")
        # apptainer runs a squashfs file directly: the node's copy of the pinned image, else (a
        # job.json from before images were pinned) the registry image.
        image = "\"$bt_img\"" if spec.image_pin is not None else shq(f"docker://{spec.image}")
        lines += [
            'if [ "${1:-}" != --in-container ]; then',
            *(_image_check_lines(spec, node) if spec.image_pin is not None else []),
            *_session_publisher_lines(spec),
            "  exec " + " ".join(["apptainer", "exec", "--nv", *binds, "--pwd", shq(layout.workdir),
                                  image, "/bin/bash", entry, "--in-container"]),
            "fi",
            "unset APPTAINER_DOCKER_USERNAME APPTAINER_DOCKER_PASSWORD",
        ]
    if spec.container_runtime == "charliecloud":
        lines += _charliecloud_lines(spec, layout.binds, layout.workdir, entry, node)
    if spec.interactive is not None:
        lines += _session_env_lines(spec)
    lines += [
        f"cd -- {shq(layout.workdir)} || exit 1",
        "set +u +o pipefail  # start commands run with ordinary shell semantics",
        "bt_commands=(",
    ]
    lines += [f"  {shq(cmd)}" for cmd in spec.start_commands]
    stop = spec.restarts.stop_signal
    lines += [
        ")",
        # The stop signal reaches every process of the step, this shell too (docs/long-runs.md): it
        # must outlive the command that is saving a checkpoint (its death would end the step and
        # kill the command), and then not start the next one. TERM too: a preemption sends it.
        "bt_stopping=0",
        f"trap 'bt_stopping=1' {' '.join(dict.fromkeys(['TERM', stop]))}",
        'for bt_cmd in "${bt_commands[@]}"; do',
        '  eval "$bt_cmd" || exit $?',
        '  [ "$bt_stopping" = 0 ] || exit 0',
        "done",
    ]
    return "\n".join(lines) + "\n"


def _env_load_host_lines() -> list[str]:
    """Load the node's environment file where this part runs on the host (none, charliecloud, apptainer)."""
    return [
        '  if [ ! -f "$bt_env" ]; then',
        '    echo "slurm-bt: $bt_env is missing: the prepare step did not finish on $(hostname)" >&2',
        "    exit 1",
        "  fi",
        "  # Unlink first, then read from the open descriptor: the file is gone whatever it holds.",
        '  exec 3< "$bt_env" && rm -f -- "$bt_env" || exit 1',
        "  while IFS= read -r -d '' bt_kv <&3; do export \"$bt_kv\"; done",
        "  exec 3<&-",
        "  unset bt_env bt_kv",
    ]


def _env_load_in_image_lines() -> list[str]:
    """Load the node's environment file with bash alone: pyxis starts this whole script in the image.

    The user's image may have no ``rm`` or ``hostname`` (a slim or distroless image), so the file is
    read whole and then emptied by a redirection (and unlinked only when the image has ``rm``): its
    secrets are gone from the tmpfs either way, and the epilog removes an empty file with the runtime
    directory. An empty file counts as missing, so an entry started twice on a node never runs
    without its environment.
    """
    return [
        '  if [ ! -s "$bt_env" ]; then',
        '    echo "slurm-bt: $bt_env is missing: the prepare step did not finish on ${SLURMD_NODENAME:-$HOSTNAME}" >&2',
        "    exit 1",
        "  fi",
        "  # Read it whole, then empty it by a redirection whatever the read did: the image may have no rm.",
        "  mapfile -d '' -t bt_kvs < \"$bt_env\"; bt_rc=$?",
        '  : > "$bt_env" && [ "$bt_rc" = 0 ] || exit 1',
        "  # Unlinked too where the image has rm; an emptied file is left to the epilog otherwise.",
        '  if command -v rm >/dev/null; then rm -f -- "$bt_env"; fi',
        '  for bt_kv in "${bt_kvs[@]}"; do export "$bt_kv"; done',
        "  unset bt_env bt_kv bt_kvs bt_rc",
    ]


def _image_check_lines(spec: JobSpec, node: str | None) -> list[str]:
    """Set ``bt_img`` to the node's copy of the job's image and fail clearly when it is not there."""
    return [
        f"  bt_img={_word(image_path(spec, _JOB, node))}",
        '  if [ ! -f "$bt_img" ]; then',
        '    echo "slurm-bt: the job\'s image $bt_img is not on $(hostname): the slurm-bt prolog did not stage it" >&2',
        "    exit 1",
        "  fi",
    ]


CH_IMAGE_ROOT = ".bt-image"
"""Where an older ch-run's image is unpacked, in the job's node-local scratch (see CH_RUN_PRELUDE)."""
CH_RUN_PRELUDE = """\
  if ch-run --feature=overlayfs >/dev/null 2>&1; then bt_ch=(ch-run --private-tmp --write-fake)
  else
    bt_ch=(ch-run --private-tmp -w)
    if [ ! -d "$bt_root" ]; then
      bt_tmp="$bt_root.$$"
      unsquashfs -no-progress -quiet -no-xattrs -d "$bt_tmp" "$bt_img" >/dev/null \\
        || { rm -rf -- "$bt_tmp"; echo "slurm-bt: cannot unpack $bt_img on $(hostname)" >&2; exit 1; }
      mv -T -- "$bt_tmp" "$bt_root" 2>/dev/null || rm -rf -- "$bt_tmp"  # a session unpacked it first
    fi
    bt_img=$bt_root
  fi
  if [ -n "${HOME:-}" ] && [ "$HOME" != / ] && [ -d "$HOME" ]; then bt_ch+=(-b "$HOME:$HOME"); fi"""
"""Choose how ch-run shows the image (``bt_img``: the node's squashfs; ``bt_root``: where to unpack it).

Bind targets the image lacks (/mnt/ckpts, /b10/workspace, a weights mount_location, the site's
roots) need mount points. Charliecloud >= 0.33 has ``--write-fake`` (a tmpfs overlay over the
read-only squashfs, unprivileged overlayfs): the squashfs is used as it is. Older releases (Debian 12
ships 0.31) cannot create a mount point in a read-only image, so the squashfs is unpacked once per
job and node into the job's node-local scratch (removed with it by the epilog) and run writable,
as enroot does for pyxis. It is unpacked under a temporary name and renamed into place, so step 2
and a ``slurm-bt ssh`` session starting at the same time never see (or remove) each other's
half-unpacked tree. The home directory is bound at its own path, first (the job dir is usually in
it), as apptainer does by default: tools that write to ``$HOME`` work as under the other runtimes;
ch-run's own ``--home`` would show it at /home/$USER instead.
``--private-tmp``: the job's /tmp is its own (as in a Baseten container), and a bind target under /tmp
(``load_checkpoint_config.download_folder`` defaults to /tmp/loaded_checkpoints) can be created there:
ch-run cannot create one inside the host's /tmp that it binds otherwise.
"""


def charliecloud_argv_lines(binds: Sequence[BindMount], workdir: str, image: str) -> list[str]:
    """``bt_ch+=(...)``: the rest of the ch-run argv, up to the ``--`` (shared with session.py)."""
    flags = [*_mounts_arg(binds, "charliecloud"), "-c", shq(workdir), image]
    return ["  bt_ch+=(" + " ".join(flags) + ")"]


def _charliecloud_lines(spec: JobSpec, binds: Sequence[BindMount], workdir: str, entry: str,
                        node: str | None) -> list[str]:
    """Re-run this script inside ``ch-run`` on the node's copy of the image (unprivileged, squashfuse).

    ch-run passes the environment through (the ``BT_*``, ``SLURM_*``, ``MASTER_*`` and config values
    loaded above, and ``CUDA_VISIBLE_DEVICES``); GPUs need the site's ``ch-fromhost --nvidia`` step on
    images that do not carry the driver libraries (docs/containers.md §Runtimes).
    """
    scratch = job_layout(spec, job_id=_JOB, node=node).scratch
    return [
        'if [ "${1:-}" != --in-container ]; then',
        *_image_check_lines(spec, node),
        f"  bt_root={_word(scratch + '/' + CH_IMAGE_ROOT)}",
        CH_RUN_PRELUDE,
        *charliecloud_argv_lines(binds, workdir, '"$bt_img"'),
        *_session_publisher_lines(spec),
        f'  exec "${{bt_ch[@]}}" -- /bin/bash {entry} --in-container',
        "fi",
    ]


def session_env_path(spec: JobSpec, job_id: str, rank: int | str) -> str:
    """Where node ``rank`` keeps its environment for ``slurm-bt ssh`` (tmpfs, 0600; the epilog removes it)."""
    return f"{runtime_dir(spec, job_id)}/node-{rank}.session"


def _session_bwrap_lines(spec: JobSpec) -> list[str]:
    """Keep the bubblewrap view's argv, minus its command, so a session sees the weights too.

    The argv ends ``--chdir <workdir> -- /bin/bash node_entry.sh --in-container``
    (slurm_bt/weights/job_view.py's ``bwrap_argv``); a session runs its own shell after the ``--``
    (slurm_bt/render/session.py). Paths only, no secrets; the epilog removes it with the runtime dir.
    """
    if spec.interactive is None:
        return []
    return [
        '  ( umask 077; printf \'%s\\0\' "${bt_argv[@]:0:${#bt_argv[@]}-3}" > "${bt_wrap%.bwrap}.session-bwrap" ) ||',
        '    echo "slurm-bt: could not save the weights view for interactive sessions" >&2',
    ]


SESSION_READY_SUFFIX = ".ready"
"""``<session file>.tmp`` is complete once ``<session file>.ready`` exists (container runtimes).

Inside the user's image nothing but bash may be assumed (no ``mv``: python:3.11-slim's ch-run view
has none, nor would a distroless image), so the image's side writes the temporary file and then this
empty marker, and a helper on the host, where coreutils exist, renames the file into place
(:func:`session_publisher`): a session never reads a half-written environment.
"""


def session_publisher(session: str, watch_pid: str | None) -> str:
    """One line of bash, for the host: publish the environment the image saved, by rename.

    ``session`` is a shell word naming ``node-<rank>.session``. The helper waits for the ready
    marker, then ``mv``s the temporary file into place. With ``watch_pid`` (the pid that becomes the
    container's shell) it also gives up when that process has ended, so it never outlives step 2.
    """
    alive = f'kill -0 {watch_pid} 2>/dev/null || exit 0; ' if watch_pid else ""
    return (f"bt_s={session}; "
            f'until [ -e "$bt_s{SESSION_READY_SUFFIX}" ]; do {alive}sleep 0.2; done; '
            f'mv -f -- "$bt_s.tmp" "$bt_s" && rm -f -- "$bt_s{SESSION_READY_SUFFIX}" || '
            'echo "slurm-bt: could not publish $bt_s for interactive sessions" >&2')


def _session_word(spec: JobSpec) -> str:
    """``node-"${SLURM_NODEID}.session"`` in the job's runtime directory, as one shell word."""
    return _word(session_env_path(spec, _JOB, "")[:-len(".session")]) + '"${SLURM_NODEID}.session"'


def _session_publisher_lines(spec: JobSpec) -> list[str]:
    """charliecloud and apptainer: start the host-side publisher before this script enters the image.

    A subshell forked here stays in the host's namespaces when the ``exec`` below turns this process
    into ch-run/apptainer and then the image's bash (the same pid, watched so that the helper ends
    with it). Its output goes nowhere but its one error line: it must not hold the step's stdout.
    """
    if spec.interactive is None:
        return []
    return [
        "  # Interactive session: the image may lack mv, so the host renames the environment it saves.",
        f"  ( {session_publisher(_session_word(spec), '$$')} ) </dev/null >/dev/null &",
    ]


def _session_env_lines(spec: JobSpec) -> list[str]:
    """Save the start commands' environment, minus secrets and the step's ``SLURM_*``, for sessions.

    An attached shell is a different step: it gets its own ``SLURM_*`` from srun, and loads these
    (``BT_*``, ``MASTER_*``, the config's literal variables) from this file. Secret values stay
    only in the start commands' processes, as docs/architecture.md promises, so they are left out.
    Pure bash (``compgen -e``, ``printf``, redirections): in a container this runs in the user's
    image, which need not have GNU ``env -0`` nor even ``mv``; there the file is published by the
    host-side helper (:data:`SESSION_READY_SUFFIX`), on the host (runtime ``none``) by ``mv`` here.
    """
    skip = [shq(key) for key, _ in spec.secret_env] + ["SLURM_*", "APPTAINER_DOCKER_*"]
    if spec.container_runtime == "none":
        publish = 'mv -f -- "$bt_session.tmp" "$bt_session"'
    else:
        publish = f': > "$bt_session{SESSION_READY_SUFFIX}"  # the host renames it (session_publisher)'
    return [
        "# Interactive session: this node's environment for `slurm-bt ssh` (secrets left out).",
        f"bt_session={_session_word(spec)}",
        "( umask 077",
        "  for bt_n in $(compgen -e); do",
        f'    case "$bt_n" in {"|".join(skip)}) ;; *) printf \'%s=%s\\0\' "$bt_n" "${{!bt_n}}" ;; esac',
        f'  done > "$bt_session.tmp" && {publish}',
        ') || echo "slurm-bt: could not save the environment for interactive sessions" >&2',
        "unset bt_session",
    ]

"""Submission (login node, as the user): config.py → validated spec → job directory → sbatch → record.

The steps run in an order that keeps the quality bar: everything that can be wrong with the user's
input is checked *before* anything is written (config, site, secrets, sbatch arguments); the job
directory is built under a temporary name and published with one rename; if sbatch then fails the
directory is removed again, so a failed submission leaves nothing behind.
"""

from __future__ import annotations

import datetime as _dt
import os
import pwd
import secrets as _random
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_bt.atomic import make_private_dir, publish_dir_atomic, write_file_atomic
from slurm_bt.errors import Problem, SecretError
from slurm_bt.job_spec import JobSpec, SubmitContext, build_job_spec, wants_node_sizes
from slurm_bt.records import SubmissionRecord, write_record
from slurm_bt.render.batch_script import ENTRY_NAME, render_batch_script, render_node_entry
from slurm_bt.render.sbatch_args import check_sbatch_args, sbatch_partition
from slurm_bt.secrets_store import SecretStore
from slurm_bt.site.settings import SiteSettings, load_site_settings, user_path
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.node_shapes import NodeSizes, read_node_sizes
from slurm_bt.slurm.runner import CommandRunner, SubprocessRunner
from slurm_bt.snapshot import snapshot_config_dir

if TYPE_CHECKING:
    from slurm_bt.compat.definitions import TrainingProject

__all__ = ["SubmitResult", "prepare_submission", "submit_config", "submit_project"]

# Pass-through sbatch options that would undo a guarantee slurm-bt makes.
@dataclass
class SubmitResult:
    """The outcome of one submission (``job_id`` is ``None`` for a dry run)."""

    spec: JobSpec
    script: str
    job_id: str | None = None
    record_path: str | None = None
    warnings: list[str] = field(default_factory=list)
    staging_job_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able summary (``bt-sbatch --json``)."""
        return {
            "job_id": self.job_id,
            "project_name": self.spec.project_name,
            "project_id": self.spec.project_id,
            "job_name": self.spec.job_name,
            "slurm_job_name": self.spec.slurm_job_name,
            "job_dir": self.spec.context.job_dir,
            "submit_id": self.spec.context.submit_id,
            "record": self.record_path,
            "staging_job_id": self.staging_job_id,
            "image": self.spec.image_pin.model_dump() if self.spec.image_pin is not None else None,
            "warnings": self.warnings,
        }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("slurm-bt")
    except PackageNotFoundError:
        return "0+unknown"


def prepare_submission(
    project: TrainingProject,
    *,
    config_path: Path,
    source: str,
    site: SiteSettings,
    now: _dt.datetime | None = None,
    nodes: NodeSizes | None = None,
) -> JobSpec:
    """Build the JobSpec for ``project`` as the current user would submit it (no I/O besides pwd).

    ``nodes``: the node sizes read from Slurm, for a GPU job sized by its GPUs' share.
    """
    pw = pwd.getpwuid(os.getuid())
    stamp = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    submit_id = f"{stamp}-{_random.token_hex(4)}"
    from slurm_bt.job_spec import slugify

    workspace = user_path(site.storage.workspace)
    job_dir = f"{workspace}/projects/{slugify(project.name, default='project')}/jobs/{submit_id}"
    ctx = SubmitContext(
        config_path=str(config_path), source=source, submit_id=submit_id, user=pw.pw_name,
        uid=pw.pw_uid, home=pw.pw_dir, job_dir=job_dir, python=site.python or sys.executable,
        version=_version(),
    )
    return build_job_spec(project, site, ctx, nodes=nodes)


def _check_secrets(spec: JobSpec, store: SecretStore) -> None:
    missing = store.missing(spec.secret_names())
    if missing:
        problems = [Problem("", f"secret {name!r} is referenced but not in your secret store "
                                f"(add it with: slurm-bt secrets set {name})") for name in missing]
        raise SecretError(spec.context.source, problems)


def _write_job_dir(spec: JobSpec, script: str, project: TrainingProject, site: SiteSettings,
                   warnings: list[str]) -> Path:
    final = Path(spec.context.job_dir)
    make_private_dir(final.parent, parents=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{spec.context.submit_id}-", dir=final.parent))
    try:
        info = snapshot_config_dir(Path(spec.context.config_path), project.job.workspace, tmp / "src",
                                   max_bytes=site.max_snapshot_bytes, max_files=site.max_snapshot_files)
        warnings.extend(f"snapshot: {w}" for w in info.warnings)
        (tmp / "logs").mkdir(mode=0o700)
        write_file_atomic(tmp / "job.json", spec.model_dump_json(indent=2).encode(), mode=0o600)
        write_file_atomic(tmp / "job.sbatch", script.encode(), mode=0o600)
        write_file_atomic(tmp / ENTRY_NAME, render_node_entry(spec).encode(), mode=0o700)
        publish_dir_atomic(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def submit_project(
    project: TrainingProject,
    *,
    config_path: Path,
    source: str,
    sbatch_args: Sequence[str] = (),
    dry_run: bool = False,
    site: SiteSettings | None = None,
    runner: CommandRunner | None = None,
    environ: Mapping[str, str] | None = None,
) -> SubmitResult:
    """Submit an already loaded project whose files live beside ``config_path``.

    ``dry_run`` makes every check a submission makes (config, sbatch arguments, checkpoints,
    secrets, weights sources, snapshot, workspace) and writes nothing; only what needs Slurm to
    accept the job is left out, and the result's last warning names it.
    """
    from slurm_bt.compat.loader import check_project

    site = site or load_site_settings(environ=environ)
    # A project built in code (push(project)) has not been through the loader: the same checks.
    project = check_project(project, source)
    check_sbatch_args(sbatch_args)
    nodes: NodeSizes | None = None
    if wants_node_sizes(project, site):  # a GPU job at truss's cpu/memory defaults: the GPUs' share
        # Read-only, so a dry run asks too (to show where each number comes from); a failure only
        # means the job is not sized to its GPUs, which the spec's warning says.
        nodes = read_node_sizes(SlurmClient(runner or SubprocessRunner(), environ=environ),
                                partition=sbatch_partition(sbatch_args))
    spec = prepare_submission(project, config_path=config_path, source=source, site=site, nodes=nodes)
    team: str | None = None
    if spec.load_checkpoint.enabled:  # pin LoadCheckpointConfig now: "latest" moves (docs/checkpoints.md)
        from slurm_bt.checkpoints.resolve import resolve_load_checkpoints

        # A project name belongs to a team: from_latest_checkpoint(project_name=...) means the project of
        # the team the job runs for, the one the prolog resolves on the nodes (and the weights cache's).
        team = _submit_team(sbatch_args, dry_run=dry_run)
        spec = resolve_load_checkpoints(spec, workspace=user_path(site.storage.workspace), team=team)
    store = SecretStore(Path(user_path(site.storage.secrets)))
    _check_secrets(spec, store)
    # -- images: pin the image to its platform manifest digest now (as the user, with its DockerAuth);
    # unknown image/tag or refused credentials fail here with exit 2, an unreachable registry with 1
    # (docs/containers.md). Before rendering, so the script and job.json carry the pin.
    if spec.container_runtime != "none":
        from slurm_bt.images.pin import pin_image

        spec = spec.model_copy(update={"image_pin": pin_image(spec, site, store)})
    # -- end images
    script = render_batch_script(spec)
    result = SubmitResult(spec=spec, script=script, warnings=list(spec.warnings))
    if dry_run:
        _dry_run_checks(spec, project, site, store, sbatch_args, result)
        return result
    # -- weights (slurm_bt.weights.plan): pin every source now (listings only); a bad source fails
    # the submission here with exit 2 naming job.weights[i].source.
    weights_plan = None
    if team is None and (spec.weights or spec.image_pin is not None):
        team = _submit_team(sbatch_args, dry_run=False)
    if spec.weights:
        from slurm_bt.weights.plan import plan_weights

        assert team is not None
        weights_plan = plan_weights(spec, site, store, team=team)
    # -- end weights
    pw = pwd.getpwuid(os.getuid())
    workspace = Path(user_path(site.storage.workspace))
    job_dir = _write_job_dir(spec, script, project, site, result.warnings)
    client = SlurmClient(runner or SubprocessRunner())
    sub_env = os.environ if environ is None else environ
    staging_id: str | None = None
    try:
        extra = list(sbatch_args)
        # -- weights: the staging job first (held); the training job waits for it (afterok) and is
        # killed by Slurm if staging fails. Nothing is staged when every source is already cached.
        # The image rides the same staging job: mirrored unless a trusted pin record says it is cached.
        image_staging = False
        if spec.image_pin is not None:
            from slurm_bt.images.stage import plan_image_delivery

            assert team is not None
            image_staging = plan_image_delivery(spec, site, team, job_dir)
        if weights_plan is not None or image_staging:
            from slurm_bt.weights.plan import submit_staging_job

            staging_id = submit_staging_job(client, spec, site, weights_plan, job_dir, sub_env,
                                            image_staging=image_staging)
            if staging_id is not None:
                extra += [f"--dependency=afterok:{staging_id}", "--kill-on-invalid-dep=yes"]
        if weights_plan is not None:
            # Favour nodes whose node cache already holds these weights (soft: slurm_bt/weights/placement.py).
            from slurm_bt.weights.placement import prefer_args

            extra += prefer_args(client, weights_plan, site, spec.partition, sbatch_args)
        # -- end weights
        # Long runs: a requeued run starts again at once where Slurm offers it (docs/long-runs.md).
        from slurm_bt.slurm.jobctl import expedite_args

        extra += expedite_args(client, spec.requeue, sbatch_args)
        job_id = client.submit(script, extra, env=sub_env)
        if staging_id is not None:
            from slurm_bt.weights.plan import release_staging_job

            try:
                release_staging_job(client, staging_id, sub_env)
            except BaseException:
                client.cancel(job_id)
                raise
    except BaseException:
        if staging_id is not None:
            client.cancel(staging_id)
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    record = SubmissionRecord(
        job_id=job_id, project_name=spec.project_name, project_id=spec.project_id,
        job_name=spec.job_name, submit_id=spec.context.submit_id, job_dir=str(job_dir),
        config_path=str(config_path), submitted_at=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        user=pw.pw_name, staging_job_id=staging_id, weights_sources=len(spec.weights),
    )
    result.job_id = job_id
    result.staging_job_id = staging_id
    result.record_path = str(write_record(workspace, record))
    return result


def _submit_team(sbatch_args: Sequence[str], *, dry_run: bool) -> str:
    """The slug of the team the job runs for (``weights.plan.team_for_user``).

    A dry run does not ask Slurm for the default account (``sacctmgr``): without ``--account`` it
    uses the user's primary group, as :func:`_dry_run_checks` says for weights.
    """
    from slurm_bt.weights.plan import team_for_user

    if not dry_run:
        return team_for_user(sbatch_args)
    return team_for_user(sbatch_args, account_lookup=lambda: None)


def _dry_run_checks(spec: JobSpec, project: TrainingProject, site: SiteSettings, store: SecretStore,
                    sbatch_args: Sequence[str], result: SubmitResult) -> None:
    """The checks of :func:`submit_project` after the secrets, without writing or submitting.

    Weights sources are pinned (listings, as a submit does) and the snapshot is walked with its size
    and file checks but not copied. What needs Slurm is named in the last warning instead.
    """
    from slurm_bt.snapshot import check_snapshot

    skipped = ["whether Slurm accepts the job (sbatch: partition, account, QOS, limits)"]
    if spec.weights:
        from slurm_bt.weights.plan import plan_weights, team_for_user

        asked: list[bool] = []

        def no_account_lookup() -> str | None:  # sacctmgr is Slurm: not asked in a dry run
            asked.append(True)
            return None

        plan = plan_weights(spec, site, store, team=team_for_user(sbatch_args, account_lookup=no_account_lookup))
        if asked:
            skipped.append(f"your default Slurm account for the weights cache team (used team {plan.team!r}; "
                           "pass --account to choose)")
        if plan.needs_staging:
            skipped.append("submitting the weights staging job")
    info = check_snapshot(Path(spec.context.config_path), project.job.workspace, max_bytes=site.max_snapshot_bytes,
                          max_files=site.max_snapshot_files)
    result.warnings.extend(f"snapshot: {w}" for w in info.warnings)
    problem = _workspace_problem(Path(spec.context.job_dir).parent)
    if problem is not None:
        from slurm_bt.errors import StorageError

        raise StorageError(str(Path(spec.context.job_dir).parent), problem)
    result.warnings.append(f"dry run: checked the config, secrets, {len(spec.weights)} weights source(s) and the "
                           f"snapshot ({info.files} files); not checked: {'; '.join(skipped)}")


def _workspace_problem(job_parent: Path) -> str | None:
    """Why the job directory could not be created under ``job_parent``, or None (a dry run's check)."""
    existing = job_parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by you"
    return None


def submit_config(
    config: str | os.PathLike[str],
    *,
    sbatch_args: Sequence[str] = (),
    dry_run: bool = False,
    site: SiteSettings | None = None,
    runner: CommandRunner | None = None,
    environ: Mapping[str, str] | None = None,
) -> SubmitResult:
    """Load ``config`` (a config.py path) and submit it. Raises the slurm_bt error tree.

    The config runs in a child process bounded by the site's ``[submit]`` settings: this is the
    shared login node, and a config.py is arbitrary code (compat/bounded.py).
    """
    from slurm_bt.compat.bounded import load_training_project_bounded

    site = site or load_site_settings(environ=environ)
    source = os.fspath(config)
    project = load_training_project_bounded(config, timeout_s=site.submit.config_load_timeout_s,
                                            memory_bytes=site.submit.config_load_memory_bytes)
    return submit_project(project, config_path=Path(source).resolve(), source=source,
                          sbatch_args=sbatch_args, dry_run=dry_run, site=site, runner=runner,
                          environ=environ)

"""The weights staging job's step (staging partition, CPU, as the user).

``python -I -m slurm_bt.steps.stage_weights JOB_DIR`` is what the staging script that ``bt-sbatch``
submits before the training job runs (:func:`slurm_bt.weights.plan.render_staging_script`); the
work is :func:`slurm_bt.weights.stage_job.stage_plan` (docs/weights-cache.md), then the job's image
(:func:`slurm_bt.images.stage.stage_image`, docs/containers.md).
Exit 0 when every source is in the cluster cache, 1 with one reason line per problem otherwise, 2 on
bad usage.

Every file of the job directory read here (``job.json``, ``weights/plan.json``, ``image/plan.json``) is
the user's and may have been swapped after submit: each is read through
:mod:`slurm_bt.posix.user_files` (a FIFO, device or user symlink is refused without being opened,
the size is capped), so a ``job.json`` linked to ``/dev/zero`` fails this job at once with one line
instead of filling the host's memory, and a FIFO does not hold it for its whole time limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from slurm_bt.errors import BtError, StorageError
from slurm_bt.images.stage import stage_image
from slurm_bt.job_spec import JobSpec, read_job_spec
from slurm_bt.posix.user_files import UnsafeFile
from slurm_bt.weights.plan import PLAN_NAME
from slurm_bt.weights.stage_job import stage_plan

__all__ = ["main"]


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    logging.basicConfig(level=logging.WARNING, format="slurm-bt staging: %(message)s", stream=sys.stdout)
    yield


def _read_spec(job_dir: Path) -> JobSpec:
    """``<job_dir>/job.json``, read once for both parts (bounded: :func:`slurm_bt.job_spec.read_job_spec`).

    Raises:
        StorageError: one line naming the file and what is wrong with it.
    """
    path = job_dir / "job.json"
    try:
        return read_job_spec(path)
    except UnsafeFile as exc:
        raise StorageError(exc.path, exc.reason) from None
    except ValidationError as exc:  # pydantic's own text spans many lines
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(file)"
        raise StorageError(str(path), f"is not a valid slurm-bt job spec ({exc.error_count()} problem(s), first: "
                           f"{loc}: {first['msg']}); resubmit with bt-sbatch") from None
    except OSError as exc:
        raise StorageError(str(path), exc.strerror or str(exc)) from None


def _reason(exc: OSError | ValueError) -> str:
    """One line for a failure outside the error tree: a refused user file names the file and why."""
    if isinstance(exc, UnsafeFile):
        return f"{exc.path}: {exc.reason}"
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 0 when every source is in the cluster cache, 1 with one reason line otherwise."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m slurm_bt.steps.stage_weights JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(os.path.abspath(args[0]))  # the bounded reader walks absolute paths only
    with _quiet_logging():
        try:
            spec = _read_spec(job_dir)
        except StorageError as exc:
            for line in exc.lines():
                print(f"slurm-bt staging failed: {line}", file=sys.stderr, flush=True)
            return 1
        try:
            # lexists: a job with an image only has no weights plan, but a plan.json swapped for a FIFO
            # or a link is refused by the reader (with its reason), never silently skipped.
            if os.path.lexists(job_dir / "weights" / PLAN_NAME):
                stage_plan(job_dir, spec=spec)
        except BtError as exc:
            where = f"job.weights[{getattr(exc, 'weights_index', '?')}].source: "
            for line in exc.lines():
                print(f"slurm-bt staging failed: {where}{line}", file=sys.stderr, flush=True)
            return 1
        except (OSError, ValueError) as exc:
            print(f"slurm-bt staging failed: {_reason(exc)}", file=sys.stderr, flush=True)
            return 1
        # The job's image (slurm_bt/images/stage.py): mirrored into the cluster cache when not cached.
        try:
            stage_image(job_dir, spec=spec)
        except BtError as exc:
            for line in exc.lines():
                print(f"slurm-bt staging failed: job.image.base_image: {line}", file=sys.stderr, flush=True)
            return 1
        except (OSError, ValueError) as exc:
            print(f"slurm-bt staging failed: job.image.base_image: {_reason(exc)}", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

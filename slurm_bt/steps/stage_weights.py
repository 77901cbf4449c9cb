"""The weights staging job's step (staging partition, CPU, as the user).

``python -I -m slurm_bt.steps.stage_weights JOB_DIR`` is what the staging script that ``bt-sbatch``
submits before the training job runs (:func:`slurm_bt.weights.plan.render_staging_script`); the
work is :func:`slurm_bt.weights.stage_job.stage_plan` (docs/weights-cache.md), then the job's image
(:func:`slurm_bt.images.stage.stage_image`, docs/containers.md).
Exit 0 when every source is in the cluster cache, 1 with one reason line per problem otherwise, 2 on
bad usage.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from slurm_bt.errors import BtError
from slurm_bt.images.stage import stage_image
from slurm_bt.weights.plan import PLAN_NAME
from slurm_bt.weights.stage_job import stage_plan

__all__ = ["main"]


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    logging.basicConfig(level=logging.WARNING, format="slurm-bt staging: %(message)s", stream=sys.stdout)
    yield


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 0 when every source is in the cluster cache, 1 with one reason line otherwise."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m slurm_bt.steps.stage_weights JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    with _quiet_logging():
        try:
            if (job_dir / "weights" / PLAN_NAME).is_file():  # a job with an image only has no weights plan
                stage_plan(job_dir)
        except BtError as exc:
            where = f"job.weights[{getattr(exc, 'weights_index', '?')}].source: "
            for line in exc.lines():
                print(f"slurm-bt staging failed: {where}{line}", file=sys.stderr, flush=True)
            return 1
        except (OSError, ValueError) as exc:
            print(f"slurm-bt staging failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
        # The job's image (slurm_bt/images/stage.py): mirrored into the cluster cache when not cached.
        try:
            stage_image(job_dir)
        except BtError as exc:
            for line in exc.lines():
                print(f"slurm-bt staging failed: job.image.base_image: {line}", file=sys.stderr, flush=True)
            return 1
        except (OSError, ValueError) as exc:
            print(f"slurm-bt staging failed: job.image.base_image: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

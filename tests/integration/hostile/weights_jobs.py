"""What the hostile weights tests share: the probing job, and a site file the test users can read."""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PROBE", "readable_site", "weights_job"]

_JOB = """
    from truss_train import WeightsSource, definitions
    project = definitions.TrainingProject(name={project!r}, job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count=1, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["python3 probe.py"]),
        weights=[WeightsSource(source={source!r}, mount_location="/app/w"{auth})],
    ))
"""

PROBE = r'''
import hashlib, json, os
out = {}
for root, _, names in os.walk("/app/w"):
    for n in names:
        p = os.path.join(root, n)
        out[os.path.relpath(p, "/app/w")] = hashlib.sha256(open(p, "rb").read()).hexdigest()
print("PROBE " + json.dumps(out), flush=True)
'''
"""The job's command: prints ``PROBE {relative path: sha256}`` of everything mounted at /app/w."""


def weights_job(project: str, source: str, auth: str = "") -> str:
    """A config.py body: one single-node CPU job mounting ``source`` at /app/w and running PROBE.

    ``auth`` is appended to the ``WeightsSource`` arguments as is (``", auth=..."``) or empty.
    """
    return _JOB.format(project=project, source=source, auth=auth)


@contextmanager
def readable_site(prefix: str, body: str) -> Iterator[Path]:
    """A site file every user can read, named by ``SLURM_BT_SITE_CONFIG`` while the block runs.

    ``as_user`` (runuser) passes the environment on, so the users' bt-sbatch and jobs read it.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    site = folder / "site.toml"
    site.write_text(textwrap.dedent(body))
    site.chmod(0o644)
    old = os.environ.get("SLURM_BT_SITE_CONFIG")
    os.environ["SLURM_BT_SITE_CONFIG"] = str(site)
    try:
        yield site
    finally:
        if old is None:
            os.environ.pop("SLURM_BT_SITE_CONFIG", None)
        else:
            os.environ["SLURM_BT_SITE_CONFIG"] = old
        shutil.rmtree(folder, ignore_errors=True)

"""devcluster.py's image names: what the dev registry serves a config's ``base_image`` as (Docker Hub's
rules, since the registry is the site's Docker Hub mirror), and exit 2 for a name it cannot serve."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

DEVCLUSTER = Path(__file__).resolve().parents[2] / "devcluster" / "devcluster.py"


def _devcluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devcluster_under_test", DEVCLUSTER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("name", "repo", "tag"), [
    ("python:3.11-slim", "library/python", "3.11-slim"),
    ("python", "library/python", "latest"),
    ("pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime", "pytorch/pytorch", "2.7.0-cuda12.8-cudnn9-runtime"),
    ("docker.io/myteam/trainer:v1", "myteam/trainer", "v1"),
    ("docker.io/ubuntu", "library/ubuntu", "latest"),
    ("myteam/sub/trainer_x-1:V_1.2", "myteam/sub/trainer_x-1", "V_1.2"),
])
def test_names_follow_docker_hub(name: str, repo: str, tag: str) -> None:
    assert _devcluster().dev_registry_repo(name) == (repo, tag)


@pytest.mark.parametrize("name", ["quay.io/org/img:1", "127.0.0.1:5443/x:1", "localhost/x", "Bad Name",
                                  "UPPER/case", "x:", "x:-bad", "a//b"])
def test_other_registries_and_bad_names_are_refused(name: str) -> None:
    dc = _devcluster()
    with pytest.raises(dc.UsageError):
        dc.dev_registry_repo(name)


def test_bad_name_exits_2_with_one_line() -> None:
    proc = subprocess.run(["/usr/bin/python3", str(DEVCLUSTER), "image", "build", "quay.io/org/img:1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines() == [
        "ERROR: image 'quay.io/org/img:1': the dev registry mirrors Docker Hub only; name the image as on "
        "Docker Hub (e.g. myteam/trainer:v1)"]

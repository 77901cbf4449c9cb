"""memory_to_mib and the mount-location rules that make slurm-bt stricter than truss."""

from __future__ import annotations

import pytest

from slurm_bt.compat import memory_to_bytes, memory_to_mib, mount_location_problem


@pytest.mark.parametrize(
    ("memory", "mib"),
    [
        ("2Gi", 2048), ("512Mi", 512), ("1Ti", 1024 * 1024), ("1Ki", 1), ("1", 1), ("1048576", 1),
        ("1048577", 2), ("1G", 954), ("1M", 1), ("1.5Gi", 1536), (".5Gi", 512), ("1k", 1),
        ("1E", 953674316407), ("1.1Gi", 1127), ("1Pi", 1024**3), ("1Ei", 1024**4), ("1T", 953675),
        ("1P", 953674317),
    ],
)  # fmt: skip
def test_memory_to_mib_rounds_up(memory: str, mib: int) -> None:
    assert memory_to_mib(memory) == mib


@pytest.mark.parametrize(
    "memory", ["", "Gi", "2GB", "2gi", "-1Gi", "1e9", "inf", "nan", " 2Gi", "2 Gi", "2Gi "]
)
def test_memory_rejects_what_is_not_a_quantity(memory: str) -> None:
    with pytest.raises(ValueError):
        memory_to_mib(memory)


def test_memory_to_bytes() -> None:
    assert memory_to_bytes("2Gi") == 2 * 1024**3
    assert memory_to_bytes("0") == 0


@pytest.mark.parametrize(
    "path", ["/data", "/app/models/llama", "/app/models/", "/var/spool/other", "/usrdata"]
)
def test_safe_mounts(path: str) -> None:
    assert mount_location_problem(path) is None


def test_relative_mount_is_left_to_upstream() -> None:
    assert mount_location_problem("relative") is None


@pytest.mark.parametrize(
    "path",
    ["/", "//", "/a/..", "/a/../b", "/./a", "/a//b", "/etc", "/etc/", "/sys/x", "/dev/shm", "/run/x", "/boot",
     "/bin", "/sbin/x", "/lib", "/var/spool/slurm/x", "/var/spool/slurmctld", "/a\x00", "/a\nb"],
)  # fmt: skip
def test_unsafe_mounts(path: str) -> None:
    message = mount_location_problem(path)
    assert message is not None and message.endswith("(slurm-bt is stricter than truss here)")

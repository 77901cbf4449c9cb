"""devcluster.py's node layouts: what `up --isolated` writes into slurm.conf, gres.conf and /etc/hosts, what it
remembers, and exit 2 for options it does not take (the machines themselves: tests/integration/test_isolated_nodes.py).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

DEVCLUSTER = Path(__file__).resolve().parents[2] / "devcluster" / "devcluster.py"


def _devcluster(state: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("BT_DEVCLUSTER_DIR", str(state))
    spec = importlib.util.spec_from_file_location("devcluster_layout_under_test", DEVCLUSTER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _conf_lines(dc: ModuleType, prefix: str) -> list[str]:
    return [line for line in dc.slurm_conf(dc.Release("22.05.8")).splitlines() if line.startswith(prefix)]


def test_isolated_layout_names_each_node_by_its_own_address_and_the_head_by_the_bridge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dc = _devcluster(tmp_path, monkeypatch)
    dc.set_layout("isolated", 4)
    assert _conf_lines(dc, "SlurmctldHost=") == [f"SlurmctldHost={dc.hostname()}(198.51.100.1)"]
    nodes = _conf_lines(dc, "NodeName=")
    assert [line.split()[:4] for line in nodes] == [
        [f"NodeName=n{i}", f"NodeHostname=n{i}", f"NodeAddr=198.51.100.{10 + i}", "Port=6818"] for i in range(1, 5)]
    assert all("Gres=gpu:h100:4" in line for line in nodes)
    assert all("Nodes=n1,n2,n3,n4 " in line for line in _conf_lines(dc, "PartitionName="))
    gres = dc.gres_conf()
    assert all(f"NodeName=n{i} Name=gpu Type=h100 File={tmp_path.resolve()}/dev/n{i}/nvidia[0-3]" in gres
               for i in range(1, 5))
    assert sorted(dc.SLURMDS) == ["n1", "n2", "n3", "n4"] and sorted(dc.MACHINES) == ["n1", "n2", "n3", "n4"]


def test_host_layout_is_the_two_slurmds_on_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dc = _devcluster(tmp_path, monkeypatch)
    dc.set_layout("isolated", 3)
    dc.set_layout("host", 2)
    assert _conf_lines(dc, "SlurmctldHost=") == [f"SlurmctldHost={dc.hostname()}(127.0.0.1)"]
    assert [line.split()[:4] for line in _conf_lines(dc, "NodeName=")] == [
        ["NodeName=n1", f"NodeHostname={dc.hostname()}", "NodeAddr=127.0.0.1", "Port=6821"],
        ["NodeName=n2", f"NodeHostname={dc.hostname()}", "NodeAddr=127.0.0.1", "Port=6822"]]
    assert dc.MACHINES == {} and dc.HEAD_ADDR == "127.0.0.1"


@pytest.mark.parametrize(("text", "expected"), [
    ("isolated 4\n", ("isolated", 4)), ("isolated 1", ("isolated", 1)), ("host 2\n", ("host", 2)),
    ("isolated 9\n", ("isolated", 4)), ("isolated\n", ("isolated", 4)), ("mesh 4\n", ("isolated", 4)),
    (None, ("isolated", 4)),
])
def test_remembered_layout_reads_only_what_up_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      text: str | None, expected: tuple[str, int]) -> None:
    dc = _devcluster(tmp_path, monkeypatch)
    if text is not None:
        (tmp_path / "layout").write_text(text)
    assert dc.remembered_layout() == expected


def test_hosts_file_names_the_head_and_every_node() -> None:
    sys.path.insert(0, str(DEVCLUSTER.parent))
    try:
        import nodes
    finally:
        sys.path.remove(str(DEVCLUSTER.parent))
    text = nodes.hosts_file({"n2": "198.51.100.12", "n1": "198.51.100.11"}, "head")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[0] == "127.0.0.1\tlocalhost"
    assert lines[2:] == ["198.51.100.1\thead btdev-head", "198.51.100.11\tn1", "198.51.100.12\tn2"]
    assert nodes.node_addr(4) == "198.51.100.14"
    # the init runs the machine's namespaces around this file, and enters the node's network by its name
    argv = nodes.init_argv("n3", Path("/s/node/n3"), Path("/s/local"), Path("/s/hosts"))
    assert argv[:2] == ["nsenter", "--net=/run/netns/btdev-n3"]
    assert argv[-6:] == ["_init", "n3", "/s/node/n3", "/s/local", "/s/hosts", "-"]
    # a checkout under /tmp (each node has its own) is carried into the machine at its path; others are not
    kept = nodes.init_argv("n3", Path("/s/node/n3"), Path("/s/local"), Path("/s/hosts"),
                           nodes.tmp_to_keep(Path("/tmp/clone")))
    assert kept[-1] == "/tmp/clone" and nodes.tmp_to_keep(Path("/dev/shm/c")) == Path("/dev/shm/c")
    assert nodes.tmp_to_keep(Path("/work/main")) is None and nodes.tmp_to_keep(Path("/tmpfoo/x")) is None


def test_a_machine_is_recognised_whichever_checkout_started_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh clone's `up` adopts the machines another clone started on the same state directory (else
    it starts a second machine in the node's network namespace, whose slurmd cannot bind its port)."""
    sys.path.insert(0, str(DEVCLUSTER.parent))
    try:
        import nodes
    finally:
        sys.path.remove(str(DEVCLUSTER.parent))
    argv = {
        1: ["/usr/bin/python3", "-I", "/other/clone/devcluster/nodes.py", "_init", "n2", "/s/node/n2", "/s/l", "/h"],
        2: ["/usr/bin/python3", "-I", str(nodes.HERE), "_init", "n1", "/s/node/n1", "/s/l", "/h"],
        3: ["/usr/bin/python3", "-I", "/tmp/nodes.py", "_init", "n2", "/s/node/n2", "/s/l", "/h"],
        4: ["/usr/bin/python3", "-I", "/elsewhere/clone/devcluster/nodes.py", "status"],
    }
    monkeypatch.setattr(nodes, "cmdline", lambda pid: argv.get(pid, []))
    assert nodes.is_init(1, "n2") and nodes.is_init(2, "n1")
    assert not nodes.is_init(1, "n1") and not nodes.is_init(3, "n2") and not nodes.is_init(4, "n2")
    assert not nodes.is_init(5, "n2")


@pytest.mark.parametrize("args", [["--nodes", "9"], ["--nodes", "0"], ["--nodes"], ["--isolated", "x"],
                                  ["--shared", "nfs"]])
def test_bad_up_options_exit_2_with_the_usage(args: list[str]) -> None:
    proc = subprocess.run(["/usr/bin/python3", str(DEVCLUSTER), "up", *args], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2
    assert "--isolated [--nodes N]" in proc.stderr

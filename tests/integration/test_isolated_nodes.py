"""The dev cluster's isolated nodes are apart as real nodes are (issue 23; devcluster/README.md "Nodes").

``devcluster.py up --isolated`` runs each slurmd in a machine of its own (devcluster/nodes.py): its own
network namespace and address on a bridge, hostname, PID namespace, ``/tmp``, ``/dev/shm`` and node-local
disk at one path (and at ``node/<n>``, with no other node's disk beside it). These tests run plain Slurm
jobs (no slurm-bt) and check, from inside the nodes, what a real cluster guarantees: distinct names and
addresses, private temporary storage and disks, processes invisible across nodes, and ranks reaching each
other over the network and not over a shared loopback. The module switches the cluster to the isolated
layout when it is not in it, and back at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# whole_cluster: runs alone, after the parallel tests (scripts/test.sh; README, Development).
pytestmark = [pytest.mark.slurm, pytest.mark.whole_cluster]

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "devcluster" / "devcluster.py"
STATE = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev"))


def _up(*args: str) -> None:
    proc = subprocess.run(["/usr/bin/python3", str(DEVCLUSTER), "up", *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"devcluster up {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def isolated(dev_cluster: dict[str, object]) -> Iterator[dict[str, Any]]:
    """The cluster in the isolated layout (four nodes unless it already runs isolated); its cluster.json."""
    if os.geteuid() != 0:
        pytest.fail("the isolated-node tests run as root (they switch the dev cluster's layout)")
    switched = dev_cluster.get("layout") != "isolated"
    if switched:
        _up("--isolated")
    info: dict[str, Any] = json.loads((STATE / "cluster.json").read_text())
    try:
        yield info
    finally:
        if switched:
            _up("--host-nodes")


@pytest.fixture()
def shared_out() -> Iterator[Path]:
    """A directory every node and the host see (pytest's tmp_path is under /tmp, which each node has its own of)."""
    folder = Path(tempfile.mkdtemp(prefix="bt-iso-", dir="/var/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _sbatch(out: Path, nodes: list[str], body: str) -> None:
    script = out / "job.sh"
    script.write_text("#!/bin/bash\nset -u\n" + textwrap.dedent(body))
    cmd = ["sbatch", "--wait", "--parsable", "-p", "gpu", f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
           "--ntasks-per-node=1", "--mem=500", "--time=5", f"--output={out}/slurm-%j.out", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    log = "".join(p.read_text(errors="replace") for p in out.glob("slurm-*.out"))
    assert proc.returncode == 0, f"{proc.stdout}{proc.stderr}\n--- job output ---\n{log}"


PROBE = """
import json, os, socket, subprocess, sys, time
from pathlib import Path
out, tag, local, disks = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
host = socket.gethostname()
dirs = {"tmp": Path("/tmp"), "shm": Path("/dev/shm"), "local": local}
for d in dirs.values():
    (d / f"{tag}-{host}").write_text(host)
time.sleep(4)  # every node has written its markers by now
seen = {k: sorted(n for n in os.listdir(d) if n.startswith(tag)) for k, d in dirs.items()}
for k in ("tmp", "shm"):
    (dirs[k] / f"{tag}-{host}").unlink()
addrs = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
(out / f"{host}.json").write_text(json.dumps({
    "host": host, "nodename": os.environ["SLURMD_NODENAME"], "seen": seen, "disks": sorted(os.listdir(disks)),
    "own_disk_too": sorted(n for n in os.listdir(disks / host) if n.startswith(tag)),
    "addrs": sorted(line.split()[3].split("/")[0] for line in addrs.splitlines()),
    "pid1": Path("/proc/1/cmdline").read_bytes().decode().split("\\0")}))
"""


def test_every_node_has_its_own_name_address_tmp_shm_and_local_disk(isolated: dict[str, Any],
                                                                     shared_out: Path) -> None:
    nodes = sorted(isolated["nodes"])
    assert len(nodes) >= 2
    tag = f"bt-iso-{uuid.uuid4().hex[:12]}"
    (shared_out / "probe.py").write_text(PROBE)
    local = isolated["node_local_mount"]
    disks = isolated["node_local_dir"]  # node/<n> on the host; on a node only its own is there
    _sbatch(shared_out, nodes, f"srun /usr/bin/python3 {shared_out}/probe.py {shared_out} {tag} {local} {disks}\n")
    results = {n: json.loads((shared_out / f"{n}.json").read_text()) for n in nodes}
    addresses = set()
    for node, r in results.items():
        assert r["host"] == node and r["nodename"] == node
        own = f"{tag}-{node}"
        assert r["seen"] == {"tmp": [own], "shm": [own], "local": [own]}, r["seen"]
        assert r["disks"] == [node] and r["own_disk_too"] == [own], r  # no other node's disk, its own at node/<n>
        assert r["addrs"] == ["127.0.0.1", isolated["nodes"][node]], r["addrs"]
        addresses.add(isolated["nodes"][node])
        assert "_init" in r["pid1"] and node in r["pid1"]  # PID 1 is the node's own init, not the host's
        # the node's local disk is node/<n> on the host, and only that node's
        on_host = Path(isolated["node_local_dir"]) / node / own
        assert on_host.read_text() == node
        on_host.unlink()
    assert len(addresses) == len(nodes) and isolated["head_addr"] not in addresses
    assert not any(p.name.startswith(tag) for p in Path(local).iterdir())  # the mount point stays empty on the host


def test_a_process_on_one_node_is_invisible_on_another(isolated: dict[str, Any], shared_out: Path) -> None:
    a, b = sorted(isolated["nodes"])[:2]
    tag = f"bt-iso-{uuid.uuid4().hex[:12]}"
    finder = shared_out / "find.py"
    finder.write_text(textwrap.dedent(f"""
        import os, socket, sys
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = open(f"/proc/{{pid}}/cmdline", "rb").read().decode().split("\\0")
            except OSError:
                continue
            if "{tag}" in argv and "sleeper" in argv:
                found.append(pid)
        open(sys.argv[1] + "/" + socket.gethostname() + ".found", "w").write(" ".join(found))
    """))
    _sbatch(shared_out, [a, b], f"""
        srun -N1 -n1 -w {a} --overlap /usr/bin/python3 -c "import time; time.sleep(60)" sleeper {tag} &
        sleep 3
        srun -N1 -n1 -w {a} --overlap /usr/bin/python3 {finder} {shared_out}
        srun -N1 -n1 -w {b} --overlap /usr/bin/python3 {finder} {shared_out}
        kill %1
        wait
    """)
    assert (shared_out / f"{a}.found").read_text().strip() != ""  # the finder works where the process is
    assert (shared_out / f"{b}.found").read_text() == ""


def test_ranks_reach_each_other_over_the_network_not_a_shared_loopback(isolated: dict[str, Any],
                                                                       shared_out: Path) -> None:
    a, b = sorted(isolated["nodes"])[:2]
    exchange = shared_out / "exchange.py"
    exchange.write_text(textwrap.dedent("""
        import json, os, socket, subprocess, sys, time
        out = sys.argv[1]
        rank = int(os.environ["SLURM_PROCID"])
        leader = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                                capture_output=True, text=True, check=True).stdout.split()[0]
        if rank == 0:
            srv = socket.create_server(("0.0.0.0", 29511))
            lo = socket.create_server(("127.0.0.1", 29512))  # the leader's own loopback only
            srv.settimeout(60)
            conn, peer = srv.accept()
            msg = conn.recv(100).decode()
            conn.sendall(socket.gethostname().encode())
            conn.recv(100)  # "done": the peer has tried the loopback port while it was open here
            result = {"peer": peer[0], "msg": msg}
        else:
            for _ in range(100):
                try:
                    conn = socket.create_connection((leader, 29511), timeout=2)
                    break
                except OSError:
                    time.sleep(0.2)
            conn.sendall(socket.gethostname().encode())
            reply = conn.recv(100).decode()
            try:
                socket.create_connection(("127.0.0.1", 29512), timeout=2).close()
                loopback = "reached the leader"
            except OSError as e:
                loopback = type(e).__name__
            conn.sendall(b"done")
            result = {"reply": reply, "leader_addr": socket.gethostbyname(leader), "loopback": loopback}
        open(f"{out}/rank{rank}.json", "w").write(json.dumps(result))
    """))
    _sbatch(shared_out, [a, b], f"srun /usr/bin/python3 {exchange} {shared_out}\n")
    r0 = json.loads((shared_out / "rank0.json").read_text())
    r1 = json.loads((shared_out / "rank1.json").read_text())
    assert r0 == {"peer": isolated["nodes"][b], "msg": b}
    assert r1["reply"] == a and r1["leader_addr"] == isolated["nodes"][a]
    assert r1["loopback"] == "ConnectionRefusedError"  # 127.0.0.1 on b is b's own, as on real nodes


def test_every_node_sees_the_hooks_and_package_of_this_checkout(isolated: dict[str, Any]) -> None:
    """slurm.conf's Prolog and Epilog and the venv's link to the package name files of this checkout; a
    real site keeps them on storage every node mounts. A checkout under /tmp (a fresh clone made there)
    is carried into each node's own /tmp (devcluster/nodes.py, tmp_to_keep)."""
    from tests.integration.cluster_nodes import node_root

    for node in isolated["nodes"]:
        seen = node_root(node) / REPO.relative_to("/")
        for part in ("prolog/slurm-bt-prolog", "epilog/slurm-bt-epilog", "slurm_bt/__init__.py"):
            assert (seen / part).is_file(), f"{node} does not see {REPO / part}"

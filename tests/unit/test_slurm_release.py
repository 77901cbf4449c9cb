"""The release probe (slurm_bt/slurm/release.py), ``--prefer`` (slurm/prefer.py, weights/placement.py)
and the per-release ``admin install``/``doctor`` advice (cli/admin_cmd.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_bt.cli.admin_cmd import _hook_timeout_checks, release_checks, slurm_conf_lines
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.prefer import prefer_expression
from slurm_bt.slurm.release import (
    FEATURES,
    SlurmRelease,
    features_in_use,
    parse_release,
    requeue_option,
    slurm_release,
)
from slurm_bt.slurm.runner import CommandResult
from slurm_bt.slurm.scontrol import parse_config
from slurm_bt.weights.placement import has_placement_option

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
R2205, R2411, R2605 = SlurmRelease(22, 5, 8), SlurmRelease(24, 11, 5), SlurmRelease(26, 5, 5)
R2511 = SlurmRelease(25, 11, 0)


@pytest.mark.parametrize(("text", "want"), [
    ("slurm-wlm 22.05.8\n", R2205),           # Debian 12's scontrol --version
    ("slurm 24.11.5\n", R2411),
    ("slurm 26.05.5", R2605),
    ("22.05.8", R2205),                       # SLURM_VERSION of scontrol show config
    ("slurm 23.02.0-0rc1", SlurmRelease(23, 2, 0)),
    ("slurm 25.11", R2511),
    ("", None), ("scontrol: command not found", None), ("slurm 1.2.3", None), ("slurm 24.13.1", None),
])
def test_parse_release_reads_every_form_and_refuses_junk(text: str, want: SlurmRelease | None) -> None:
    assert parse_release(text) == want


def test_features_follow_the_release_and_expedite_also_needs_its_switch() -> None:
    assert features_in_use(R2205) == {"prefer": True, "prolog_force_requeue_on_fail": False,
                                      "split_hook_timeouts": False, "requeue_expedite": False}
    force = {"PrologFlags": "Alloc,Contain,DeferBatch,ForceRequeueOnFail"}
    assert features_in_use(R2411, force)["prolog_force_requeue_on_fail"]
    assert not features_in_use(R2411)["prolog_force_requeue_on_fail"]  # the release has it; slurm.conf must set it
    assert not features_in_use(R2205, force)["prolog_force_requeue_on_fail"]
    assert not features_in_use(R2411)["split_hook_timeouts"]
    assert features_in_use(R2605)["split_hook_timeouts"]
    assert not features_in_use(None)["prefer"]  # unknown release: nothing optional
    on = {"SlurmctldParameters": "enable_configless,enable_expedited_requeue"}
    assert not features_in_use(R2605)["requeue_expedite"]        # >= 25.11 but not switched on
    assert features_in_use(R2605, on)["requeue_expedite"]
    assert not features_in_use(R2411, on)["requeue_expedite"]   # switched on, release too old
    assert requeue_option(R2605, on) == "--requeue=expedite"
    assert requeue_option(R2605, {"SlurmctldParameters": "(null)"}) == "--requeue"
    assert requeue_option(R2205, on) == "--requeue"
    assert [f.since_text for f in FEATURES] == ["22.05", "23.02", "25.05", "25.11"]


class _Counting:
    """A runner that answers ``scontrol --version`` and counts the calls."""

    def __init__(self, stdout: str, rc: int = 0) -> None:
        self.calls: list[tuple[tuple[str, ...], Mapping[str, str] | None]] = []
        self.stdout, self.rc = stdout, rc

    def run(self, argv: Sequence[str], *, input: str | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float = 60) -> CommandResult:
        self.calls.append((tuple(argv), env))
        return CommandResult(tuple(argv), self.rc, self.stdout, "")


def test_the_release_is_probed_once_per_client_with_a_scrubbed_environment() -> None:
    runner = _Counting("slurm 24.11.5\n")
    client = SlurmClient(runner, environ={"PATH": "/usr/bin", "HF_TOKEN": "secret"})
    assert slurm_release(client) == R2411 and slurm_release(client) == R2411
    assert len(runner.calls) == 1
    argv, env = runner.calls[0]
    assert argv == ("scontrol", "--version") and env is not None and "HF_TOKEN" not in env
    failing = _Counting("", rc=1)
    other = SlurmClient(failing)
    assert slurm_release(other) is None and slurm_release(other) is None and len(failing.calls) == 1


def _node(name: str, features: str, partitions: str = "gpu,staging") -> dict[str, str]:
    return {"NodeName": name, "ActiveFeatures": features, "Partitions": partitions}


def test_prefer_expression_names_only_features_that_single_out_the_wanted_nodes() -> None:
    nodes = [_node("n1", "n1,h100"), _node("n2", "n2,h100"), _node("n3", "h100,rackb"), _node("n4", "rackb,x")]
    assert prefer_expression(nodes, ["n2"]) == "n2"
    assert prefer_expression(nodes, ["n1", "n2"]) == "n1|n2"
    assert prefer_expression(nodes, ["n4"]) == "x"          # its own feature when it has no name feature
    assert prefer_expression(nodes, ["n3"]) is None         # n3 shares every feature with someone else
    assert prefer_expression(nodes, ["n3", "n4"]) == "rackb"
    assert prefer_expression(nodes, ["n1", "n2", "n3", "n4"]) is None  # every node: nothing to favour
    assert prefer_expression(nodes, ["n9"]) is None
    bare = [_node("n1", "(null)"), _node("n2", "")]         # the dev cluster before node features
    assert prefer_expression(bare, ["n1"]) is None
    # Only the job's partition counts: n2 is alone in "small", so there it is every node.
    split = [_node("n1", "n1", "gpu"), _node("n2", "n2", "gpu,small")]
    assert prefer_expression(split, ["n2"], "gpu") == "n2" and prefer_expression(split, ["n2"], "small") is None
    # A feature that could smuggle an operator into --prefer is never used.
    assert prefer_expression([_node("n1", "a|b"), _node("n2", "c")], ["n1"]) is None


@pytest.mark.parametrize(("args", "has"), [
    ([], False), (["--time=5"], False), (["-C", "h100"], True), (["-Ch100"], True), (["--constraint=a"], True),
    (["--const=a"], True), (["--prefer=a"], True), (["--pref", "a"], True), (["--comment=x"], False),
    (["--co=x"], False), (["--priority=5"], False),
])
def test_a_users_own_feature_option_means_no_preference(args: list[str], has: bool) -> None:
    assert has_placement_option(args) is has


def _lines(release: SlurmRelease | None) -> list[str]:
    return slurm_conf_lines("/p", "/e", 90, {"H100": "h100"}, release)


def test_install_advice_per_release() -> None:
    old = _lines(R2205)
    assert "PrologFlags=Alloc,Contain,DeferBatch" in old and "PrologEpilogTimeout=120" in old
    assert not any("ForceRequeueOnFail" in ln or ln.startswith("PrologTimeout") for ln in old)
    assert _lines(None) == [ln if not ln.startswith("# --- slurm.conf") else "# --- slurm.conf ---" for ln in old]
    mid = _lines(R2411)
    assert "PrologFlags=Alloc,Contain,DeferBatch,ForceRequeueOnFail" in mid and "PrologEpilogTimeout=120" in mid
    new = _lines(R2605)
    assert "PrologTimeout=120" in new and "EpilogTimeout=120" in new
    assert not any(ln.startswith("PrologEpilogTimeout") for ln in new)
    assert "SlurmctldParameters=enable_expedited_requeue" not in mid
    assert "SlurmctldParameters=enable_expedited_requeue" in new and "SlurmctldParameters=enable_expedited_requeue" \
        in _lines(R2511)


def _conf(**kv: str) -> dict[str, str]:
    return parse_config("".join(f"{k:<23} = {v}\n" for k, v in kv.items()))


def test_doctor_reads_the_hook_timeouts_each_release_has() -> None:
    real = parse_config((DATA / "2205_scontrol_show_config.txt").read_text())
    assert [(c.name, c.ok) for c in _hook_timeout_checks(real, R2205, 60)] == [("PrologEpilogTimeout", True)]
    # 25.05+: per-hook keys; an unset one falls back to PrologEpilogTimeout as slurmd does.
    split = _conf(PrologTimeout="120 sec", EpilogTimeout="65534", PrologEpilogTimeout="65534")
    got = {c.name: c for c in _hook_timeout_checks(split, R2605, 60)}
    assert got["PrologTimeout"].ok and not got["EpilogTimeout"].ok
    assert "EpilogTimeout=90" in got["EpilogTimeout"].fix
    fallback = _conf(PrologEpilogTimeout="120")
    assert all(c.ok for c in _hook_timeout_checks(fallback, R2605, 60))
    assert not any(c.ok for c in _hook_timeout_checks({}, R2605, 60))           # unset: waits for ever
    assert not _hook_timeout_checks(_conf(PrologEpilogTimeout="30"), R2205, 60)[0].ok  # below the deadline


def test_doctor_prints_the_release_and_each_feature() -> None:
    nodes = [_node("n1", "n1"), _node("n2", "n2")]
    on = {"SlurmctldParameters": "enable_expedited_requeue"}
    lines = {c.name: c.problem for c in release_checks(R2605, on, nodes)}
    assert all(c.info and c.ok for c in release_checks(R2605, on, nodes))
    assert lines["Slurm release"].startswith("Slurm 26.05.5")
    assert lines["feature prefer (>= 22.05)"].startswith("in use")
    assert lines["feature requeue_expedite (>= 25.11)"].startswith("in use")
    old = {c.name: c.problem for c in release_checks(R2205, {}, [_node("n1", "(null)"), _node("n2", "(null)")])}
    assert old["feature prefer (>= 22.05)"].startswith("available, no effect")
    assert old["feature prolog_force_requeue_on_fail (>= 23.02)"].startswith("not on 22.05")
    off = {c.name: c.problem for c in release_checks(R2605, {}, nodes)}
    assert off["feature requeue_expedite (>= 25.11)"].startswith(
        "available, off: add enable_expedited_requeue to SlurmctldParameters")
    assert release_checks(None, {})[0].problem.startswith("unknown")
    shared = {c.name: c.problem for c in release_checks(R2605, {}, nodes, "/nvme/slurm-bt/weights")}
    assert shared["feature prefer (>= 22.05)"].startswith("available, no effect: storage.node_cache")
    per_node = {c.name: c.problem for c in release_checks(R2605, {}, nodes, "/nvme/%n/weights")}
    assert per_node["feature prefer (>= 22.05)"].startswith("in use")


def _plan(team: str, *manifests: object) -> object:
    from slurm_bt.weights.plan import SourcePin, WeightsPlan

    return WeightsPlan.model_construct(team=team, sources=tuple(SourcePin.model_construct(manifest=m)
                                                                 for m in manifests))


def _mark_complete(root: Path, manifest: object) -> None:
    from slurm_bt.weights.cache_layout import CacheLayout
    from slurm_bt.weights.manifest import Manifest

    assert isinstance(manifest, Manifest)
    layout = CacheLayout(root)
    layout.manifests.mkdir(parents=True, exist_ok=True)
    layout.manifest_file(manifest.manifest_id).write_bytes(manifest.canonical_json())


def test_nodes_holding_reads_each_nodes_markers_public_or_team(tmp_path: Path) -> None:
    from slurm_bt.weights.placement import nodes_holding
    from tests.unit.test_cache_support import make_manifest

    a, b = make_manifest({"w": b"1"}, "hf://org/a"), make_manifest({"w": b"2"}, "hf://org/b")
    template = f"{tmp_path}/%n/weights"
    _mark_complete(tmp_path / "n1/weights", a)
    _mark_complete(tmp_path / "n1/weights", b)
    _mark_complete(tmp_path / "n2/weights", a)                     # n2 lacks b
    _mark_complete(tmp_path / "n3/weights/private/t1", a)          # credentialed entries: the team's subtree
    _mark_complete(tmp_path / "n3/weights/private/t1", b)
    (tmp_path / "n4/weights/manifests").mkdir(parents=True)         # a symlinked marker is never followed
    (tmp_path / "n4/weights/manifests" / f"{a.manifest_id}.json").symlink_to(
        tmp_path / "n1/weights/manifests" / f"{a.manifest_id}.json")
    names = ["n1", "n2", "n3", "n4", "n5"]
    assert nodes_holding(_plan("t1", a, b), template, names) == ["n1", "n3"]  # type: ignore[arg-type]
    assert nodes_holding(_plan("t2", a, b), template, names) == ["n1"]        # type: ignore[arg-type]
    assert nodes_holding(_plan("t1", a), template, names) == ["n1", "n2", "n3"]  # type: ignore[arg-type]
    # An entry in no cluster tier (manifest unknown at submit), or a root without %n: nothing to prefer.
    assert nodes_holding(_plan("t1", a, None), template, names) == []  # type: ignore[arg-type]
    assert nodes_holding(_plan("t1", a), f"{tmp_path}/n1/weights", names) == []  # type: ignore[arg-type]


class _PlacementClient:
    """``scontrol show node`` and ``show hostnames`` answers for prefer_args."""

    def __init__(self) -> None:
        self.expanded: list[str] = []

    def nodes(self) -> list[dict[str, str]]:
        return [_node(f"n{i}", f"n{i}") for i in range(1, 5)]

    def hostnames(self, nodelist: str) -> list[str]:
        self.expanded.append(nodelist)
        return {"n[1-2]": ["n1", "n2"]}[nodelist]


def test_a_users_nodelist_gets_no_preference_and_exclude_narrows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch takes the user's --nodelist/--exclude as given (issue 31, item 2d): with required nodes no
    --prefer is added; with excluded ones the preference names only nodes the job may get."""
    from types import SimpleNamespace

    from slurm_bt.site.settings import SiteSettings, StorageRoots
    from slurm_bt.weights import placement

    monkeypatch.setattr(placement, "slurm_release", lambda client: R2205)
    monkeypatch.setattr(placement, "nodes_holding", lambda plan, cache, names: [n for n in names if n in ("n1", "n3")])
    plan = SimpleNamespace(sources=[SimpleNamespace(manifest=object())], team="t")
    site = SiteSettings(storage=StorageRoots(node_cache="/nc/%n"))
    client = _PlacementClient()

    def prefer(args: list[str]) -> list[str]:
        return placement.prefer_args(client, plan, site, "gpu", args)  # type: ignore[arg-type]

    assert prefer([]) == ["--prefer=n1|n3"]
    assert prefer(["--nodelist=n1"]) == [] and prefer(["-w", "n2"]) == [] and prefer(["--nodefile=f"]) == []
    assert prefer(["--exclude=n[1-2]"]) == ["--prefer=n3"] and client.expanded == ["n[1-2]"]
    assert prefer(["-x", "n[1-2]", "--time=5"]) == ["--prefer=n3"]

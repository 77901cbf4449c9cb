"""Weights delivery glue without Slurm: submit-time plan, staging job, node tier, step-1 fallback, status.

Uses the in-process fake HF Hub (tests/servers/hf_hub.py) and FakeSlurm; cluster and node caches
live in tmp dirs. The real-cluster versions are in tests/integration/test_weights_e2e.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_bt.errors import SourceError, SourceSpecError
from slurm_bt.job_spec import JobSpec
from slurm_bt.secrets_store import SecretStore
from slurm_bt.site.settings import load_site_settings
from slurm_bt.submit import submit_config
from slurm_bt.weights.delivery_report import read_weights_status
from slurm_bt.weights.node_stage import (
    WeightsJobError,
    load_job_manifests,
    prepare_job_weights,
    read_node_record,
    stage_for_job,
)
from slurm_bt.weights.plan import read_plan
from slurm_bt.weights.stage_job import stage_plan
from tests.fakes.fake_slurm import FakeSlurm
from tests.servers.hf_hub import FakeHub

MiB = 1 << 20
_n = iter(range(10_000))


def _rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture
def repo(fake_hub: FakeHub) -> tuple[str, dict[str, bytes]]:
    files = {"config.json": b'{"h": 8}', "model.safetensors": _rand(3 * MiB + 5, next(_n)), "tok/vocab.txt": b"v" * 50}
    name = f"Org/Deliver{next(_n)}"
    fake_hub.add_repo(name, files)
    return name, files


@pytest.fixture
def world(tmp_path: Path, fake_hub: FakeHub) -> dict[str, object]:
    site = tmp_path / "site.toml"
    site.write_text(textwrap.dedent(f"""
        [storage]
        workspace = "{tmp_path}/ws"
        runtime = "{tmp_path}/run"
        secrets = "{tmp_path}/secrets"
        cluster_cache = "{tmp_path}/cluster"
        node_cache = "{tmp_path}/node/%n/weights"
        scratch = "{tmp_path}/node/%n/scratch"
        [weights]
        bwrap = "/usr/bin/bwrap"
        [weights.endpoints]
        hf_endpoint = "{fake_hub.endpoint}"
        """))
    env = {"SLURM_BT_SITE_CONFIG": str(site), "PATH": os.environ["PATH"]}
    return {"env": env, "site": load_site_settings(environ=env), "tmp": tmp_path}


def _project(tmp: Path, sources: list[str], name: str = "wdemo") -> Path:
    d = tmp / f"proj-{next(_n)}"
    d.mkdir()
    weights = ", ".join(f'WeightsSource(source="{s}", mount_location="/app/w{i}")'
                         for i, s in enumerate(sources))
    (d / "config.py").write_text(textwrap.dedent(f"""
        from truss_train import WeightsSource, definitions
        project = definitions.TrainingProject(name="{name}", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            runtime=definitions.Runtime(start_commands=["true"]),
            weights=[{weights}],
        ))
        """))
    return d / "config.py"


def _submit(world: dict[str, object], config: Path, slurm: FakeSlurm) -> object:
    env = world["env"]
    assert isinstance(env, dict)
    return submit_config(config, runner=slurm, site=world["site"], environ=env)  # type: ignore[arg-type]


def test_submit_pins_stages_then_skips_staging_when_cached(world: dict[str, object], repo: tuple[str, dict[str, bytes]],
                                                           fake_hub: FakeHub) -> None:
    name, files = repo
    slurm = FakeSlurm()
    r1 = _submit(world, _project(world["tmp"], [f"hf://{name.lower()}@main"]), slurm)  # type: ignore[arg-type]
    staging, training = slurm.calls_to("sbatch")
    assert {"--partition=staging", "--export=NONE", "--hold"} <= set(staging.argv)
    assert "slurm_bt.steps.stage_weights" in (staging.stdin or "")
    assert "#SBATCH --comment=slurm-bt-staging:" in (staging.stdin or "")
    sid = r1.staging_job_id  # type: ignore[attr-defined]
    assert f"--dependency=afterok:{sid}" in training.argv and "--kill-on-invalid-dep=yes" in training.argv
    assert slurm.released == [int(sid)]
    record = json.loads(Path(r1.record_path).read_text())  # type: ignore[attr-defined]
    assert record["staging_job_id"] == sid and record["weights_sources"] == 1
    job_dir = Path(r1.spec.context.job_dir)  # type: ignore[attr-defined]
    plan = read_plan(job_dir)
    [pin] = plan.sources
    assert pin.source == f"hf://{name}" and len(pin.revision) == 40 and pin.cached_in is None

    # the staging job, run here: mirrors into the team tier, writes the job's manifest
    out = io.StringIO()
    [outcome] = stage_plan(job_dir, out=out, credentials_for=lambda p: None, progress_interval_s=0.05)
    assert outcome.tier == "miss" and outcome.fetched_bytes >= len(files["model.safetensors"])
    assert "slurm-bt weights: hf://" in out.getvalue() and " miss " in out.getvalue()
    manifest = json.loads((job_dir / "weights" / "0.json").read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
        p: hashlib.sha256(b).hexdigest() for p, b in files.items()}
    assert read_weights_status(job_dir)["staging"][0]["tier"] == "miss"

    # same source again: fully cached (pin record makes the non-LFS files' hashes known) -> no staging job
    slurm2 = FakeSlurm()
    r2 = _submit(world, _project(world["tmp"], [f"hf://{name}"]), slurm2)  # type: ignore[arg-type]
    assert len(slurm2.calls_to("sbatch")) == 1 and r2.staging_job_id is None  # type: ignore[attr-defined]
    assert "--dependency" not in " ".join(slurm2.calls_to("sbatch")[0].argv)
    assert (Path(r2.spec.context.job_dir) / "weights" / "0.json").read_bytes() == (  # type: ignore[attr-defined]
        job_dir / "weights" / "0.json").read_bytes()


def test_bad_sources_fail_submission_with_exit_2_naming_the_field(world: dict[str, object],
                                                                  repo: tuple[str, dict[str, bytes]]) -> None:
    name, _ = repo
    slurm = FakeSlurm()
    config = _project(world["tmp"], [f"hf://{name}", "hf://nobody/missing-repo", f"hf://{name}@no-such-branch"])
    with pytest.raises(SourceSpecError) as info:
        _submit(world, config, slurm)
    assert info.value.exit_code == 2
    text = "\n".join(info.value.lines())
    assert "job.weights[1].source: hf://nobody/missing-repo" in text and "404" in text
    assert "job.weights[2].source" in text and "job.weights[0]" not in text
    assert slurm.calls_to("sbatch") == []


def test_dry_run_pins_sources_as_a_submit_does_and_submits_nothing(world: dict[str, object], fake_hub: FakeHub,
                                                                   repo: tuple[str, dict[str, bytes]]) -> None:
    name, _ = repo
    env = world["env"]
    assert isinstance(env, dict)
    slurm = FakeSlurm()
    bad = _project(world["tmp"], [f"hf://{name}", "hf://nobody/missing-repo"])
    with pytest.raises(SourceSpecError) as info:  # found by the dry run, not at the real submit
        submit_config(bad, dry_run=True, runner=slurm, site=world["site"], environ=env)  # type: ignore[arg-type]
    assert "job.weights[1].source: hf://nobody/missing-repo" in "\n".join(info.value.lines())
    before = len(fake_hub.requests)
    good = _project(world["tmp"], [f"hf://{name}"])
    result = submit_config(good, dry_run=True, runner=slurm, site=world["site"], environ=env)  # type: ignore[arg-type]
    assert len(fake_hub.requests) > before  # listed, as a submit lists
    assert slurm.calls == [] and result.job_id is None
    assert "1 weights source(s)" in result.warnings[-1] and "submitting the weights staging job" in result.warnings[-1]
    assert not (Path(str(world["tmp"])) / "ws").exists() and not (Path(str(world["tmp"])) / "cluster").exists()


def test_branch_moves_between_submit_and_staging(world: dict[str, object], repo: tuple[str, dict[str, bytes]],
                                                 fake_hub: FakeHub) -> None:
    name, files = repo
    r = _submit(world, _project(world["tmp"], [f"hf://{name}@main"]), FakeSlurm())  # type: ignore[arg-type]
    fake_hub.commit(name, {"config.json": b'{"h": 16}', "model.safetensors": _rand(MiB, 999)})
    job_dir = Path(r.spec.context.job_dir)  # type: ignore[attr-defined]
    [outcome] = stage_plan(job_dir, out=io.StringIO(), credentials_for=lambda p: None)
    assert outcome.manifest.revision == read_plan(job_dir).sources[0].revision
    assert {f.path: f.sha256 for f in outcome.manifest.files} == {
        p: hashlib.sha256(b).hexdigest() for p, b in files.items()}


def test_repo_deleted_after_submit_fails_staging_with_a_reason(world: dict[str, object], fake_hub: FakeHub,
                                                               tmp_path: Path) -> None:
    name = f"Org/Vanish{next(_n)}"
    fake_hub.add_repo(name, {"model.safetensors": _rand(MiB, 5)})
    r = _submit(world, _project(world["tmp"], [f"hf://{name}"]), FakeSlurm())  # type: ignore[arg-type]
    fake_hub.delete_repo(name)
    job_dir = Path(r.spec.context.job_dir)  # type: ignore[attr-defined]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-m", "slurm_bt.steps.stage_weights", str(job_dir)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert "slurm-bt staging failed: job.weights[0].source:" in proc.stderr and "404" in proc.stderr


def _spec(job_dir: Path) -> JobSpec:
    return JobSpec.model_validate_json((job_dir / "job.json").read_bytes())


def _staged_job(world: dict[str, object], name: str) -> Path:
    r = _submit(world, _project(world["tmp"], [f"hf://{name}"]), FakeSlurm())  # type: ignore[arg-type]
    job_dir = Path(r.spec.context.job_dir)  # type: ignore[attr-defined]
    if (job_dir / "weights" / "staging.sbatch").exists():
        stage_plan(job_dir, out=io.StringIO(), credentials_for=lambda p: None)
    return job_dir


def test_step1_fallback_exposes_cluster_snapshot_and_writes_status(world: dict[str, object],
                                                                   repo: tuple[str, dict[str, bytes]]) -> None:
    name, files = repo
    job_dir = _staged_job(world, name)
    spec = _spec(job_dir)
    runtime = Path(str(world["tmp"])) / "rt"
    runtime.mkdir()
    env = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n1", "SLURM_NODEID": "0"}
    out = io.StringIO()
    prepared = prepare_job_weights(spec, env, runtime_dir=str(runtime), workdir=spec.src_dir, out=out)
    [entry] = prepared.entries
    assert entry["tier"] == "cluster-direct" and "/cluster/teams/" in entry["path"]
    assert (Path(entry["path"]) / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert "cluster-direct" in out.getvalue()
    if prepared.bwrap_file is not None:  # bwrap usable here
        argv = prepared.bwrap_file.read_bytes().split(b"\0")[:-1]
        assert b"--ro-bind" in argv and entry["path"].encode() in argv and b"/app/w0" in argv
        assert ("BT_WEIGHTS_0", "/app/w0") in prepared.env
    status = read_weights_status(job_dir)
    assert status["nodes"]["n1"][0]["tier"] == "cluster-direct"


@pytest.mark.skipif(os.geteuid() != 0, reason="the node tier is root-owned (prolog)")
def test_prolog_stage_for_job_then_node_hit_and_step1_uses_it(world: dict[str, object],
                                                              repo: tuple[str, dict[str, bytes]]) -> None:
    name, files = repo
    job_dir = _staged_job(world, name)
    spec = _spec(job_dir)
    plan = read_plan(job_dir)
    env = {"SLURM_JOB_ID": "5001", "SLURMD_NODENAME": "n1", "SLURM_NODEID": "0", "SLURM_JOB_UID": str(os.getuid()),
           "SLURM_JOB_USER": "root"}
    raw = load_job_manifests(str(job_dir), len(spec.weights))
    lines: list[str] = []
    site = world["site"]
    [e1] = stage_for_job(env, spec, raw, team=plan.team, site=site, log=lines.append)  # type: ignore[arg-type]
    assert e1["tier"] == "cluster-hit" and "cluster-hit" in lines[0]
    [e2] = stage_for_job({**env, "SLURM_JOB_ID": "5002"}, spec, raw, team=plan.team, site=site)  # type: ignore[arg-type]
    assert e2["tier"] == "node-hit" and e2["seconds"] < 0.1
    node_root = Path(str(world["tmp"])) / "node" / "n1" / "weights"
    assert read_node_record(node_root, "5002") is not None
    runtime = Path(str(world["tmp"])) / "rt2"
    runtime.mkdir()
    prepared = prepare_job_weights(spec, {**env, "SLURM_JOB_ID": "5002"}, runtime_dir=str(runtime),
                                   workdir=spec.src_dir, out=io.StringIO())
    [entry] = prepared.entries
    assert entry["tier"] == "node-hit" and entry["path"].startswith(str(node_root / "snapshots"))
    assert (Path(entry["path"]) / "model.safetensors").read_bytes() == files["model.safetensors"]
    # a manifest for another team's entry (not in this team's tier) is refused: job failure, no lease
    with pytest.raises(WeightsJobError, match="not complete in the cluster cache"):
        stage_for_job({**env, "SLURM_JOB_ID": "5003"}, spec, raw, team="otherteam", site=site)  # type: ignore[arg-type]
    from slurm_bt.weights.node_stage import epilog_release_leases  # noqa: F401 - the epilog imports it


@pytest.mark.skipif(os.geteuid() != 0, reason="needs chown to fake a teammate's file")
def test_fallback_rehashes_a_teammates_blob_and_refuses_tampering(world: dict[str, object],
                                                                  repo: tuple[str, dict[str, bytes]]) -> None:
    name, _ = repo
    job_dir = _staged_job(world, name)
    spec = _spec(job_dir)
    m = json.loads((job_dir / "weights" / "0.json").read_text())
    plan = read_plan(job_dir)
    blob = Path(plan.cluster_cache) / "teams" / plan.team / "blobs" / next(
        f["sha256"] for f in m["files"] if f["path"] == "model.safetensors")
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[7] ^= 0xFF
    blob.write_bytes(bytes(data))
    os.chown(blob, 54321, 54321)  # "a teammate" rewrote a blob they own
    runtime = Path(str(world["tmp"])) / "rt3"
    runtime.mkdir()
    with pytest.raises(WeightsJobError, match="differs from the pinned"):
        prepare_job_weights(spec, {"SLURM_JOB_ID": "6001", "SLURMD_NODENAME": "n2"}, runtime_dir=str(runtime),
                            workdir=spec.src_dir, out=io.StringIO())


def test_sixteen_concurrent_staging_jobs_fetch_once(world: dict[str, object], fake_hub: FakeHub) -> None:
    name = f"Org/Herd{next(_n)}"
    big = _rand(6 * MiB, 77)
    fake_hub.add_repo(name, {"model.safetensors": big, "config.json": b"{}"})
    job_dirs = [Path(_submit(world, _project(world["tmp"], [f"hf://{name}"]), FakeSlurm())  # type: ignore[attr-defined]
                     .spec.context.job_dir) for _ in range(16)]
    fake_hub.requests.clear()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-m", "slurm_bt.steps.stage_weights", str(d)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in job_dirs]
    results = [(*p.communicate(timeout=120), p.returncode) for p in procs]
    assert all(rc == 0 for _, _, rc in results), results
    big_gets = [r for r in fake_hub.requests if r[0] == "GET" and r[1].endswith("/model.safetensors")]
    assert len(big_gets) == 1, big_gets  # single-flight: one origin download for 16 jobs
    tiers = sorted(json.loads((d / "weights" / "staging-0.json").read_text())["tier"] for d in job_dirs)
    assert tiers == ["cluster-hit"] * 15 + ["miss"]
    manifests = {(d / "weights" / "0.json").read_bytes() for d in job_dirs}
    assert len(manifests) == 1
    cluster = Path(read_plan(job_dirs[0]).cluster_cache)
    leftovers = [p for p in cluster.rglob("*") if ".tmp-" in p.name or p.parent.name == ".tmp"]
    assert leftovers == []


def test_source_changed_since_submit_is_refused(world: dict[str, object], fake_hub: FakeHub) -> None:
    """Object stores are pinned by listing; the staging job refuses a different listing (HF analogue:
    a pinned commit whose files changed cannot happen, so the pin key itself is tampered here)."""
    name = f"Org/Changed{next(_n)}"
    fake_hub.add_repo(name, {"model.safetensors": _rand(MiB, 8)})
    r = _submit(world, _project(world["tmp"], [f"hf://{name}"]), FakeSlurm())  # type: ignore[arg-type]
    job_dir = Path(r.spec.context.job_dir)  # type: ignore[attr-defined]
    plan_path = job_dir / "weights" / "plan.json"
    data = json.loads(plan_path.read_text())
    data["sources"][0]["pin_key"] = "0" * 64
    plan_path.write_text(json.dumps(data))
    with pytest.raises(SourceError, match="source changed since submit"):
        stage_plan(job_dir, out=io.StringIO(), credentials_for=lambda p: None)


def test_secret_store_credentials_are_used_for_private_repos(world: dict[str, object], fake_hub: FakeHub) -> None:
    name = f"Org/Private{next(_n)}"
    fake_hub.add_repo(name, {"model.safetensors": _rand(MiB, 9)}, private=True, readers={"hf_reader_token"})
    tmp = Path(str(world["tmp"]))
    d = tmp / "privproj"
    d.mkdir()
    (d / "config.py").write_text(textwrap.dedent(f"""
        from truss_train import WeightsSource, definitions
        project = definitions.TrainingProject(name="priv", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            runtime=definitions.Runtime(start_commands=["true"]),
            weights=[WeightsSource(source="hf://{name}", mount_location="/app/p",
                     auth={{"auth_method": "CUSTOM_SECRET", "auth_secret_name": "hf_tok"}})],
        ))
        """))
    SecretStore(tmp / "secrets").set("hf_tok", "hf_wrong_token")
    with pytest.raises(SourceSpecError, match=r"job.weights\[0\].source.*not authorized"):
        _submit(world, d / "config.py", FakeSlurm())
    SecretStore(tmp / "secrets").set("hf_tok", "hf_reader_token")
    slurm = FakeSlurm()
    r = _submit(world, d / "config.py", slurm)
    for call in slurm.calls:
        assert "hf_reader_token" not in " ".join(call.argv) + (call.stdin or "") + json.dumps(call.env or {})
    job_dir = Path(r.spec.context.job_dir)  # type: ignore[attr-defined]
    assert "hf_reader_token" not in (job_dir / "weights" / "plan.json").read_text()
    [outcome] = stage_plan(job_dir, out=io.StringIO())  # reads the token from the user's store
    assert outcome.tier == "miss"


def test_cache_cli_warm_ls_inspect_evict(world: dict[str, object], repo: tuple[str, dict[str, bytes]],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from slurm_bt.cli.main import cli

    name, _ = repo
    env = world["env"]
    assert isinstance(env, dict)
    monkeypatch.setenv("SLURM_BT_SITE_CONFIG", env["SLURM_BT_SITE_CONFIG"])
    runner = CliRunner()
    warm = runner.invoke(cli, ["cache", "warm", f"hf://{name}"])
    assert warm.exit_code == 0, warm.output
    assert " miss " in warm.output
    again = runner.invoke(cli, ["cache", "warm", f"hf://{name}"])
    assert " cluster-hit " in again.output
    ls = runner.invoke(cli, ["cache", "ls", "--json"])
    [entry] = [e for e in json.loads(ls.output) if e["source"] == f"hf://{name}"]
    mid = entry["manifest_id"]
    shown = runner.invoke(cli, ["cache", "inspect", mid[:10]])
    assert shown.exit_code == 0 and "model.safetensors" in shown.output
    dry = runner.invoke(cli, ["cache", "evict", "--dry-run", mid[:12]])
    assert dry.exit_code == 0 and mid[:12] in dry.output
    gone = runner.invoke(cli, ["cache", "evict", mid[:12]])
    assert gone.exit_code == 0 and "removed 1 entries" in gone.output
    assert mid not in runner.invoke(cli, ["cache", "ls", "--json"]).output
    # a later submission must stage again (the pin record points at an evicted entry)
    r = _submit(world, _project(world["tmp"], [f"hf://{name}"]), FakeSlurm())  # type: ignore[arg-type]
    assert r.staging_job_id is not None  # type: ignore[attr-defined]


def test_status_weights_view_reads_only_own_job_dirs_of_jobs_with_weights(tmp_path: Path) -> None:
    from slurm_bt.cli.status_cmd import render_table
    from slurm_bt.records import SubmissionRecord
    from slurm_bt.weights.delivery_report import summary_lines, weights_status, write_node_status, write_staging_status

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    rec = SubmissionRecord(job_id="7", project_name="p", project_id="p", job_name="j", submit_id="s",
                           job_dir=str(job_dir), config_path="c.py", submitted_at="t", user="u")
    write_staging_status(job_dir, 0, {"index": 0, "source": "hf://org/m@" + "c" * 40, "tier": "miss",
                                      "total_bytes": 12_300_000, "fetched_bytes": 12_300_000, "seconds": 4.1})
    assert weights_status(rec) is None  # no weights declared: the job dir is not even looked at
    rec = dataclasses.replace(rec, weights_sources=1)
    w = weights_status(rec)
    assert w is not None and summary_lines(w) == [f"weights: hf://org/m@{'c' * 40} staging miss 11.7 MiB 4.10s"]
    entry = {"index": 0, "source": "hf://org/m@cccccccccccc", "tier": "node-hit", "bytes": 12_300_000,
             "seconds": 0.01, "path": "/x", "mount_location": "/app/m", "view": "bwrap"}
    write_node_status(job_dir, "n1", [entry])
    write_node_status(job_dir, "n2", [dict(entry, tier="cluster-hit", seconds=2.5)])
    w = weights_status(rec)
    assert w is not None and set(w["nodes"]) == {"n1", "n2"}
    assert summary_lines(w) == ["weights: hf://org/m@cccccccccccc node-hit (n1), cluster-hit (n2) 11.7 MiB 2.50s"]
    table = render_table([{"id": "7", "current_status": "TRAINING_JOB_RUNNING", "weights": w},
                          {"id": "8", "weights": None}])
    assert table[2] == "    weights: hf://org/m@cccccccccccc node-hit (n1), cluster-hit (n2) 11.7 MiB 2.50s"
    assert len(table) == 4
    assert summary_lines({"nodes": {"n1": [{"index": "x", "bytes": "big"}, 3]}, "staging": 5}) == [
        "weights: ? ? (n1) 0 B 0.00s"]  # the user's own files, but never a crash on junk
    if os.geteuid() == 0:  # a folder the caller does not own is not read
        os.chown(job_dir / "weights", 12345, 12345)
        assert weights_status(rec) is None


def test_team_for_user_follows_the_default_account_when_the_site_maps_accounts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Staging must publish into the tier the prolog will authorize against (SLURM_JOB_ACCOUNT)."""
    import grp
    import types

    from slurm_bt.site import hook_settings as hook_config
    from slurm_bt.weights.plan import team_for_user, team_slug

    primary = team_slug(grp.getgrgid(os.getgid()).gr_name)
    asked: list[str] = []

    def lookup() -> str | None:
        asked.append("sacctmgr")
        return "ml"

    monkeypatch.setattr(hook_config, "load_hook_settings",
                        lambda *a, **k: types.SimpleNamespace(team_groups={"ml": "mlteam"}))
    assert team_for_user((), account_lookup=lookup) == "mlteam"  # default account, mapped
    assert team_for_user(("--account=ml",), account_lookup=lookup) == "mlteam"
    assert team_for_user(("--account=other",), account_lookup=lookup) == primary  # unmapped account
    assert asked == ["sacctmgr"]  # only asked when no --account was given
    monkeypatch.setattr(hook_config, "load_hook_settings", lambda *a, **k: types.SimpleNamespace(team_groups={}))
    asked.clear()
    assert team_for_user((), account_lookup=lookup) == primary
    assert asked == []  # sites that map no accounts never pay for the lookup

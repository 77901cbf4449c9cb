"""Submission records (plain dataclass + JSON) and the stdlib-only site-file reader the job verbs use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_bt.errors import SiteConfigError
from slurm_bt.records import SubmissionRecord, list_records, read_record, write_record
from slurm_bt.site.settings import StorageRoots, load_site_settings
from slurm_bt.site.site_file import STORAGE_DEFAULTS, storage_root


def _rec(job_id: str, project: str = "p", at: str = "2026-01-01T00:00:00", **kw: object) -> SubmissionRecord:
    return SubmissionRecord(job_id=job_id, project_name=project, project_id=f"{project}-id", job_name="j",
                            submit_id="s", job_dir=f"/w/{job_id}", config_path="/c/config.py", submitted_at=at,
                            user="u", **kw)  # type: ignore[arg-type]


def test_record_round_trip_is_private_and_exact(tmp_path: Path) -> None:
    rec = _rec("12", staging_job_id="11", weights_sources=2)
    path = write_record(tmp_path, rec)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_record(tmp_path, "12") == rec
    assert json.loads(path.read_text()) == rec.as_dict()
    assert read_record(tmp_path, "13") is None


def test_record_reader_ignores_new_keys_defaults_old_ones_and_rejects_wrong_types(tmp_path: Path) -> None:
    folder = tmp_path / "records"
    folder.mkdir()
    base = _rec("1").as_dict()
    del base["staging_job_id"], base["weights_sources"]  # written by an older version
    (folder / "1.json").write_text(json.dumps({**base, "written_by": "a newer slurm-bt"}))
    got = read_record(tmp_path, "1")
    assert got is not None and got.staging_job_id is None and got.weights_sources == 0
    for i, bad in enumerate([{"job_id": 2}, {"weights_sources": True}, {"weights_sources": -1},
                             {"staging_job_id": 5}, {"user": None}], start=2):
        (folder / f"{i}.json").write_text(json.dumps({**_rec(str(i)).as_dict(), **bad}))
        assert read_record(tmp_path, str(i)) is None, bad
    missing = _rec("9").as_dict()
    del missing["job_dir"]
    (folder / "9.json").write_text(json.dumps(missing))
    (folder / "10.json").write_text("[1, 2]")
    (folder / "11.json").write_text("{not json")
    assert [read_record(tmp_path, j) for j in ("9", "10", "11")] == [None, None, None]
    assert [r.job_id for r in list_records(tmp_path)] == ["1"]


def test_list_records_filters_by_project_name_or_id_newest_first(tmp_path: Path) -> None:
    for jid, project, at in (("5", "a", "2026-01-02"), ("7", "b", "2026-01-03"), ("6", "a", "2026-01-04")):
        write_record(tmp_path, _rec(jid, project, at))
    assert [r.job_id for r in list_records(tmp_path)] == ["6", "7", "5"]
    assert [r.job_id for r in list_records(tmp_path, "a")] == ["6", "5"]
    assert [r.job_id for r in list_records(tmp_path, "a-id")] == ["6", "5"]
    assert list_records(tmp_path, "c") == []
    assert list_records(tmp_path / "nowhere") == []


def _site(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return {"SLURM_BT_SITE_CONFIG": str(path)}


def test_storage_root_defaults_and_reads_the_one_key(tmp_path: Path) -> None:
    assert storage_root("workspace", environ={}) == STORAGE_DEFAULTS["workspace"] == StorageRoots().workspace
    env = _site(tmp_path, '[storage]\nworkspace = "/lustre/{user}/bt"\n')
    assert storage_root("workspace", environ=env) == "/lustre/{user}/bt"
    assert storage_root("scratch", environ=env) == STORAGE_DEFAULTS["scratch"]


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ('[storage]\nworkspace = "relative/path"\n', "storage.workspace", "must be an absolute path"),
        ('[storage]\nworkspace = "/a/../b"\n', "storage.workspace", "must not contain '..'"),
        ("[storage]\nworkspace = 3\n", "storage.workspace", "must be a string"),
        ('storage = "x"\n', "storage", "must be a table"),
        ("[storage\n", "", "not valid TOML"),
    ],
)
def test_storage_root_errors_name_file_and_field(tmp_path: Path, text: str, field: str, message: str) -> None:
    env = _site(tmp_path, text)
    with pytest.raises(SiteConfigError) as info:
        storage_root("workspace", environ=env)
    assert info.value.source == env["SLURM_BT_SITE_CONFIG"]
    assert [(p.loc, message in p.message) for p in info.value.problems] == [(field, True)]


@pytest.mark.parametrize("value", ["/abs", "{home}/x", "rel", "/a/../b", "/a/..", "/ok/..x", "{user}/x", "/a\nb"])
def test_storage_root_applies_exactly_the_full_models_rule(tmp_path: Path, value: str) -> None:
    env = _site(tmp_path, f"[storage]\nworkspace = {json.dumps(value)}\n")
    try:
        load_site_settings(environ=env)
        full_ok = True
    except SiteConfigError:
        full_ok = False
    try:
        storage_root("workspace", environ=env)
        light_ok = True
    except SiteConfigError:
        light_ok = False
    assert light_ok == full_ok


def test_named_site_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(SiteConfigError, match="not found"):
        storage_root("workspace", environ={"SLURM_BT_SITE_CONFIG": str(tmp_path / "missing.toml")})

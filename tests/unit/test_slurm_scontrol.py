"""scontrol's, sacctmgr's and sbatch's grammar: argv refusals and parsers over 22.05 recordings
(tests/data/sacct/2205_scontrol_*), the 24.11 indexed ``Prolog[0] = ...`` form of ``show config``,
and hypothesis fuzzing: the parsers must never raise."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_bt.slurm.job_ids import JobId
from slurm_bt.slurm.sacctmgr import build_default_account_argv, parse_default_account
from slurm_bt.slurm.sbatch import build_sbatch_argv, parse_sbatch_job_id, sbatch_hint
from slurm_bt.slurm.scontrol import (
    build_hostnames_argv,
    build_release_argv,
    build_show_node_argv,
    parse_config,
    parse_hostnames,
    parse_key_values,
    parse_nodes,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_show_config_2205_recording() -> None:
    raw = text("2205_scontrol_show_config.txt")
    conf = parse_config(raw)
    assert conf["Prolog"].endswith("slurm-bt-prolog") and conf["Epilog"].endswith("slurm-bt-epilog")
    assert conf["PrologFlags"] == "Alloc,Contain,DeferBatch" and conf["PrologEpilogTimeout"] == "120"
    assert "gres/gpu" in conf["AccountingStorageTRES"] and conf["TaskProlog"] == "(null)"
    # 22.05 already indexes one list: SlurmctldHost[0]; it is read as SlurmctldHost.
    assert conf["SlurmctldHost"] == "vm(127.0.0.1)" and "SlurmctldHost[0]" not in conf
    # Otherwise the same answer as the `key = value` split admin doctor did before it used the client.
    before = {}
    for line in raw.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            before[key.strip()] = value.strip()
    before["SlurmctldHost"] = before.pop("SlurmctldHost[0]")
    assert conf == before


def test_show_config_indexed_lists_of_2411() -> None:
    # Hand-made from the 22.05 recording: 24.11 prints a list-valued key one element a line.
    raw = text("2205_scontrol_show_config.txt").replace(
        "Prolog                  = /", "Prolog[0]               = /etc/slurm/site-prolog\nProlog[1]               = /"
    )
    assert "Prolog[1]" in raw
    conf = parse_config(raw)
    assert conf["Prolog"].startswith("/etc/slurm/site-prolog,/") and conf["Prolog"].endswith("slurm-bt-prolog")
    assert "Prolog[0]" not in conf and conf["PrologFlags"] == "Alloc,Contain,DeferBatch"
    assert parse_config("Epilog[1] = /b\nEpilog[0] = /a\nEpilog[2] = (null)\n") == {"Epilog": "/a,/b"}


def test_show_node_both_forms() -> None:
    one = parse_nodes(text("2205_scontrol_show_node_oneliner.txt"))
    assert [(n["NodeName"], n["NodeAddr"], n["NodeHostName"]) for n in one] == [
        ("n1", "127.0.0.1", "vm"),
        ("n2", "127.0.0.1", "vm"),
    ]
    assert one[0]["OS"].startswith("Linux ") and one[0]["AllocTRES"] == ""
    (multi,) = parse_nodes(text("2205_scontrol_show_node_n2.txt"))
    assert {k: multi[k] for k in ("NodeName", "NodeAddr", "Port", "Gres")} == {
        "NodeName": "n2",
        "NodeAddr": "127.0.0.1",
        "Port": "6822",
        "Gres": "gpu:h100:4",
    }
    assert parse_nodes("Node n9 not found\n") == []


def test_key_values_with_spaces() -> None:
    line = (
        "JobId=6 JobName=my job UserId=bob(1001) JobState=PENDING Reason=BeginTime Restarts=2 "
        "ExitCode=0:0 Comment=tok=a b=c d WorkDir=/tmp/a b\n"
    )
    kv = parse_key_values(line)
    assert (kv["JobName"], kv["Restarts"], kv["UserId"], kv["Comment"], kv["WorkDir"]) == (
        "my job",
        "2",
        "bob(1001)",
        "tok=a b=c d",
        "/tmp/a b",
    )


def test_scontrol_argv_refuses_options() -> None:
    assert build_show_node_argv("n1") == ["scontrol", "--oneliner", "show", "node", "n1"]
    assert build_hostnames_argv("n[1-2],gpu-07") == ["scontrol", "show", "hostnames", "n[1-2],gpu-07"]
    assert build_release_argv(JobId(5)) == build_release_argv("5") == ["scontrol", "release", "5"]
    for bad in ("-a", "", "n1 n2", "n1;x"):
        with pytest.raises(ValueError):
            build_hostnames_argv(bad)
        with pytest.raises(ValueError):
            build_show_node_argv(bad)
    with pytest.raises(ValueError):
        build_release_argv("--all")
    assert parse_hostnames("n1\nn2\n") == ["n1", "n2"]


def test_sacctmgr_default_account() -> None:
    assert build_default_account_argv("btu1") == [
        "sacctmgr", "-n", "-P", "show", "user", "btu1", "format=DefaultAccount"
    ]
    for bad in ("-a", "name=x", "", "a b"):
        with pytest.raises(ValueError):
            build_default_account_argv(bad)
    assert parse_default_account("\nbtteam1\n") == "btteam1" and parse_default_account("  \n") is None


def test_sbatch_answers() -> None:
    assert build_sbatch_argv(["--nodes=2", 3]) == ["sbatch", "--parsable", "--nodes=2", "3"]  # type: ignore[list-item]
    assert parse_sbatch_job_id("123\n") == JobId(123)
    assert parse_sbatch_job_id("123;btdev\n") == JobId(123)
    assert parse_sbatch_job_id("Submitted batch job\n") is None and parse_sbatch_job_id("") is None
    assert "sinfo -s" in sbatch_hint("sbatch: error: invalid partition specified: x")
    assert "--dry-run" in sbatch_hint("sbatch: error: something new")


@settings(max_examples=300)
@given(st.one_of(st.text(), st.text(alphabet=st.sampled_from(list("NodeNam=Prolg[]01 \n(null)")), max_size=300)))
def test_scontrol_parsers_never_raise(blob: str) -> None:
    assert isinstance(parse_config(blob), dict)
    assert all(isinstance(n, dict) for n in parse_nodes(blob))
    assert isinstance(parse_hostnames(blob), list) and isinstance(parse_key_values(blob), dict)
    parse_default_account(blob)
    parse_sbatch_job_id(blob)

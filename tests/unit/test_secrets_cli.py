"""`slurm-bt secrets`: values come from stdin or a hidden prompt, never argv, and are never echoed."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from slurm_bt.cli import secrets_cmd
from slurm_bt.cli.secrets_cmd import STORE_META_KEY, secrets_group
from slurm_bt.errors import SecretError
from slurm_bt.secrets_store import SecretStore

CANARY = "CANARY-41d8-never-print-me"


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "secrets"


def run(store_dir: Path, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(secrets_group, ["--store", str(store_dir), *args], input=input)


def test_set_reads_stdin_and_strips_one_newline(store_dir: Path) -> None:
    result = run(store_dir, "set", "hf_token", input=f"{CANARY}\n")
    assert result.exit_code == 0, result.output
    assert SecretStore(store_dir).get("hf_token") == CANARY
    assert CANARY not in result.output
    assert "hf_token" in result.output  # the confirmation goes to stderr, which CliRunner mixes in

    run(store_dir, "set", "two", input="value\n\n")
    assert SecretStore(store_dir).get("two") == "value\n"
    run(store_dir, "set", "crlf", input="value\r\n")
    assert SecretStore(store_dir).get("crlf") == "value"
    run(store_dir, "set", "bare", input="value")
    assert SecretStore(store_dir).get("bare") == "value"


def test_set_prompts_hidden_on_a_terminal(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    def fake_prompt(text: str, **kwargs: Any) -> str:
        calls.append({"text": text, **kwargs})
        return CANARY

    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr(click, "prompt", fake_prompt)
    store = SecretStore(store_dir)
    ctx = click.Context(secrets_group, obj=store)
    with ctx:
        ctx.invoke(secrets_cmd.set_cmd, name="tok")
    assert calls and calls[0]["hide_input"] is True
    assert store.get("tok") == CANARY


def test_value_is_never_an_argument(store_dir: Path) -> None:
    result = run(store_dir, "set", "tok", CANARY)
    assert result.exit_code == 2  # click usage error: unexpected extra argument
    assert not (store_dir / "tok").exists()


def test_list_prints_names_only(store_dir: Path) -> None:
    store = SecretStore(store_dir)
    store.set("b", CANARY)
    store.set("a", CANARY)
    result = run(store_dir, "list")
    assert result.exit_code == 0
    assert result.output == "a\nb\n"


def test_list_empty_store(store_dir: Path) -> None:
    result = run(store_dir, "list")
    assert result.exit_code == 0
    assert result.output == ""


def test_rm(store_dir: Path) -> None:
    SecretStore(store_dir).set("tok", CANARY)
    result = run(store_dir, "rm", "tok")
    assert result.exit_code == 0
    assert SecretStore(store_dir).names() == []


def test_rm_missing_raises_secret_error(store_dir: Path) -> None:
    result = run(store_dir, "rm", "tok")
    assert isinstance(result.exception, SecretError)
    assert "no such secret" in str(result.exception)


def test_bad_name_fails_before_reading_stdin(store_dir: Path) -> None:
    stdin = io.BytesIO(CANARY.encode())
    result = CliRunner().invoke(secrets_group, ["--store", str(store_dir), "set", "../etc"], input=stdin)
    assert isinstance(result.exception, SecretError)
    assert result.exception.exit_code == 2
    assert stdin.tell() == 0
    assert CANARY not in str(result.exception)
    assert not store_dir.exists()


def test_usage_errors_exit_2(store_dir: Path) -> None:
    assert run(store_dir, "set").exit_code == 2
    assert run(store_dir, "nope").exit_code == 2
    assert run(store_dir, "rm").exit_code == 2


def test_store_from_parent_context_meta(store_dir: Path) -> None:
    @click.group()
    @click.pass_context
    def main(ctx: click.Context) -> None:
        ctx.meta[STORE_META_KEY] = SecretStore(store_dir)

    main.add_command(secrets_group)
    result = CliRunner().invoke(main, ["secrets", "set", "tok"], input="v\n")
    assert result.exit_code == 0, result.output
    assert SecretStore(store_dir).get("tok") == "v"


def test_default_store_when_nothing_given(monkeypatch: pytest.MonkeyPatch, store_dir: Path) -> None:
    monkeypatch.setattr(SecretStore, "default", classmethod(lambda cls: cls(store_dir)))
    result = CliRunner().invoke(secrets_group, ["set", "tok"], input="v\n")
    assert result.exit_code == 0, result.output
    assert SecretStore(store_dir).get("tok") == "v"

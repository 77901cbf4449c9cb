"""The per-user secret store: private files only, safe names, and values never in messages."""

from __future__ import annotations

import logging
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.errors import BtError, SecretError, StorageError
from slurm_bt.secrets_store import (
    DEFAULT_STORE_SUBDIR,
    MAX_SECRET_BYTES,
    SecretStore,
    check_secret_name,
)

IS_ROOT = os.getuid() == 0
CANARY = "CANARY-7f3a9c-do-not-leak"


@pytest.fixture
def store(tmp_path: Path) -> SecretStore:
    return SecretStore(tmp_path / "home" / ".config" / "slurm-bt" / "secrets")


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def assert_no_canary(exc: BaseException) -> None:
    """Neither the error nor anything it chains to may show the value."""
    seen: BaseException | None = exc
    while seen is not None:
        for text in (str(seen), repr(seen), repr(seen.args)):
            assert CANARY not in text
        if isinstance(seen, BtError):
            assert all(CANARY not in line for line in seen.lines())
        seen = seen.__cause__ or seen.__context__


# --- round trip ---------------------------------------------------------------------------------


def test_set_get_names_remove(store: SecretStore, umask0: None) -> None:
    assert store.names() == []
    store.set("hf_token", "abc")
    store.set("b.key-2", "line1\nline2")
    assert store.get("hf_token") == "abc"
    assert store.get("b.key-2") == "line1\nline2"
    assert store.names() == ["b.key-2", "hf_token"]
    assert mode_of(store.root) == 0o700
    assert mode_of(store.root / "hf_token") == 0o600
    for parent in (store.root.parent, store.root.parent.parent):
        assert mode_of(parent) == 0o700  # created by us, so private too
    store.remove("hf_token")
    assert store.names() == ["b.key-2"]
    with pytest.raises(SecretError, match="no such secret"):
        store.get("hf_token")


def test_set_replaces_value_atomically(store: SecretStore) -> None:
    store.set("tok", "one")
    store.set("tok", "two")
    assert store.get("tok") == "two"
    assert os.listdir(store.root) == ["tok"]


def test_failed_set_keeps_old_value_and_leaves_no_temp(
    store: SecretStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.set("tok", "old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(StorageError) as info:
        store.set("tok", CANARY)
    assert_no_canary(info.value)
    monkeypatch.undo()
    assert store.get("tok") == "old"
    assert os.listdir(store.root) == ["tok"]


def test_set_replaces_planted_symlink_without_writing_through(store: SecretStore, tmp_path: Path) -> None:
    store.set("x", "x")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (store.root / "tok").symlink_to(victim)
    store.set("tok", "mine")
    assert victim.read_text() == "precious"
    assert store.get("tok") == "mine"


def test_names_skip_temp_files_and_non_files(store: SecretStore) -> None:
    store.set("a", "1")
    (store.root / ".a.tmp-1-abc").write_text("partial")
    (store.root / "subdir").mkdir()
    (store.root / "link").symlink_to(store.root / "a")
    assert store.names() == ["a"]


def test_missing(store: SecretStore) -> None:
    assert store.missing(["a", "b", "a"]) == ["a", "b"]  # no store yet
    store.set("a", "1")
    assert store.missing(["a", "b", "a", "c"]) == ["b", "c"]
    assert store.missing([]) == []


def test_missing_reports_every_invalid_name(store: SecretStore) -> None:
    with pytest.raises(SecretError) as info:
        store.missing(["ok", "a/b", "../x"])
    assert len(info.value.problems) == 2


def test_missing_refuses_insecure_store(store: SecretStore) -> None:
    store.set("a", "1")
    (store.root / "a").chmod(0o644)
    with pytest.raises(SecretError, match="chmod 600"):
        store.missing(["a"])


def test_default_uses_passwd_not_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    expected = Path(pwd.getpwuid(os.getuid()).pw_dir) / DEFAULT_STORE_SUBDIR
    assert SecretStore.default().root == expected
    assert expected == Path(pwd.getpwuid(os.getuid()).pw_dir, ".config", "slurm-bt", "secrets")


def test_repr_shows_root_only(store: SecretStore) -> None:
    store.set("tok", CANARY)
    assert CANARY not in repr(store)
    assert str(store.root) in repr(store)


# --- names --------------------------------------------------------------------------------------

BAD_NAMES = [
    "",
    "a/b",
    "../x",
    "..",
    "/etc/passwd",
    ".hidden",
    "-dash",
    "a..b",
    "a b",
    "a\nb",
    "x" * 129,
    "é",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_rejected_everywhere(store: SecretStore, name: str) -> None:
    assert check_secret_name(name) is not None
    for call in (lambda: store.set(name, "v"), lambda: store.get(name), lambda: store.remove(name)):
        with pytest.raises(SecretError) as info:
            call()
        assert repr(name) in str(info.value)  # the message names the reference
        assert info.value.exit_code == 2
    assert not store.root.exists()  # nothing created for a bad name


@pytest.mark.parametrize("name", ["a", "A9", "hf_token", "aws.secret-key", "0" * 128])
def test_good_names(name: str) -> None:
    assert check_secret_name(name) is None


# --- permissions and file types --------------------------------------------------------------


def test_group_readable_dir_refused_with_fix(store: SecretStore) -> None:
    store.set("tok", CANARY)
    store.root.chmod(0o750)
    with pytest.raises(SecretError) as info:
        store.get("tok")
    assert f"chmod 700 {store.root}" in str(info.value)
    assert "mode 0750" in str(info.value)
    assert_no_canary(info.value)


def test_other_readable_file_refused_with_fix(store: SecretStore) -> None:
    store.set("tok", CANARY)
    (store.root / "tok").chmod(0o604)
    with pytest.raises(SecretError) as info:
        store.get("tok")
    assert f"chmod 600 {store.root / 'tok'}" in str(info.value)
    assert_no_canary(info.value)


def test_set_tightens_a_loose_store_dir(store: SecretStore) -> None:
    store.set("tok", "v")
    store.root.chmod(0o755)
    store.set("tok2", "v")
    assert mode_of(store.root) == 0o700


def test_symlinked_secret_file_refused(store: SecretStore, tmp_path: Path) -> None:
    store.set("x", "x")
    target = tmp_path / "elsewhere"
    target.write_text(CANARY)
    target.chmod(0o600)
    (store.root / "tok").symlink_to(target)
    with pytest.raises(SecretError, match="symlink") as info:
        store.get("tok")
    assert_no_canary(info.value)


def test_symlinked_store_dir_refused(tmp_path: Path) -> None:
    real = SecretStore(tmp_path / "real")
    real.set("tok", CANARY)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    linked = SecretStore(tmp_path / "link")
    with pytest.raises(SecretError, match="symlink") as info:
        linked.get("tok")
    assert_no_canary(info.value)
    with pytest.raises(SecretError, match="symlink"):
        linked.names()
    with pytest.raises(StorageError, match="symlink"):
        linked.set("tok", "x")
    assert real.get("tok") == CANARY


def test_fifo_secret_refused_without_hanging(store: SecretStore) -> None:
    store.set("x", "x")
    os.mkfifo(store.root / "tok", 0o600)
    with pytest.raises(SecretError, match="not a regular file"):
        store.get("tok")


@pytest.mark.skipif(not IS_ROOT, reason="needs root to chown")
def test_foreign_owned_file_refused(store: SecretStore) -> None:
    store.set("tok", CANARY)
    os.chown(store.root / "tok", 12345, 12345)
    with pytest.raises(SecretError, match="owned by uid 12345") as info:
        store.get("tok")
    assert_no_canary(info.value)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to chown")
def test_foreign_owned_dir_refused(store: SecretStore) -> None:
    store.set("tok", CANARY)
    os.chown(store.root, 12345, 12345)
    with pytest.raises(SecretError, match="owned by uid 12345"):
        store.get("tok")
    with pytest.raises(StorageError, match="owned by uid 12345"):
        store.set("tok", "x")


# --- values never leak ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, reason",
    [
        ("", "empty"),
        (f"{CANARY}\0tail", "NUL"),
        (f"{CANARY}\udcff", "not valid Unicode"),
        (CANARY * (MAX_SECRET_BYTES // len(CANARY) + 1), "larger than"),
    ],
)
def test_bad_values_rejected_without_echo(store: SecretStore, value: str, reason: str) -> None:
    with pytest.raises(SecretError, match=reason) as info:
        store.set("tok", value)
    assert_no_canary(info.value)
    assert not (store.root / "tok").exists()


def test_corrupt_file_errors_do_not_leak(store: SecretStore) -> None:
    store.set("tok", "x")
    (store.root / "tok").write_bytes(CANARY.encode() + b"\xff\xfe")
    with pytest.raises(SecretError, match="not valid UTF-8") as info:
        store.get("tok")
    assert_no_canary(info.value)
    (store.root / "tok").write_bytes(CANARY.encode() * (MAX_SECRET_BYTES // len(CANARY) + 1))
    with pytest.raises(SecretError, match="larger than") as info:
        store.get("tok")
    assert_no_canary(info.value)


def test_canary_never_in_logs_or_messages(
    store: SecretStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store.set("tok", CANARY)
    errors: list[BaseException] = []
    (store.root / "tok").chmod(0o640)
    for call in (lambda: store.get("tok"), lambda: store.missing(["tok"]), lambda: store.get("nope")):
        try:
            call()
        except BtError as exc:
            errors.append(exc)
    assert len(errors) == 3
    for error in errors:
        assert_no_canary(error)
    assert CANARY not in caplog.text
    assert CANARY not in repr(store) + str(store)

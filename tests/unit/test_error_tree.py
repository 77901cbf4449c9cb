"""The one error tree (slurm_bt/errors.py) and the CLI's one mapping to messages and exit codes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurm_bt import errors
from slurm_bt.cli.errors import handle_errors

ROOT = Path(__file__).resolve().parents[2]
_ERROR_CLASS = re.compile(r"(Error|Exception|Fault|Timeout|Deadline\w*|Exceeded|Location)$")


def test_every_public_error_class_lives_in_errors_py() -> None:
    """No module but errors.py defines a public exception deriving from BtError or Exception directly.

    Private control-flow exceptions (``_Moved``) and the base layer's builtin-typed ones (posix/,
    site/hook_settings: callers catch them as ``OSError``/``ValueError``) are the documented exceptions.
    """
    allowed = {"UntrustedPath", "UnsafeEntry", "UnsafeFile", "ChildError", "ChildTimeout", "PrivilegeDropError",
               "HookEnvError", "TeamError", "HookConfigError", "LayoutOwnerError", "NotRegularFile"}
    stray = []
    for path in sorted((ROOT / "slurm_bt").rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "slurm_bt":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and node.bases:
                bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
                if (_ERROR_CLASS.search(node.name) or bases & set(errors.__all__) or bases & {"Exception"}) \
                        and node.name not in allowed and any(_ERROR_CLASS.search(b) for b in bases):
                    stray.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert stray == []


def test_tree_shape() -> None:
    assert issubclass(errors.HookUserError, errors.HookError) and issubclass(errors.NodeFault, errors.HookError)
    assert issubclass(errors.WeightsJobError, errors.HookUserError)
    assert not issubclass(errors.HookDeadline, Exception)  # no ``except Exception`` in a hook step swallows it
    assert issubclass(errors.DeadlineExceeded, errors.RuntimeFailure)
    assert issubclass(errors.MissingExtraError, errors.StorageError)
    # one integrity error: a checkpoint's is not a weights source failure; a source's is both
    assert not issubclass(errors.IntegrityError, errors.SourceError)
    assert issubclass(errors.SourceIntegrityError, errors.IntegrityError)
    assert issubclass(errors.SourceIntegrityError, errors.SourceError)
    assert issubclass(errors.CacheIntegrityError, errors.IntegrityError)


def test_integrity_messages() -> None:
    e = errors.IntegrityError("s3://b/p", "checkpoint file does not match the index", file="x.pt",
                              expected="aa", actual="bb", offset=3)
    assert str(e) == "s3://b/p: file 'x.pt' at byte 3: checkpoint file does not match the index (expected aa, got bb)"
    s = errors.SourceIntegrityError("hf://o/m", "sha256 mismatch; not published", file="w", expected="1", actual="2")
    assert str(s) == "hf://o/m: file 'w': sha256 mismatch; not published (expected 1, got 2)"
    assert s.transient is False and s.file == "w" and s.offset is None
    c = errors.CacheIntegrityError("/c/b", "aa", "bb", 3, 4)
    assert c.expected == "aa" and c.actual == "bb" and "content mismatch" in str(c)


def _run(exc: BaseException) -> tuple[int, str]:
    @click.command()
    def cmd() -> None:
        with handle_errors("slurm-bt"):
            raise exc

    result = CliRunner().invoke(cmd, [])
    return result.exit_code, result.output


def test_cli_missing_optional_package_names_the_extra() -> None:
    code, out = _run(ModuleNotFoundError("No module named 'boto3'", name="boto3"))
    assert code == 1 and "pip install 'slurm-bt[s3]'" in out and "internal error" not in out
    code, out = _run(errors.MissingExtraError("gs://b", "gs", "gcs", "gcsfs"))
    assert code == 1 and "pip install 'slurm-bt[gcs]'" in out and "internal error" not in out
    code, out = _run(ModuleNotFoundError("No module named 'nonesuch'", name="nonesuch"))
    assert code == 1 and "internal error" in out


@pytest.mark.parametrize(("exc", "code"), [
    (errors.ConfigError("config.py", [errors.Problem("job.x", "bad")]), 2),
    (errors.DeadlineExceeded("ckpt-1"), 1),
    (errors.HookUserError("why"), 1),
    (errors.StorageError("/p", "gone"), 1),
])
def test_cli_exit_codes(exc: BaseException, code: int) -> None:
    got, out = _run(exc)
    assert got == code and "internal error" not in out

"""skopeo, run as the calling user with credentials in a private 0600 file (never argv or environment).

Why skopeo (Debian package): it speaks the registry protocol (token auth, redirects to blob storage,
manifest lists, retries) and verifies every blob it copies against its digest; a hand-written client
would have to re-do all of that. It runs with:

* ``--authfile /proc/self/fd/N``, a memfd inherited by skopeo: credentials never appear in argv
  (``ps``), in an environment or on any filesystem, and vanish with the processes (kill -9 included);
* ``--cert-dir`` holding the site's CA bundle (``[containers] ca_bundle``) when one is set;
* ``--policy`` our own accept-anything signature policy: images are pinned by digest at submit and
  every blob is verified against it; signature verification is not done (docs/containers.md);
* ``HOME``/``XDG_RUNTIME_DIR`` pointed at the temp directory, so no other credential file of the
  user is read behind the DockerAuth's back;
* a wall-clock bound (killed with its process group when it runs over).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_bt.errors import RegistryToolError

__all__ = ["RegistryAccess", "registry_access", "run_skopeo"]

SKOPEO = "/usr/bin/skopeo"
_KIND_RULES = (
    # classified from skopeo's stderr (it has no machine-readable errors); most specific first.
    # Network failures first: their text carries ports and addresses ("127.0.0.1:40123"), which a
    # bare "401" needle would read as an HTTP status. Status codes only as whole words, and a local
    # "permission denied" (a file skopeo could not write) is not a registry's refusal.
    ("unreachable", re.compile(r"connection refused|no such host|i/o timeout|network is unreachable|"
                               r"connection reset|tls handshake timeout|no route to host")),
    ("auth", re.compile(r"unauthorized|authentication required|(?<!permission )denied|"
                        r"invalid username/password|\b40[13]\b")),
    ("not_found", re.compile(r"manifest unknown|name unknown|not found|\b404\b|no such image")),
    ("integrity", re.compile(r"digest did not match|digest mismatch|doesn't match|does not match|"
                             r"size mismatch|content digest")),
)


@dataclass(frozen=True)
class RegistryAccess:
    """Arguments that give skopeo the credentials and CAs of one operation."""

    tmp: Path
    auth_fd: int  # a memfd holding the auth JSON, passed to skopeo (never on a filesystem)
    cert_dir: Path | None
    policy: Path

    @property
    def authfile(self) -> str:
        """The path skopeo opens: the inherited memfd, reopened through /proc (any number of times)."""
        return f"/proc/self/fd/{self.auth_fd}"

    def args(self, *, src: bool = False) -> list[str]:
        """Authfile, cert dir and TLS flags (``--src-*`` spelling for ``copy``'s source)."""
        pre = "--src-" if src else "--"
        out = [f"{pre}authfile", self.authfile]
        if self.cert_dir is not None:
            out += [f"{pre}cert-dir", str(self.cert_dir)]
        return out

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.tmp), "XDG_RUNTIME_DIR": str(self.tmp),
                "LANG": "C.UTF-8", "TMPDIR": str(self.tmp)}


@contextlib.contextmanager
def registry_access(registry: str, login: tuple[str, str] | None, ca_bundle: str | None,
                    tmp_parent: str | None = None) -> Iterator[RegistryAccess]:
    """The credentials (``login`` for ``registry``, else none) in a memfd, and a private temp dir with
    the signature policy and the CA dir.

    Why a memfd and not a 0600 file: it exists only while this process (and the skopeo it starts)
    holds it, so a ``kill -9`` of the staging job leaves no credential anywhere, not even in the
    user's own /tmp.
    """
    tmp = Path(tempfile.mkdtemp(prefix="bt-registry-", dir=tmp_parent))
    auth_fd = os.memfd_create("bt-registry-auth", os.MFD_CLOEXEC)
    try:
        os.chmod(tmp, 0o700)
        auths: dict[str, object] = {}
        if login is not None:
            import base64

            auths[registry] = {"auth": base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()}
        os.write(auth_fd, json.dumps({"auths": auths}).encode())
        policy = tmp / "policy.json"
        _write_private(policy, b'{"default":[{"type":"insecureAcceptAnything"}]}')
        cert_dir = None
        # A CA file that does not exist adds nothing (TLS is still verified against the system's CAs):
        # the default names the dev cluster's, absent elsewhere.
        if ca_bundle and os.path.lexists(ca_bundle):
            cert_dir = tmp / "certs"
            cert_dir.mkdir(mode=0o700)
            # skopeo reads *.crt of the directory as CAs; a copy, so the site file need not be named so
            _write_private(cert_dir / "ca.crt", _read_ca(Path(ca_bundle)))
        yield RegistryAccess(tmp=tmp, auth_fd=auth_fd, cert_dir=cert_dir, policy=policy)
    finally:
        os.close(auth_fd)
        shutil.rmtree(tmp, ignore_errors=True)


def _read_ca(path: Path) -> bytes:
    """The site's CA file: a regular file (no symlink, no FIFO), at most 4 MiB."""
    from slurm_bt.weights.cache_layout import open_regular

    fd = open_regular(path)
    try:
        data = os.read(fd, 4 << 20)
    finally:
        os.close(fd)
    return data


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def classify(stderr: str) -> str:
    """The failure kind of a skopeo error message."""
    low = stderr.lower()
    for kind, pattern in _KIND_RULES:
        if pattern.search(low):
            return kind
    return "unreachable"


def run_skopeo(argv: Sequence[str], access: RegistryAccess, *, timeout_s: float, max_stdout: int = 16 << 20,
               stdout_path: Path | None = None) -> bytes:
    """Run ``skopeo <argv>`` (the global ``--policy`` added); stdout, capped at ``max_stdout``.

    Raises:
        RegistryToolError: non-zero exit (classified), over time, or too much output.
    """
    full = [SKOPEO, "--policy", str(access.policy), *argv]
    with tempfile.TemporaryFile(dir=access.tmp) as out, tempfile.TemporaryFile(dir=access.tmp) as err:
        proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=access.env(),
                                start_new_session=True, close_fds=True, pass_fds=(access.auth_fd,))
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RegistryToolError("timeout", f"skopeo {argv[0]} did not finish within {timeout_s:.0f}s") from None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        err.seek(0)
        msg = err.read(64 << 10).decode(errors="replace").strip()
        if rc != 0:
            # the last line is skopeo's summary; strip its "time=... level=fatal msg=" prefix
            last = msg.splitlines()[-1] if msg else f"exit {rc}"
            last = last.split('msg="', 1)[-1].rstrip('"')
            raise RegistryToolError(classify(msg), last[:600])
        if os.fstat(out.fileno()).st_size > max_stdout:
            raise RegistryToolError("integrity", f"skopeo {argv[0]} printed more than {max_stdout} bytes")
        out.seek(0)
        return out.read()

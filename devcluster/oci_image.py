"""Build small OCI images from the host's own files, and run a TLS registry: no Docker, no network.

Used by the dev cluster (``devcluster.py up`` serves the quick start's ``library/python:3.11-slim``
through the site's registry mirror) and by the tests (tests/servers/oci_registry.py,
tests/servers/oci_images.py). Standard library only, because devcluster.py runs under /usr/bin/python3
before slurm-bt's venv exists.

Tools (Debian packages, installed by scripts/install.sh): ``umoci`` writes the OCI layout and its
layers (``init``/``new``/``unpack``/``repack``), ``skopeo`` pushes it (``copy oci:… docker://…``),
``docker-registry`` (the CNCF distribution registry) serves it, ``openssl`` makes the CA and the server
certificate, ``htpasswd`` (apache2-utils) the users of a private registry.

Why the host's files: the example image must run the quick start's training loop (python3) and the
tests need a shell and coreutils, while nothing may be downloaded. The root filesystem is python3 with
its stdlib, bash and a few coreutils, the ld.so closure of those binaries (from ``ldd``), and what
ch-run binds into an image (/etc/passwd, /etc/group, /etc/hosts, /etc/resolv.conf, /dev, /proc, /sys,
/tmp, /home). The base layout is cached under /var/tmp (keyed by the host python's version) so tests do
not rebuild it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "BASE_TOOLS",
    "Registry",
    "base_layout",
    "build_rootfs",
    "make_ca",
    "push",
    "registry_config",
    "write_authfile",
]

CACHE_ROOT = Path("/var/tmp/slurm-bt-oci")
# What the images' shell scripts and the tests run inside an image.
BASE_TOOLS = ("bash", "sh", "cat", "ls", "env", "id", "sleep", "mkdir", "rm", "cp", "echo", "true", "false",
              "head", "tail", "wc", "sha256sum", "stat", "readlink", "dirname", "basename", "touch", "tr",
              "sort", "uname", "hostname", "grep", "sed", "chmod", "date", "timeout")
# Directories and files ch-run binds over (it cannot create mount points in a read-only squashfs).
CH_RUN_DIRS = ("dev", "proc", "sys", "tmp", "home", "mnt", "run", "var/tmp", "root")
CH_RUN_FILES = ("etc/passwd", "etc/group", "etc/hosts", "etc/resolv.conf")
_SKIP_STDLIB = re.compile(r"(^|/)(__pycache__|test|tests|idlelib|tkinter|turtledemo|ensurepip|lib2to3|"
                          r"pydoc_data|config-[^/]*)(/|$)")


def _run(argv: list[str], timeout: float = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc  # type: ignore[no-any-return]


def _copy_host_file(src: str, root: Path) -> None:
    """Copy ``src`` (and, for a symlink, its target chain) to the same path under ``root``."""
    p = Path(src)
    seen = 0
    while seen < 16:
        seen += 1
        dst = root / str(p).lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            target = os.readlink(p)
            if not dst.is_symlink() and not dst.exists():
                os.symlink(target, dst)
            p = (p.parent / target) if not target.startswith("/") else Path(target)
            continue
        if not dst.exists():
            shutil.copy2(p, dst)
        return


def _ldd_closure(binaries: list[str]) -> set[str]:
    libs: set[str] = set()
    for b in binaries:
        out = subprocess.run(["ldd", b], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+)\s+\(0x", line)
            if m:
                libs.add(m.group(1))
    return libs


def _host_python() -> str:
    """``pythonX.Y`` of /usr/bin/python3 (the interpreter the image gets)."""
    out = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(f'python{sys.version_info[0]}."
                          "{sys.version_info[1]}')"], capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip()


def build_rootfs(root: Path, *, with_python: bool = True) -> None:
    """Assemble the minimal root filesystem in ``root`` (must not exist) from the host's files."""
    root.mkdir(parents=True)
    for d in ("usr/bin", "usr/lib", "etc", *CH_RUN_DIRS):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
        os.symlink(target, root / link)
    (root / "usr/lib64").mkdir(exist_ok=True)
    os.chmod(root / "tmp", 0o1777)  # noqa: S103 - the image's /tmp, as on any system
    binaries = [p for p in (shutil.which(t, path="/usr/bin:/bin") for t in BASE_TOOLS) if p]
    if with_python:
        binaries.append(os.path.realpath("/usr/bin/python3"))
    for b in binaries:
        dst = root / "usr/bin" / os.path.basename(b)
        if not dst.exists():
            shutil.copy2(os.path.realpath(b), dst)
    if with_python:
        os.symlink(os.path.basename(os.path.realpath("/usr/bin/python3")), root / "usr/bin/python3")
        os.symlink("python3", root / "usr/bin/python")
        ver = _host_python()  # the copied binary's stdlib, whichever interpreter runs this builder
        std = Path("/usr/lib") / ver
        for dirpath, dirnames, filenames in os.walk(std):
            rel = os.path.relpath(dirpath, std)
            if rel != "." and _SKIP_STDLIB.search(rel):
                dirnames[:] = []
                continue
            dirnames[:] = [d for d in dirnames if not _SKIP_STDLIB.search(d)]
            for f in filenames:
                _copy_host_file(os.path.join(dirpath, f), root)
        dyn = std / "lib-dynload"
        binaries += [str(p) for p in dyn.glob("*.so")] if dyn.is_dir() else []
    for lib in _ldd_closure(binaries):
        _copy_host_file(lib, root)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    (root / "etc/resolv.conf").write_text("")
    (root / "etc/os-release").write_text('NAME="slurm-bt test image"\nID=slurmbt\n')


def _umoci_add_layer(layout: Path, tag: str, new_tag: str, fill: object) -> None:
    """``umoci unpack`` ``tag``, let ``fill(rootfs)`` change it, ``repack`` as ``new_tag`` (one new layer)."""
    with tempfile.TemporaryDirectory(dir=layout.parent, prefix=".bundle-") as tmp:
        bundle = Path(tmp) / "b"
        _run(["umoci", "unpack", "--rootless", "--image", f"{layout}:{tag}", str(bundle)])
        fill(bundle / "rootfs")  # type: ignore[operator]
        if new_tag != tag:
            _run(["umoci", "tag", "--image", f"{layout}:{tag}", new_tag])
        _run(["umoci", "repack", "--image", f"{layout}:{new_tag}", str(bundle)])


def _build_once(final: Path, complete: str, build: object) -> Path:
    """``final``, built by ``build(dest)`` unless ``final/complete`` exists already.

    ``build`` creates ``dest`` under a temp name in ``final``'s folder, which is then renamed into
    place: a killed builder leaves nothing that is ever used, and a builder that loses the race to
    another uses the winner's. The cache is read by the test users' jobs and written by root only.
    """
    if (final / complete).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(final.parent, 0o755)  # noqa: S103 - see the docstring
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        dest = tmp / "out"
        build(dest)  # type: ignore[operator]
        os.chmod(dest, 0o755)  # noqa: S103 - see the docstring
        try:
            os.rename(dest, final)
        except OSError:  # another builder won the race: use theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def base_layout(cache_root: Path = CACHE_ROOT) -> Path:
    """The cached OCI layout holding tag ``base``: one layer with :func:`build_rootfs`'s files.

    Built once per host python version (:func:`_build_once`).
    """
    host = os.stat(os.path.realpath("/usr/bin/python3"))
    key = hashlib.sha256(f"{_host_python()}|{host.st_size}|{host.st_mtime_ns}|{sorted(BASE_TOOLS)}|v3".encode()
                         ).hexdigest()[:16]

    def build(layout: Path) -> None:
        _run(["umoci", "init", "--layout", str(layout)])
        _run(["umoci", "new", "--image", f"{layout}:base"])

        def fill(rootfs: Path) -> None:
            shutil.rmtree(rootfs)
            build_rootfs(rootfs)

        _umoci_add_layer(layout, "base", "base", fill)
        _run(["umoci", "config", "--image", f"{layout}:base", "--config.env",
              "PATH=/usr/local/bin:/usr/bin:/bin", "--config.cmd", "/bin/bash", "--os", "linux",
              "--architecture", "amd64"])
        _run(["umoci", "gc", "--layout", str(layout)])

    return _build_once(cache_root / f"base-{key}", "index.json", build)


def derive(base: Path, dest: Path, tag: str, files: dict[str, bytes], *, remove: tuple[str, ...] = (),
           big_random_bytes: int = 0) -> Path:
    """A copy of the ``base`` layout at ``dest`` with tag ``tag``: base + one layer adding ``files``
    (path → content, under the root), whiting out ``remove`` (OCI whiteouts), and a random file of
    ``big_random_bytes`` at /opt/big.bin (a layer that does not compress, for the bench)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(base, dest, symlinks=True)

    def fill(rootfs: Path) -> None:
        for rel, data in files.items():
            p = rootfs / rel.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            os.chmod(p, 0o755 if data.startswith(b"#!") else 0o644)
        for rel in remove:
            p = rootfs / rel.lstrip("/")
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
        if big_random_bytes:
            p = rootfs / "opt/big.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "wb") as f:
                left = big_random_bytes
                while left:
                    n = min(left, 8 << 20)
                    f.write(os.urandom(n))
                    left -= n

    _umoci_add_layer(dest, "base", tag, fill)
    return dest


def _pip_venv(cache_root: Path) -> Path:
    """A venv of /usr/bin/python3 (the image's interpreter) whose pip installs the image's packages.

    The image runs the host's /usr/bin/python3, so wheels must match its version and ABI: pip of a venv
    made from that very interpreter picks them (and honours the machine's pip configuration: its index,
    find-links and constraints)."""
    return _build_once(cache_root / f"pip-venv-{_host_python()}", "bin/python",
                       lambda dest: _run(["/usr/bin/python3", "-m", "venv", str(dest)], timeout=300))


def _install_pip_packages(rootfs: Path, packages: list[str], cache_root: Path) -> None:
    """``pip install --target`` into the image's site directory, then make it runnable inside the image:
    console scripts point at /usr/bin/python3, and every shared library the packages' extensions load
    from the host (libstdc++, libgomp, ...) is copied in (the base image holds only python's closure)."""
    site = rootfs / "usr/local/lib" / _host_python() / "dist-packages"  # on Debian's python3 sys.path
    site.mkdir(parents=True, exist_ok=True)
    venv = _pip_venv(cache_root)
    _run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "--no-warn-script-location", "--target", str(site), *packages], timeout=1800)
    scripts = site / "bin"
    if scripts.is_dir():
        dest = rootfs / "usr/local/bin"
        dest.mkdir(parents=True, exist_ok=True)
        for script in scripts.iterdir():
            data = script.read_bytes()
            if data.startswith(b"#!"):  # pip wrote the builder venv's interpreter: the image has its own
                data = b"#!/usr/bin/python3" + data[data.index(b"\n"):]
            (dest / script.name).write_bytes(data)
            os.chmod(dest / script.name, 0o755)  # noqa: S103 - a command every image user runs
        shutil.rmtree(scripts)
    extensions = [str(p) for p in site.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    for lib in _ldd_closure(extensions):
        if not lib.startswith(str(rootfs)) and not (rootfs / lib.lstrip("/")).exists():
            _copy_host_file(lib, rootfs)


def _tree_digest(src: Path | None) -> str:
    h = hashlib.sha256()
    if src is None:
        return "-"
    for dirpath, dirnames, filenames in sorted(os.walk(src)):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(src)).encode() + b"\0")
            h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
    return h.hexdigest()


def python_image(packages: list[str], from_dir: Path | None = None, cache_root: Path = CACHE_ROOT) -> Path:
    """The cached OCI layout whose tag ``image`` is the base image plus one layer holding ``packages``
    (pip requirement strings, installed for the image's python) and ``from_dir``'s tree.

    Keyed by the base, the package list and the tree's bytes; built under a temp name and renamed, so a
    killed build is never used and a second call is a lookup."""
    base = base_layout(cache_root)
    key = hashlib.sha256(f"{base.name}|{sorted(packages)}|{_tree_digest(from_dir)}|v1".encode()).hexdigest()[:16]

    def build(layout: Path) -> None:
        shutil.copytree(base, layout, symlinks=True)

        def fill(rootfs: Path) -> None:
            if packages:
                _install_pip_packages(rootfs, packages, cache_root)
            if from_dir is not None:  # --from DIR: DIR/etc/x becomes /etc/x
                shutil.copytree(from_dir, rootfs, symlinks=True, dirs_exist_ok=True)

        _umoci_add_layer(layout, "base", "image", fill)
        _run(["umoci", "gc", "--layout", str(layout)])

    return _build_once(cache_root / f"image-{key}", "index.json", build)


def add_tag(layout: Path, base_tag: str, tag: str, files: dict[str, bytes]) -> None:
    """Another image in ``layout``: ``base_tag`` plus one layer with ``files``, tagged ``tag``."""
    def fill(rootfs: Path) -> None:
        for rel, data in files.items():
            p = rootfs / rel.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

    _umoci_add_layer(layout, base_tag, tag, fill)


def make_index(layout: Path, platforms: dict[str, str], tag: str) -> None:
    """Tag ``tag`` in ``layout`` as an OCI image index: platform ("os/arch[/variant]") → existing tag."""
    index = json.loads((layout / "index.json").read_text())
    by_name = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}
    entries = []
    for platform, src in platforms.items():
        parts = platform.split("/")
        plat = {"os": parts[0], "architecture": parts[1], **({"variant": parts[2]} if len(parts) > 2 else {})}
        m = by_name[src]
        entries.append({"mediaType": m["mediaType"], "digest": m["digest"], "size": m["size"], "platform": plat})
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": entries}).encode()
    digest = hashlib.sha256(body).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(body)
    index["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json",
                               "digest": f"sha256:{digest}", "size": len(body),
                               "annotations": {"org.opencontainers.image.ref.name": tag}})
    (layout / "index.json").write_text(json.dumps(index))


# -- TLS and auth ---------------------------------------------------------------------------------------


def make_ca(folder: Path, host_ip: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate for ``host_ip`` and 127.0.0.1 (SAN IPs and localhost) in ``folder``.

    Returns (ca.crt, server.crt, server.key). The CA is kept when it exists (clients trust it); the server
    certificate is kept while it names the same addresses, and is issued again by the same CA otherwise (the
    dev cluster's isolated layout serves the registries at the head's bridge address too).
    """
    folder.mkdir(parents=True, exist_ok=True)
    ca_crt, ca_key = folder / "ca.crt", folder / "ca.key"
    crt, key = folder / "server.crt", folder / "server.key"
    ext = folder / "server.ext"
    ips = sorted({host_ip, "127.0.0.1"})
    ext_text = (f"subjectAltName={','.join(f'IP:{ip}' for ip in ips)},DNS:localhost\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    if not (ca_crt.is_file() and ca_key.is_file()):
        _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj",
              "/CN=slurm-bt dev registry CA", "-keyout", str(ca_key), "-out", str(ca_crt)])
    elif crt.is_file() and key.is_file() and ext.is_file() and ext.read_text() == ext_text:
        return ca_crt, crt, key
    csr = folder / "server.csr"
    ext.write_text(ext_text)
    _run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host_ip}", "-keyout", str(key),
          "-out", str(csr)])
    _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
          "-CAcreateserial", "-days", "3650", "-extfile", str(ext), "-out", str(crt)])
    os.chmod(ca_crt, 0o644)
    os.chmod(key, 0o600)
    return ca_crt, crt, key


def registry_config(*, port: int, root: Path, cert: Path, key: Path, htpasswd: Path | None,
                    addr: str = "127.0.0.1") -> str:
    """The docker-registry config (YAML, written as JSON, which YAML accepts)."""
    cfg: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(root)}, "delete": {"enabled": True},
                    # no in-memory blob descriptor cache: a test that corrupts a blob on disk must be served it
                    "cache": {}},
        "http": {"addr": f"{addr}:{port}", "tls": {"certificate": str(cert), "key": str(key)},
                 "secret": hashlib.sha256(str(root).encode()).hexdigest()},
    }
    if htpasswd is not None:
        cfg["auth"] = {"htpasswd": {"realm": "slurm-bt", "path": str(htpasswd)}}
    return json.dumps(cfg, indent=2) + "\n"


def write_htpasswd(path: Path, users: dict[str, str]) -> None:
    """bcrypt entries (the only scheme docker-registry accepts), via ``htpasswd -B``."""
    lines = []
    for user, password in users.items():
        out = _run(["htpasswd", "-nbB", user, password]).stdout.strip()
        lines.append(out)
    path.write_text("\n".join(lines) + "\n")
    os.chmod(path, 0o640)


def write_authfile(path: Path, registry: str, user: str, password: str) -> None:
    """A containers-auth.json (0600) for skopeo's ``--authfile``/``--dest-authfile``."""
    import base64

    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"auths": {registry: {"auth": token}}}, f)


class Registry:
    """One docker-registry process on ``addr``:``port`` (127.0.0.1 unless given) serving ``state/data`` over TLS.

    ``users`` given: every request needs basic auth (htpasswd); else anonymous pulls and pushes.
    """

    def __init__(self, state: Path, port: int, *, users: dict[str, str] | None = None,
                 ca_dir: Path | None = None, addr: str = "127.0.0.1") -> None:
        self.state = state
        self.port = port
        self.users = users
        self.ca_dir = ca_dir or state / "tls"
        self.addr = addr
        self.host = f"{addr}:{port}"
        self.data = state / "data"
        self.log = state / "registry.log"
        self.config = state / "config.yml"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ca(self) -> Path:
        return self.ca_dir / "ca.crt"

    def prepare(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(exist_ok=True)
        _, crt, key = make_ca(self.ca_dir, self.addr)
        htp = None
        if self.users is not None:
            htp = self.state / "htpasswd"
            write_htpasswd(htp, self.users)
        self.config.write_text(registry_config(port=self.port, root=self.data, cert=crt, key=key, htpasswd=htp,
                                               addr=self.addr))

    def argv(self) -> list[str]:
        return ["docker-registry", "serve", str(self.config)]

    def start(self, timeout_s: float = 20.0) -> None:
        import socket

        self.prepare()
        out = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self.proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection((self.addr, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"docker-registry did not listen on {self.port}: "
                           f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def blob_gets(self, digest_hex: str | None = None) -> int:
        """How many blob GETs the log shows (of one blob when ``digest_hex`` is given)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        pat = re.compile(r'"GET /v2/[^ ]*/blobs/sha256:' + (digest_hex or r"[0-9a-f]{64}") + r' HTTP')
        return len(pat.findall(text))

    def blob_path(self, digest_hex: str) -> Path:
        return self.data / "docker/registry/v2/blobs/sha256" / digest_hex[:2] / digest_hex / "data"


def has_tag(registry: Registry, repo: str, tag: str) -> bool:
    """True when ``repo:tag`` answers in ``registry`` (anonymous)."""
    with tempfile.TemporaryDirectory(prefix="bt-inspect-") as tmp:
        certs = Path(tmp) / "certs"  # only the CA: skopeo takes a *.key beside it for a client key
        certs.mkdir()
        shutil.copy(registry.ca, certs / "ca.crt")
        proc = subprocess.run(["skopeo", "inspect", "--raw", "--cert-dir", str(certs),
                               f"docker://{registry.host}/{repo}:{tag}"], capture_output=True, timeout=60)
        return proc.returncode == 0


def push(layout: Path, tag: str, registry: Registry, repo: str, dest_tag: str, *,
         user: str | None = None, password: str | None = None) -> str:
    """Push ``layout:tag`` to ``registry`` as ``repo:dest_tag`` (an index with all its images); returns
    the digest of what the tag names (manifest or index)."""
    with tempfile.TemporaryDirectory(prefix="bt-push-") as tmp:
        certs = Path(tmp) / "certs"
        certs.mkdir()
        shutil.copy(registry.ca, certs / "ca.crt")
        digest_file = Path(tmp) / "digest"
        argv = ["skopeo", "copy", "--all", "--quiet", "--dest-cert-dir", str(certs), "--digestfile",
                str(digest_file)]
        if user is not None and password is not None:
            auth = Path(tmp) / "auth.json"
            write_authfile(auth, registry.host, user, password)
            argv += ["--dest-authfile", str(auth)]
        argv += [f"oci:{layout}:{tag}", f"docker://{registry.host}/{repo}:{dest_tag}"]
        _run(argv, timeout=600)
        return digest_file.read_text().strip()


def main(argv: list[str]) -> int:
    """``python3 devcluster/oci_image.py rootfs DIR``: build the rootfs only (debugging)."""
    if len(argv) == 2 and argv[0] == "rootfs":
        build_rootfs(Path(argv[1]))
        return 0
    print("usage: oci_image.py rootfs DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

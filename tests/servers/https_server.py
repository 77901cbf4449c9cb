"""A small HTTPS file server on 127.0.0.1 with a self-signed CA that clients trust via a CA bundle.

The CA and the server certificate (SAN ``IP:127.0.0.1`` and ``DNS:localhost``) are generated per
session with ``cryptography``; clients trust ``ca.pem`` through ``https_ca_bundle``, never by
turning verification off. The server answers HEAD and GET with ``Content-Length``, a strong
``ETag`` (the sha256), ``Digest: sha-256=...``, honours ``Range`` and ``If-Match`` (412), and
requires ``Authorization: Bearer <token>`` for paths under ``/private/`` (401 otherwise).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.server
import ipaddress
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers._proc import HOST

TOKEN = "bt-https-token"


def make_ca(root: Path) -> tuple[Path, Path, Path]:
    """Write ``ca.pem``, ``server.pem`` and ``server.key`` under ``root``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "slurm-bt test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in sorted({"127.0.0.1", HOST})),
                x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    root.mkdir(parents=True, exist_ok=True)
    ca_pem, cert_pem, key_pem = root / "ca.pem", root / "server.pem", root / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    key_pem.chmod(0o600)
    return ca_pem, cert_pem, key_pem


@dataclass
class HttpsFiles:
    """A running HTTPS server serving the files in :attr:`files` (path -> bytes)."""

    port: int
    ca_bundle: Path
    server: http.server.ThreadingHTTPServer
    files: dict[str, bytes] = field(default_factory=dict)

    def url(self, path: str) -> str:
        """``https://127.0.0.1:<port>/<path>``."""
        return f"https://{HOST}:{self.port}/{path.lstrip('/')}"

    def put(self, path: str, data: bytes) -> None:
        """Serve ``data`` at ``/path`` (replacing what was there: a new ETag)."""
        self.files[path.lstrip("/")] = data

    def stop(self) -> None:
        """Shut the server down."""
        self.server.shutdown()
        self.server.server_close()


def _handler(files: dict[str, bytes]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _reply(self, body: bool) -> None:
            path = self.path.split("?", 1)[0].lstrip("/")
            if path.startswith("private/") and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = files.get(path)
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            digest = hashlib.sha256(data).digest()
            etag = f'"{digest.hex()[:32]}"'
            if self.headers.get("If-Match") not in (None, etag, "*"):
                self.send_response(412)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end, status = 0, len(data), 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start = int(first)
                end = min(len(data), int(last) + 1) if last else len(data)
                status = 206
            chunk = data[start:end]
            self.send_response(status)
            self.send_header("Content-Length", str(len(chunk)))
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Digest", f"sha-256={base64.b64encode(digest).decode()}")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            if body:
                self.wfile.write(chunk)

        def do_HEAD(self) -> None:
            self._reply(False)

        def do_GET(self) -> None:
            self._reply(True)

    return Handler


def start_https(root: Path) -> HttpsFiles:
    """Generate the CA and start the server on a free loopback port (a daemon thread)."""
    ca, cert, key = make_ca(root)
    files: dict[str, bytes] = {}
    server = http.server.ThreadingHTTPServer((HOST, 0), _handler(files))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="https-files", daemon=True).start()
    return HttpsFiles(int(server.server_address[1]), ca, server, files)

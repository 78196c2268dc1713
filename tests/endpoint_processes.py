"""Endpoint processes for replication tests: configs, free 127.0.0.x addresses, TLS material."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from journal.errors import JournalError
from journal.replication.config import TlsConfig
from journal.replication.transport import RemoteSource
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
JOURNAL_CLI = [sys.executable, "-c", "from journal.cli import main; main()"]


def free_address() -> str:
    """A free port on a random 127.0.0.x address (parallel test runs do not collide)."""
    for _ in range(50):
        host = f"127.0.0.{random.randint(2, 254)}"
        with socket.socket() as s:
            try:
                s.bind((host, 0))
            except OSError:
                continue
            return f"{host}:{s.getsockname()[1]}"
    raise RuntimeError("no free 127.0.0.x address")


def make_tls(directory: Path, name: str = "sj-replication") -> TlsConfig:
    """A self-signed certificate (its own CA) valid for ``name`` and every 127.0.0.x address."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return TlsConfig(directory / "cert.pem", directory / "key.pem", directory / "cert.pem", server_name=name)


class EndpointProcess:
    """``journal endpoint run --config FILE`` in a child process."""

    def __init__(self, directory: Path, config: dict[str, Any], tls: TlsConfig | None = None) -> None:
        self.config = dict(config)
        if tls is not None:
            self.config["tls"] = {
                "cert": str(tls.cert),
                "key": str(tls.key),
                "ca": str(tls.ca),
                "server_name": tls.server_name,
            }
        self.tls = tls
        self.path = directory / f"endpoint-{config['location']}.json"
        self.path.write_text(json.dumps(self.config))
        self.log_path = directory / f"endpoint-{config['location']}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return str(self.config["listen"])

    def start(self, *extra: str) -> None:
        """Start it; ``extra``: more ``endpoint run`` options (``--recover``)."""
        assert self.proc is None or self.proc.poll() is not None
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [*JOURNAL_CLI, "endpoint", "run", "--config", str(self.path), *extra],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    async def wait_ready(self, within: float = 90.0) -> dict[str, Any]:
        async def info_when_serving() -> dict[str, Any] | None:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            source = RemoteSource(self.address, self.tls, timeout=2.0)
            try:
                return await source.info()
            except JournalError:
                return None  # not listening yet
            finally:
                await source.close()

        info: dict[str, Any] = await wait_until(info_when_serving, within, f"endpoint {self.address}", every=0.2)
        return info

    async def info(self) -> dict[str, Any]:
        source = RemoteSource(self.address, self.tls, timeout=10.0)
        try:
            return await source.info()
        finally:
            await source.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

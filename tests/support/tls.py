"""Certificates made by the test (the ``openssl`` command) and a redis-server that speaks
only TLS, for the Redis TLS tests."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sidecar.local import EmbeddedRedis, free_port


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate it signed (for 127.0.0.1 and localhost), a client
    certificate it signed, and an unrelated CA that signed neither."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _key_and_csr(cwd: Path, name: str, cn: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
        cwd=cwd,
    )  # fmt: skip


def _self_signed_ca(cwd: Path, name: str, cn: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
        "-subj", f"/CN={cn}",
        cwd=cwd,
    )  # fmt: skip


def _sign(cwd: Path, name: str, extensions: str) -> None:
    (cwd / f"{name}.ext").write_text(extensions + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


def make_certs(directory: Path) -> Certs:
    """Write the certificates into ``directory`` (EC P-256 keys: fast to make)."""
    if shutil.which("openssl") is None:
        import pytest

        pytest.skip("the openssl command is needed to make test certificates")
    directory.mkdir(parents=True, exist_ok=True)
    _self_signed_ca(directory, "ca", "sidecar-test-ca")
    _self_signed_ca(directory, "other-ca", "some-other-ca")
    _key_and_csr(directory, "server", "localhost")
    _sign(directory, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost")
    _key_and_csr(directory, "client", "sidecar-client")
    _sign(directory, "client", "extendedKeyUsage=clientAuth")
    return Certs(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.crt",
    )


def redis_supports_tls() -> bool:
    """Whether this machine's redis-server was built with TLS (Debian's is)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return False
    # A TLS-less build refuses the directive; a TLS build gets as far as the missing
    # certificate (or, with port 0 and no TLS port, as "not listening anywhere").
    res = subprocess.run(
        [binary, "--port", "0", "--tls-port", "0", "--save", ""],
        capture_output=True,
        text=True,
        timeout=10,
    )
    said = res.stdout + res.stderr
    return "Bad directive" not in said and "not supported" not in said.lower()


def tls_redis(certs: Certs, *, client_certs: bool, extra: tuple[str, ...] = ()) -> EmbeddedRedis:
    """An unstarted redis-server that listens with TLS only, on a free port.

    ``client_certs``: the server requires a client certificate signed by the test CA.
    """
    port = free_port()
    return EmbeddedRedis(
        port=port,
        args=(
            "--port", "0",  # the later --port wins: no plain-text listener
            "--tls-port", str(port),
            "--tls-cert-file", str(certs.server_cert),
            "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca),
            "--tls-auth-clients", "yes" if client_certs else "no",
            *extra,
        ),
    )  # fmt: skip


def rediss_url(server: EmbeddedRedis, user: str | None = None, host: str = "127.0.0.1") -> str:
    return f"rediss://{user + '@' if user else ''}{host}:{server.port}/0"

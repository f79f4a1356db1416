"""TLS to the brokers: a private CA and a client certificate from files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sidecar.errors import ConfigError
from sidecar.settings import load_settings
from sidecar.stream._topics import client_kwargs, ssl_context


@pytest.fixture
def pem(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key, made by the openssl command."""
    cert, key = tmp_path / "ca.pem", tmp_path / "ca.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-subj", "/CN=sidecar-test-ca", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_a_private_ca_and_a_client_certificate_reach_the_clients(pem: tuple[Path, Path]) -> None:
    cert, key = pem
    s = load_settings(
        kafka={
            "security_protocol": "SSL",
            "ssl_ca_file": str(cert),
            "ssl_cert_file": str(cert),
            "ssl_key_file": str(key),
        }
    )
    ctx = ssl_context(s)
    assert ctx is not None
    subjects = [dict(x[0] for x in c["subject"]) for c in ctx.get_ca_certs()]
    assert subjects == [{"commonName": "sidecar-test-ca"}]  # only the private CA is trusted
    assert client_kwargs(s)["ssl_context"] is not None


def test_tls_files_that_do_not_load_are_one_config_error(
    pem: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = pem
    missing = tmp_path / "absent.pem"
    with pytest.raises(ConfigError, match=r"absent\.pem"):
        ssl_context(load_settings(kafka={"security_protocol": "SSL", "ssl_ca_file": str(missing)}))
    with pytest.raises(ConfigError, match=r"needs kafka\.ssl_cert_file"):
        ssl_context(load_settings(kafka={"security_protocol": "SSL", "ssl_key_file": str(key)}))
    # one file with the certificate and its key is enough
    both = tmp_path / "both.pem"
    both.write_bytes(cert.read_bytes() + key.read_bytes())
    assert ssl_context(
        load_settings(kafka={"security_protocol": "SSL", "ssl_cert_file": str(both)})
    )
    # a key file is never echoed, even when it is given where a certificate belongs
    with pytest.raises(ConfigError) as info:
        ssl_context(
            load_settings(
                kafka={
                    "security_protocol": "SSL",
                    "ssl_cert_file": str(key),
                    "ssl_key_file": str(key),
                }
            )
        )
    assert "PRIVATE KEY" not in str(info.value) and info.value.__cause__ is None
    assert ssl_context(load_settings()) is None  # PLAINTEXT


def test_an_encrypted_client_key_is_refused_not_prompted_for(
    pem: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = pem
    locked = tmp_path / "locked.key"
    subprocess.run(
        [
            *("openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:x"),
            "-out",
            str(locked),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    tls = {"security_protocol": "SSL", "ssl_cert_file": str(cert), "ssl_key_file": str(locked)}
    with pytest.raises(ConfigError, match="encrypted"):
        ssl_context(load_settings(kafka=tls))


@pytest.mark.parametrize(
    ("section", "field"),
    [("redis", "password"), ("kafka", "sasl_password"), ("explain", "api_key")],
)
def test_blank_passwords_are_refused(section: str, field: str) -> None:
    with pytest.raises(ConfigError, match=f"{section}.{field}"):
        load_settings(**{section: {field: "  "}})

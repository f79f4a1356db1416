"""Redis TLS settings and options, and the SASL login kept out of the Kafka client's log.

The same paths run against real servers in tests/integration/test_redis_tls_acl.py and
test_secrets_never_leak.py; these pin the refusals that need no server.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from model_store import StoreMisconfigured
from model_store._redis_common import tls_options
from sidecar.errors import ConfigError
from sidecar.settings import load_settings


@pytest.fixture(autouse=True)
def _no_caller_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in [k for k in os.environ if k.startswith("SIDECAR_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", str(tmp_path))


def test_tls_files_load_with_a_rediss_url() -> None:
    r = load_settings(redis={"url": "rediss://redis:6380/0", "ssl_ca_file": "/ca.pem"}).redis
    assert (r.ssl_ca_file, r.ssl_cert_file, r.ssl_key_file) == ("/ca.pem", None, None)
    assert load_settings(redis={"ssl_ca_file": " "}).redis.ssl_ca_file is None  # chart's ""


@pytest.mark.parametrize(
    ("redis", "says"),
    [
        ({"ssl_ca_file": "/ca.pem"}, "redis.ssl_ca_file set, but redis.url is not a rediss://"),
        (
            {"url": "redis://:pw@redis/0", "ssl_cert_file": "/c", "ssl_key_file": "/k"},
            "redis.ssl_cert_file and redis.ssl_key_file set",
        ),
        ({"url": "rediss://redis/0", "ssl_key_file": "/k"}, "needs redis.ssl_cert_file"),
    ],
)
def test_tls_files_that_would_be_ignored_are_refused(redis: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        load_settings(redis=redis)
    assert ":pw@" not in str(refused.value)


def test_tls_options_name_the_file_that_does_not_load(tmp_path: Path) -> None:
    assert tls_options("redis://h/0") == {}
    with pytest.raises(StoreMisconfigured, match="TLS needs a rediss:// URL") as refused:
        tls_options("redis://:pw@h/0", ca_file="/ca.pem")
    assert "pw" not in str(refused.value)
    with pytest.raises(StoreMisconfigured, match=r"CA file /nowhere\.pem: FileNotFoundError"):
        tls_options("rediss://h/0", ca_file="/nowhere.pem")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(StoreMisconfigured, match=rf"client certificate {junk} \(holding its key\)"):
        tls_options("rediss://h/0", cert_file=str(junk))
    with pytest.raises(StoreMisconfigured, match="key file needs its certificate"):
        tls_options("rediss://h/0", key_file=str(junk))


def test_the_sasl_login_payload_is_logged_as_its_size(caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v0, SaslHandShakeRequest_v1

    from sidecar.stream._topics import hide_sasl_payloads

    hide_sasl_payloads()
    hide_sasl_payloads()  # idempotent
    log = logging.getLogger("aiokafka.conn")
    assert sum(type(f).__name__ == "_HiddenSaslPayloads" for f in log.filters) == 1
    login = SaslAuthenticateRequest_v0(b"alice\x00alice\x00S3cret-pw")
    with caplog.at_level(logging.DEBUG, logger="aiokafka.conn"):
        log.debug("Request to %s:%d %d: %s", "broker", 9092, 3, login)
        log.debug("Request to %s:%d %d: %s", "broker", 9092, 2, SaslHandShakeRequest_v1("PLAIN"))
    first, second = (r.getMessage() for r in caplog.records)
    assert "S3cret-pw" not in first and "<21 bytes, not logged>" in first
    assert "SaslHandShakeRequest_v1(mechanism='PLAIN')" in second  # nothing else changes

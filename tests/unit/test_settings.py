"""``load_settings``: bad values become one ConfigError that never carries a secret."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.errors import ConfigError
from sidecar.settings import load_settings, mask_url_password

SECRET = "hunter2-d41d8cd9"


@pytest.fixture(autouse=True)
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty secrets directory of the test's own, and no SIDECAR_ variable from outside."""
    import os

    for name in list(os.environ):
        if name.startswith("SIDECAR_"):
            monkeypatch.delenv(name)
    d = tmp_path / "secrets"
    d.mkdir()
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", str(d))
    return d


def _config_error() -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings()
    return info.value


def _assert_hidden(exc: BaseException, *secrets: str) -> None:
    # The whole printed traceback, as --debug or a crash log would show it, chained
    # exceptions included.
    shown = "".join(traceback.format_exception(exc))
    for secret in secrets:
        assert secret not in shown
    assert exc.__cause__ is None and exc.__context__ is None
    assert "\n" not in str(exc)


def test_misspelled_env_var_names_the_field_not_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIDECAR_REDIS__PASSWD", SECRET)
    exc = _config_error()
    assert "redis.passwd" in str(exc) and "SIDECAR_REDIS__PASSWD" in str(exc)
    _assert_hidden(exc, SECRET)


def test_a_misspelled_section_is_refused_not_ignored(
    secrets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIDECAR_REDSI__PASSWORD", SECRET)
    exc = _config_error()
    assert "SIDECAR_REDSI__PASSWORD" in str(exc) and "redis" in str(exc)
    _assert_hidden(exc, SECRET)
    monkeypatch.delenv("SIDECAR_REDSI__PASSWORD")
    (secrets_dir / "stroe__hmac_key").write_text(SECRET)
    exc = _config_error()
    assert "stroe__" in str(exc)
    _assert_hidden(exc, SECRET)


def test_service_variables_of_kubernetes_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Service named "sidecar" puts these into every pod of its namespace.
    monkeypatch.setenv("SIDECAR_SERVICE_HOST", "10.0.0.7")
    monkeypatch.setenv("SIDECAR_PORT_8080_TCP_ADDR", "10.0.0.7")
    assert load_settings().web.port > 0


def test_misspelled_secret_file_names_the_field_not_the_value(secrets_dir: Path) -> None:
    (secrets_dir / "redis__passwd").write_text(SECRET + "\n")
    exc = _config_error()
    assert "redis.passwd" in str(exc) and "redis__passwd" in str(exc)
    _assert_hidden(exc, SECRET)


def test_bad_value_names_the_field_not_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_STORE__RETENTION", "abc-31337")
    monkeypatch.setenv("SIDECAR_WEB__PORT", "70000")
    exc = _config_error()
    assert "store.retention" in str(exc) and "web.port" in str(exc)
    _assert_hidden(exc, "abc-31337", "70000")


def test_unparseable_json_env_var_is_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_SCORING__KBS", SECRET)
    exc = _config_error()
    assert "scoring" in str(exc) and "take JSON" in str(exc)  # says how to write a list
    _assert_hidden(exc, SECRET)


@pytest.mark.parametrize("value", ["", "   "])
def test_blank_hmac_key_from_env_is_rejected(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SIDECAR_STORE__HMAC_KEY", value)
    assert "store.hmac_key is set but empty" in str(_config_error())


def test_blank_hmac_key_file_is_rejected(secrets_dir: Path) -> None:
    (secrets_dir / "store__hmac_key").write_text("\n")
    assert "store.hmac_key is set but empty" in str(_config_error())


def test_hmac_key_file_is_read_and_stripped(secrets_dir: Path) -> None:
    (secrets_dir / "store__hmac_key").write_text("0123abcd\n")
    key = load_settings().store.hmac_key
    assert key is not None and key.get_secret_value() == "0123abcd"
    assert "0123abcd" not in repr(load_settings())


def test_binary_key_file_is_named_never_echoed(secrets_dir: Path) -> None:
    path = secrets_dir / "store__hmac_key"
    path.write_bytes(b"\xff\xfe" + SECRET.encode() + b"\x80\x00")
    exc = _config_error()
    assert str(path) in str(exc) and "text" in str(exc) and "hex" in str(exc)
    _assert_hidden(exc, SECRET, "0xff", "\\xff")


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (f"redis://:{SECRET}@h:6379/0", "redis://***@h:6379/0"),
        (f"rediss://app:{SECRET}@redis.prod:6380/2", "rediss://***@redis.prod:6380/2"),
        (f"redis://:{SECRET}@x@h/0", "redis://***@h/0"),  # a password may hold "@"
        (f"redis://app:s3/{SECRET}@h/0", "redis://***@h/0"),  # or "/"
        (f"redis://h:6379/0?password={SECRET}", "redis://h:6379/0?password=***"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_mask_url_password(url: str, masked: str) -> None:
    assert mask_url_password(url) == masked


def test_redis_url_password_not_in_repr_but_url_unchanged() -> None:
    url = f"redis://:{SECRET}@h:6379/0"
    s = load_settings(redis={"url": url})
    for shown in (repr(s.redis), str(s.redis), repr(s), str(s)):
        assert SECRET not in shown and "redis://***@h:6379/0" in shown
    assert s.redis.url == url and isinstance(s.redis.url, str)
    assert s.redis.masked_url == "redis://***@h:6379/0"


def test_the_settings_command_prints_what_won_with_secrets_masked(
    monkeypatch: pytest.MonkeyPatch, secrets_dir: Path
) -> None:
    import json

    from click.testing import CliRunner

    from sidecar.cli import main

    (secrets_dir / "redis__password").write_text("from-a-file\n")
    monkeypatch.setenv("SIDECAR_STORE__HMAC_KEY", "hmac-from-env")
    monkeypatch.setenv("SIDECAR_REDIS__URL", "redis://:url-password@cache:6380/2")
    monkeypatch.setenv("SIDECAR_SCORING__KBS", '["hr", "it"]')
    res = CliRunner().invoke(main, ["settings"])
    assert res.exit_code == 0, res.output
    for secret in ("from-a-file", "hmac-from-env", "url-password"):
        assert secret not in res.output
    doc = json.loads(res.output)
    assert doc["scoring"]["kbs"] == ["hr", "it"] and doc["redis"]["password"] == "**********"
    assert doc["store"]["hmac_key"] == "**********"
    assert doc["redis"]["url"] == "redis://***@cache:6380/2"
    assert doc["kafka"]["sasl_password"] is None  # unset stays null, not masked


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_without_credentials_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    monkeypatch.setenv("SIDECAR_KAFKA__SECURITY_PROTOCOL", protocol)
    exc = _config_error()
    assert f"{protocol} needs kafka.sasl_username and kafka.sasl_password" in str(exc)
    monkeypatch.setenv("SIDECAR_KAFKA__SASL_USERNAME", "svc-sidecar")
    exc = _config_error()
    assert "needs kafka.sasl_password" in str(exc) and "sasl_username" not in str(exc)
    with pytest.raises(ConfigError, match=r"needs kafka\.sasl_username"):
        load_settings(kafka={"sasl_username": None, "sasl_password": SECRET})


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
def test_tls_files_without_a_tls_protocol_are_refused(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    # they would be ignored: plain text to the brokers while the operator expects TLS
    monkeypatch.setenv("SIDECAR_KAFKA__SECURITY_PROTOCOL", protocol)
    monkeypatch.setenv("SIDECAR_KAFKA__SASL_USERNAME", "svc")
    monkeypatch.setenv("SIDECAR_KAFKA__SASL_PASSWORD", SECRET)
    monkeypatch.setenv("SIDECAR_KAFKA__SSL_CA_FILE", "/run/secrets/sidecar/kafka-ca.pem")
    exc = _config_error()
    assert f"kafka.ssl_ca_file set, but kafka.security_protocol is {protocol}" in str(exc)
    # the protocol given elsewhere than the environment counts (checked after the merge)
    tls = protocol.replace("PLAINTEXT", "SSL")
    assert load_settings(kafka={"security_protocol": tls}).kafka.security_protocol == tls
    monkeypatch.setenv("SIDECAR_KAFKA__SECURITY_PROTOCOL", tls)
    assert load_settings().kafka.ssl_ca_file == "/run/secrets/sidecar/kafka-ca.pem"


def test_a_sasl_password_from_a_secret_file_is_enough(
    monkeypatch: pytest.MonkeyPatch, secrets_dir: Path
) -> None:
    # The environment alone lacks the password: the check waits for the secret files.
    monkeypatch.setenv("SIDECAR_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SIDECAR_KAFKA__SASL_USERNAME", "svc-sidecar")
    (secrets_dir / "kafka__sasl_password").write_text(SECRET + "\n")
    k = load_settings().kafka
    assert k.sasl_username == "svc-sidecar" and k.sasl_password is not None
    assert k.sasl_password.get_secret_value() == SECRET
    assert load_settings().kafka.security_protocol == "SASL_SSL"


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("SIDECAR_SCORING__KBS", '["bad name"]', "scoring.kbs: invalid KB id 'bad name'"),
        ("SIDECAR_SCORING__KBS", '["hr", ""]', "scoring.kbs: invalid KB id ''"),
        ("SIDECAR_SCORING__KBS", "[]", "scoring.kbs is empty"),
        ("SIDECAR_SCORING__DEFAULT_KB", "a/b", "scoring.default_kb: invalid KB id 'a/b'"),
        ("SIDECAR_SCORING__DEFAULT_KB", "", "scoring.default_kb: invalid KB id ''"),
        ("SIDECAR_WEB__PORT", "0", "web.port: Input should be greater than or equal to 1"),
        ("SIDECAR_EXPLAIN__MAX_TOKENS", "0", "explain.max_tokens"),
        ("SIDECAR_EXPLAIN__TEMPERATURE", "-5", "explain.temperature"),
        ("SIDECAR_STORE__DIRECTORY", "", "store.directory is empty"),
        ("SIDECAR_STORE__DIRECTORY", "  ", "store.directory is empty"),
        ("SIDECAR_SCORING__ONNX_CACHE_DIR", "", "scoring.onnx_cache_dir is empty"),
    ],
)
def test_nonsense_values_are_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, words: str
) -> None:
    monkeypatch.setenv(variable, value)
    exc = _config_error()
    assert words in str(exc) and "\n" not in str(exc)


def test_the_bounds_still_accept_their_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_EXPLAIN__MAX_TOKENS", "1")
    monkeypatch.setenv("SIDECAR_EXPLAIN__TEMPERATURE", "0")
    monkeypatch.setenv("SIDECAR_WEB__PORT", "1")
    monkeypatch.setenv("SIDECAR_SCORING__KBS", '["hr", "it-2.v1"]')
    monkeypatch.setenv("SIDECAR_SCORING__DEFAULT_KB", "it-2.v1")
    s = load_settings()
    assert (s.explain.max_tokens, s.explain.temperature, s.web.port) == (1, 0.0, 1)
    assert s.scoring.kbs == ("hr", "it-2.v1")


@pytest.mark.parametrize("value", ["info", "Debug", " warning "])
def test_log_level_is_case_insensitive_like_the_option(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SIDECAR_LOG__LEVEL", value)
    assert load_settings().log.level == value.strip().upper()


def test_an_unknown_log_level_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_LOG__LEVEL", "verbose")
    assert "log.level" in str(_config_error())


def test_a_secrets_dir_given_but_missing_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "secerts"
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", str(missing))
    exc = _config_error()
    assert str(missing) in str(exc) and "does not exist" in str(exc)
    a_file = tmp_path / "a_file"
    a_file.write_text("redis__password")
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", str(a_file))
    exc = _config_error()
    assert str(a_file) in str(exc) and "is not a directory" in str(exc)


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_secrets_dir_is_refused_not_read_as_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "redis__password").write_text(SECRET)  # would have been read as a secret
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", value)
    assert "SIDECAR_SECRETS_DIR is empty" in str(_config_error())


def test_the_default_secrets_dir_may_be_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sidecar.settings

    absent = tmp_path / "run" / "secrets" / "sidecar"
    monkeypatch.setattr(sidecar.settings, "DEFAULT_SECRETS_DIR", absent)
    monkeypatch.delenv("SIDECAR_SECRETS_DIR")
    assert load_settings().redis.password is None
    # The chart sets the variable to the default even when no Secret is mounted.
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", str(absent))
    assert load_settings().redis.password is None
    # ... but the default path holding a file is a mistake all the same.
    absent.parent.mkdir(parents=True)
    absent.write_text("")
    assert "is not a directory" in str(_config_error())


@pytest.mark.parametrize(
    ("brokers", "words"),
    [
        (f"kafka://svc:{SECRET}@k1:9092", "must not carry credentials"),
        (f"kafka://k0:9092;kafka://svc:{SECRET}@k1:9092", "must not carry credentials"),
        ("", "kafka.brokers is empty"),
        (" ; ", "kafka.brokers is empty"),
    ],
)
def test_brokers_with_credentials_or_none_are_refused_without_the_value(
    monkeypatch: pytest.MonkeyPatch, brokers: str, words: str
) -> None:
    # aiokafka reads no credentials from a URL; it would dial "svc:pw@k1" and print it.
    monkeypatch.setenv("SIDECAR_KAFKA__BROKERS", brokers)
    exc = _config_error()
    assert words in str(exc)
    _assert_hidden(exc, SECRET)
    monkeypatch.delenv("SIDECAR_KAFKA__BROKERS")
    assert load_settings(kafka={"brokers": "kafka://k0:9092;k1:9092"}).kafka.brokers


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.symlink_to(p.parent / "nowhere"), "is a link to nothing"),
        (lambda p: os.mkfifo(p), "is not a regular file"),
    ],
)
def test_a_secret_that_is_not_a_file_is_refused_not_left_unset(
    secrets_dir: Path, make: Callable[[Path], object], words: str
) -> None:
    # A mis-mounted signing key would otherwise mean running unsigned without a word.
    make(secrets_dir / "store__hmac_key")
    exc = _config_error()
    assert "store__hmac_key" in str(exc) and words in str(exc)


def test_kubernetes_secret_volume_entries_are_not_secrets(secrets_dir: Path) -> None:
    data = secrets_dir / "..2026_12_02_03_27_05.1"
    data.mkdir()
    (data / "store__hmac_key").write_text("0123abcd\n")
    (secrets_dir / "..data").symlink_to(data.name)
    (secrets_dir / "store__hmac_key").symlink_to("..data/store__hmac_key")
    key = load_settings().store.hmac_key
    assert key is not None and key.get_secret_value() == "0123abcd"

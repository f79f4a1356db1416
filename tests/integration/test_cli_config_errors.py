"""Settings that do not validate end every command, the worker too, in one line.

The line names the field but never its value: the value may be a password, and a worker
that prints a traceback does so in a crash loop, into the cluster's logs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from model_store import build_artifact, save_dir
from sidecar.cli import main

SECRET = "hunter2-9f86d081"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str | None]:
    """An empty secrets directory and no SIDECAR_ variable from the calling shell."""
    (tmp_path / "secrets").mkdir()
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SIDECAR_")}
    return {**clean, "SIDECAR_SECRETS_DIR": str(tmp_path / "secrets")}


def _one_line(result: Result, *hidden: str) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for secret in hidden:
        assert secret not in result.output
    return lines[0]


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("SIDECAR_REDIS__PASSWD", SECRET, "redis.passwd"),
        ("SIDECAR_STORE__RETENTION", "abc-" + SECRET, "store.retention"),
        ("SIDECAR_SCORING__KBS", SECRET, "scoring"),
    ],
)
def test_bad_env_setting_is_one_line_without_its_value(
    tmp_path: Path, env: dict[str, str | None], variable: str, value: str, field: str
) -> None:
    env[variable] = value
    args = ["models", "list", "--store-dir", str(tmp_path / "store")]
    line = _one_line(CliRunner(env=env).invoke(main, args), SECRET)
    assert field in line
    # --debug shows the traceback on purpose; the value must not be in it either.
    result = CliRunner(env=env).invoke(main, ["--debug", *args])
    assert result.exception is not None
    assert SECRET not in "".join(traceback.format_exception(result.exception))


def test_misspelled_secret_file_is_one_line_without_its_value(
    tmp_path: Path, env: dict[str, str | None]
) -> None:
    (tmp_path / "secrets" / "redis__passwd").write_text(SECRET + "\n")
    args = ["models", "list", "--store-dir", str(tmp_path / "store")]
    assert "redis__passwd" in _one_line(CliRunner(env=env).invoke(main, args), SECRET)


def test_binary_key_file_is_one_line_naming_the_file(
    tmp_path: Path, env: dict[str, str | None]
) -> None:
    key_file = tmp_path / "secrets" / "store__hmac_key"
    key_file.write_bytes(b"\xf0\x9f" + SECRET.encode() + b"\xff")
    args = ["models", "list", "--store-dir", str(tmp_path / "store")]
    line = _one_line(CliRunner(env=env).invoke(main, args), SECRET, "0xf0")
    assert str(key_file) in line and "hex or base64" in line


@pytest.mark.parametrize("blank", ["env", "file"])
def test_blank_hmac_key_does_not_switch_signing_off(
    tmp_path: Path, env: dict[str, str | None], blank: str
) -> None:
    if blank == "env":
        env["SIDECAR_STORE__HMAC_KEY"] = ""
    else:
        (tmp_path / "secrets" / "store__hmac_key").write_text("\n")
    unsigned = build_artifact(
        kb="demo", encoder={"name": "e", "dim": 4}, model={"kind": "combined"}, arrays={}
    )
    d = save_dir(unsigned, tmp_path / "art")
    store_dir = tmp_path / "store"
    args = ["models", "import", str(d), "--store-dir", str(store_dir)]
    line = _one_line(CliRunner(env=env).invoke(main, args))
    assert "store.hmac_key is set but empty" in line
    assert not store_dir.exists()  # refused before any store was opened


def test_worker_reports_a_bad_setting_in_one_line(env: dict[str, str | None]) -> None:
    """As the pod runs it: a real process, the image's entry point ``sidecar worker``."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    child_env.update({k: v for k, v in env.items() if v is not None})
    child_env["SIDECAR_REDIS__PASSWD"] = SECRET
    proc = subprocess.run(
        [sys.executable, "-m", "sidecar", "worker", "--no-create-topics"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: invalid settings: redis.passwd")


def test_log_settings_configure_every_command_unless_an_option_overrides(
    tmp_path: Path, env: dict[str, str | None]
) -> None:
    # A child process, so that the test's own logging configuration is left alone.
    def run(*args: str, **extra: str) -> str:
        code = (
            "import logging, sys\n"
            "from sidecar.cli import main\n"
            "try:\n"
            "    main(sys.argv[1:])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('LEVEL', logging.getLevelName(logging.getLogger().level))\n"
        )
        child = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
        child.update({k: v for k, v in env.items() if v is not None}, **extra)
        out = subprocess.run(
            [sys.executable, "-c", code, *args, "models", "list", "--store-dir", str(tmp_path)],
            env=child,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return out.stdout.strip().splitlines()[-1]

    assert run() == "LEVEL WARNING"
    assert run(SIDECAR_LOG__LEVEL="DEBUG") == "LEVEL DEBUG"
    assert run("--log-level", "ERROR", SIDECAR_LOG__LEVEL="DEBUG") == "LEVEL ERROR"

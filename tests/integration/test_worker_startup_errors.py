"""``sidecar worker`` refuses what cannot work before it starts faust: one ``error:`` line
and exit status 2, never a faust or aiokafka traceback.

No broker is needed: a free port on 127.0.0.1 with nothing listening stands for one that
cannot be reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sidecar.cli import main
from sidecar.local import free_port


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str | None]:
    """An empty secrets directory and no SIDECAR_ variable from the calling shell."""
    (tmp_path / "secrets").mkdir()
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SIDECAR_")}
    return {**clean, "SIDECAR_SECRETS_DIR": str(tmp_path / "secrets")}


def _nowhere() -> str:
    return f"kafka://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("create_topics", [False, True])
def test_an_unreachable_broker_is_one_line_with_its_reason(
    env: dict[str, str | None], create_topics: bool
) -> None:
    # A child process: faust, had it started, would take over this process's event loop
    # and signal handlers.
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    child_env["SIDECAR_SECRETS_DIR"] = str(env["SIDECAR_SECRETS_DIR"])
    brokers = _nowhere()
    flags = [] if create_topics else ["--no-create-topics"]
    res = subprocess.run(
        [sys.executable, "-m", "sidecar", "worker", *flags, "--brokers", brokers],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    # Nothing before it either: aiokafka's own ERROR line per broker is held back, and
    # its reason ends up in the one line.
    assert res.stderr.splitlines() == [res.stderr.strip()], res.stderr
    line = res.stderr.strip()
    assert line.startswith(f"error: cannot reach the broker at {brokers}: "), line
    assert "Connect call failed" in line and "retrying may help" in line


@pytest.mark.parametrize(
    ("args", "variables", "words"),
    [
        (["--kb", ""], {}, ["scoring.kbs", "invalid KB id ''"]),
        (["--kb", "bad name"], {}, ["scoring.kbs", "invalid KB id 'bad name'"]),
        ([], {"SIDECAR_SCORING__KBS": '["bad name"]'}, ["scoring.kbs", "'bad name'"]),
        ([], {"SIDECAR_SCORING__KBS": "[]"}, ["scoring.kbs is empty"]),
        ([], {"SIDECAR_SCORING__DEFAULT_KB": "../x"}, ["scoring.default_kb", "'../x'"]),
        (["--web-port", "0"], {}, ["web.port", "greater than or equal to 1"]),
        (
            [],
            {"SIDECAR_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
            ["kafka.sasl_username and kafka.sasl_password"],
        ),
        (
            [],
            {"SIDECAR_KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "SIDECAR_KAFKA__SASL_USERNAME": "u"},
            ["SASL_SSL needs kafka.sasl_password"],
        ),
    ],
)
def test_settings_that_cannot_work_stop_the_worker_in_one_line(
    env: dict[str, str | None],
    one_error_line: Callable[[Result], str],
    args: list[str],
    variables: dict[str, str],
    words: list[str],
) -> None:
    env.update(variables)
    # The broker cannot be reached either: the settings must be refused before that.
    res = CliRunner(env=env).invoke(main, ["worker", "--brokers", _nowhere(), *args])
    line = one_error_line(res)
    assert "invalid settings" in line and "broker" not in line
    assert all(w in line for w in words), line


def test_a_mistyped_secrets_dir_stops_the_worker_in_one_line(
    env: dict[str, str | None], tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    env["SIDECAR_SECRETS_DIR"] = str(tmp_path / "secrest")
    res = CliRunner(env=env).invoke(main, ["worker", "--brokers", _nowhere()])
    assert "SIDECAR_SECRETS_DIR" in one_error_line(res)


def test_an_empty_brokers_option_is_refused_not_the_default(
    env: dict[str, str | None], one_error_line: Callable[[Result], str]
) -> None:
    res = CliRunner(env=env).invoke(main, ["worker", "--brokers", ""])
    assert "invalid settings: kafka.brokers is empty" in one_error_line(res)

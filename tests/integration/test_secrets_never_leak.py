"""No output of a run holds a credential: not a log line, an HTTP body, a record on a
topic, an error message or a traceback.

One run with recognisable secrets (the Redis password, the Kafka SASL password and the
store's HMAC key, each given as a secret file, as in production) drives every path that
could print one: the CLI at DEBUG with JSON logs (settings, publishing, failures against
a Redis that refuses the password, is unreachable or cannot be parsed, with and without
--debug tracebacks), a real worker at DEBUG (start-up, queries, bad records dead-lettered,
a model whose signature does not hold, Redis refusing the password mid-run, /readyz,
/models, /metrics, shutdown), and a worker that logs in with SASL to a broker that
refuses it. Every byte is collected and scanned for each secret in plain text, %-encoded,
JSON-escaped, base64, hex, and for any 12 characters of it in a row.

The embedded broker cannot hold SASL users (its store is memory only, and users can only
be created by an authenticated client), so no login succeeds here. The SASL password is
exercised three ways: carried by the worker that serves (PLAINTEXT, where it is loaded
but unused), used in a real SCRAM-SHA-512 login that the embedded broker (with
``--authentication``) refuses, and sent in a PLAIN login to a stand-in that speaks the
SASL handshake only (support/sasl_plain.py) and refuses it. The PLAIN run found aiokafka
logging the password at DEBUG (fixed: sidecar.stream hides SASL payloads).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.leaks import as_bytes, find_leaks, forms, recognisable_secret
from support.sasl_plain import PlainLoginRefuser
from support.streams import (
    WAIT_S,
    AuthenticatingBroker,
    collect,
    kafka_section,
    produce,
    query,
    tiny_model,
    web_section,
)

from model_store import RedisStore, save_dir
from sidecar.local import EmbeddedBroker, EmbeddedRedis, WorkerProcess, free_port, settings_env
from sidecar.settings import load_settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KB = "default"
SASL_USER = "sidecar-sasl-user"


def test_the_scan_finds_a_secret_in_every_form() -> None:
    import base64

    secret = recognisable_secret("probe")
    for leak in [
        secret,
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret),
        base64.b64encode(b"user:" + secret.encode()).decode(),
        base64.b64encode(b"\0\0" + secret.encode()).decode(),
        base64.urlsafe_b64encode(b"x" + secret.encode()).decode(),
        secret.encode().hex(),
        secret[3:18],
    ]:
        output = f'{{"msg": "connecting with {leak} now"}}'.encode()
        assert find_leaks({"probe": secret}, {"log": output}), leak
    assert find_leaks({"probe": secret}, {"log": b"nothing " + secret[:11].encode()}) == []
    assert len(forms(secret)) > 20


class Run:
    """Everything one run wrote, by where it came from."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env  # SIDECAR_* variables and the secrets directory, as in production
        self.outputs: dict[str, bytes] = {}

    def add(self, where: str, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.outputs[where] = self.outputs.get(where, b"") + data

    def cli(self, label: str, *args: str, rc: int = 0) -> str:
        """``sidecar ARGS`` in this process (a child process costs seconds of imports):
        its stdout, its stderr with every log line, and the traceback that would end a
        --debug run. ``label`` names the run in a failure (the arguments may hold a
        secret)."""
        from sidecar.cli import main

        # The command configures the root logger; the test's own logging stays as it was.
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SIDECAR_")}
        try:
            result = CliRunner(env={**clean, **self.env}).invoke(main, list(args))
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
        self.add(f"{label} (stdout)", result.stdout_bytes)
        self.add(f"{label} (stderr)", result.stderr_bytes or b"")
        said = result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            assert result.exc_info is not None
            said += "".join(traceback.format_exception(*result.exc_info))
            self.add(f"{label} (traceback)", said)
        assert result.exit_code == rc, f"{label}: {said[-3000:]}"
        return said

    def process(
        self, label: str, args: list[str], env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """``python -m sidecar ARGS`` as a child process; every byte it writes is kept."""
        res = subprocess.run(
            [sys.executable, "-m", "sidecar", *args],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")},
                 **self.env, **env},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        self.add(f"{label} (stdout)", res.stdout)
        self.add(f"{label} (stderr)", res.stderr)
        return res

    def http(self, worker: WorkerProcess, path: str) -> Any:
        import httpx

        r = httpx.get(worker.base_url + path, timeout=5)
        self.add(f"GET {path}", f"{r.status_code} {r.headers}\n".encode() + r.content)
        try:
            return r.json()
        except ValueError:
            return r.text

    def records(self, topic: str, records: list[Any]) -> None:
        for r in records:
            headers = [p for h in (r.headers or []) for p in h]
            self.add(f"topic {topic}", as_bytes([r.key, r.value, *headers]) + b"\n")


def _wait_for(what: str, check: Callable[[], bool], worker: WorkerProcess) -> None:
    deadline = time.monotonic() + 60.0
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{worker.log_tail()}"
        time.sleep(0.2)


def _refused_sasl_logins(run: Run, sasl_password: str) -> None:
    """A worker logging in to a broker that refuses it, with SCRAM and with PLAIN."""
    with AuthenticatingBroker() as scram, PlainLoginRefuser() as plain:
        for mechanism, url in (("SCRAM-SHA-512", scram.url), ("PLAIN", plain.url)):
            res = run.process(
                f"worker, SASL {mechanism}",
                ["worker", "--no-create-topics"],
                {
                    "SIDECAR_KAFKA__BROKERS": url,
                    "SIDECAR_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                    "SIDECAR_KAFKA__SASL_MECHANISM": mechanism,
                },
            )
            # Beside the JSON log records, one error line that says what happened (the
            # SCRAM refusal was a traceback, aiokafka's KeyError 'v'; the PLAIN one was
            # "cannot reach the broker ... retrying may help").
            said = [ln for ln in res.stderr.splitlines() if not ln.startswith("{")]
            assert res.returncode == 2 and len(said) == 1, res.stderr[-3000:]
            assert said[0].startswith(
                f"error: SASL {mechanism} authentication of user '{SASL_USER}' with the broker"
            ), said
            assert "retrying may help" not in said[0]
    # the PLAIN login did carry the password (which aiokafka logged at DEBUG before)
    assert any(sasl_password.encode() in p for p in plain.received)


@pytest.mark.slow  # the worker loads the real encoder
async def test_no_output_of_a_run_holds_a_credential(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    from sidecar.stream import ensure_topics

    secrets = {
        "redis password": recognisable_secret("redis-pw"),
        "SASL password": recognisable_secret("sasl-pw"),
        "HMAC key": recognisable_secret("hmac-key"),
    }
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "redis__password").write_text(secrets["redis password"] + "\n")
    (secrets_dir / "kafka__sasl_password").write_text(secrets["SASL password"])
    (secrets_dir / "store__hmac_key").write_text(secrets["HMAC key"])
    redis_pw, hmac_key = secrets["redis password"], secrets["HMAC key"].encode()

    with EmbeddedRedis(args=("--requirepass", redis_pw)) as server:
        host = server.url.split("://", 1)[1].split("/", 1)[0]
        settings = load_settings(
            kafka=kafka_section(broker, sasl_username=SASL_USER),
            redis={"url": server.url},
            store={"backend": "redis", "poll_interval_s": 1.0},
            web=web_section(),
            log={"json_lines": True, "level": "DEBUG"},  # every command logs at DEBUG
        )
        assert settings.redis.password is None  # the secrets reach the runs as files only
        run = Run({**settings_env(settings), "SIDECAR_SECRETS_DIR": str(secrets_dir)})

        # -- the CLI ----------------------------------------------------------------------
        run.cli("settings", "settings")
        shown = json.loads(run.outputs["settings (stdout)"])
        assert shown["redis"]["password"] == shown["store"]["hmac_key"] == "**********"
        assert shown["kafka"]["sasl_password"] == "**********"
        good = save_dir(tiny_model(0), tmp_path / "good")
        out = run.cli("import", "models", "import", str(good), "--allow-unsigned", "--promote")
        assert "promoted" in out
        run.cli("list", "models", "list", "--json")
        run.cli("show", "models", "show", KB)
        run.cli("export", "models", "export", KB, "active", str(tmp_path / "exported"))
        for f in (tmp_path / "exported").iterdir():
            run.add(f"exported {f.name}", f.read_bytes())
        elsewhere = save_dir(tiny_model(1).signed(b"someone-elses-key"), tmp_path / "other")
        assert "signature" in run.cli("import signed elsewhere", "models", "import",
                                      str(elsewhere), rc=2).lower()  # fmt: skip
        # the password sent and refused (another user), unreachable, unparsable, in the URL
        quoted = urllib.parse.quote(redis_pw, safe="")
        dead = f"127.0.0.1:{free_port()}"
        for label, url, said, rc in [
            ("refused", f"redis://nobody@{host}/0", "refused the credentials", 2),
            ("unreachable", f"redis://:{quoted}@{dead}/0", "is unreachable", 2),
            ("unparsable", f"redis://:{redis_pw}@{host}/0", "invalid Redis URL", 2),
            ("in the URL", f"redis://:{quoted}@{host}/0?password={quoted}", "", 0),
        ]:
            assert said in run.cli(label, "models", "list", "--redis-url", url, rc=rc)
            if rc:  # the same failure with its traceback, as --debug shows it
                out = run.cli(f"{label} --debug", "--debug", "models", "list", "--redis-url",
                              url, rc=1)  # fmt: skip
                assert "Traceback" in out

        # -- a worker ---------------------------------------------------------------------
        await ensure_topics(settings)
        k = settings.kafka
        worker = WorkerProcess(
            settings,
            log_path=tmp_path / "worker.log",
            extra_env={"SIDECAR_SECRETS_DIR": str(secrets_dir)},
            log_level="DEBUG",
        )
        with worker:
            # the SASL logins (child processes of their own) run while the encoder loads
            sasl_logins = asyncio.create_task(
                asyncio.to_thread(_refused_sasl_logins, run, secrets["SASL password"])
            )
            ready = await asyncio.to_thread(worker.wait_ready, WAIT_S)
            assert ready["checks"]["store"]["ok"]
            good_queries = [query(f"q{i}", f"question number {i}") for i in range(5)]
            bad = [
                (None, b"\xff\xfe not utf-8"),
                (None, b"{not json"),
                query("b1", "x" * 5000),
                query("b2", "which kb?", kb="no-such-kb"),
                (None, json.dumps({"id": "b3"}).encode()),
            ]
            await produce(broker.bootstrap, k.queries_topic, good_queries + bad)
            got = await collect(
                broker.bootstrap,
                [k.verdicts_topic, k.dlq_topic],
                lambda g: len(g[k.verdicts_topic]) >= 5 and len(g[k.dlq_topic]) >= len(bad),
            )
            assert len(got[k.verdicts_topic]) == 5 and len(got[k.dlq_topic]) == len(bad)
            for path in ("/readyz", "/models", "/metrics", "/healthz"):
                run.http(worker, path)

            # a model that does not load: signed with another key, promoted by a key holder
            with RedisStore(server.url, password=redis_pw, hmac_key=hmac_key) as signer:
                with RedisStore(server.url, password=redis_pw,
                                hmac_key=b"someone-elses-key") as other:  # fmt: skip
                    bad_version = other.put(tiny_model(2))
                signer.promote(KB, bad_version)

            def failed_load() -> bool:
                metrics = run.http(worker, "/metrics")
                found = re.search(rf'sidecar_model_load_failures{{kb="{KB}"}} (\S+)', metrics)
                return found is not None and float(found.group(1)) >= 1

            await asyncio.to_thread(_wait_for, "the refused load", failed_load, worker)

            # Redis refuses the password mid-run: the worker reconnects and is refused
            with RedisStore(server.url, password=redis_pw) as admin:
                admin.client.config_set("requirepass", "changed-by-the-test")
                admin.client.client_kill_filter(_type="normal", skipme=True)

                def store_refused() -> bool:
                    return not run.http(worker, "/readyz")["checks"]["store"]["ok"]

                await asyncio.to_thread(_wait_for, "the store's refusal", store_refused, worker)
                admin.client.config_set("requirepass", redis_pw)
            for path in ("/readyz", "/models", "/metrics"):
                run.http(worker, path)
        assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()
        run.add("worker log", (tmp_path / "worker.log").read_bytes())
        # and whatever the worker left on disk (faust's data directory)
        datadir = Path(tempfile.gettempdir()) / f"sidecar-faust-{settings.kafka.app_id}"
        for f in [p for p in datadir.rglob("*") if p.is_file()]:
            run.add(f"worker file {f.relative_to(datadir)}", f.read_bytes())
        assert b"refused the credentials" in run.outputs["worker log"]
        assert f"refused version {bad_version}".encode() in run.outputs["worker log"]

    everything = await collect(
        broker.bootstrap,
        [k.verdicts_topic, k.dlq_topic],
        lambda g: len(g[k.verdicts_topic]) >= 5 and len(g[k.dlq_topic]) >= len(bad),
    )
    for topic, records in everything.items():
        run.records(topic, records)
    reasons = sorted(json.loads(r.value)["reason"] for r in everything[k.dlq_topic])
    assert reasons == sorted(["undecodable", "invalid_json", "too_long", "unknown_kb",
                              "missing_text"])  # fmt: skip

    await sasl_logins  # started beside the worker
    assert len(run.outputs) > 30
    assert find_leaks(secrets, run.outputs) == []

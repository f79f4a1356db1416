"""The model store behind Redis ACL users and over TLS, against real redis-server processes.

The ACL lines are read from the deployment guide and run as written: what the guide tells
operators is what is tested. Certificates are made by the test (``openssl``); the TLS
tests are skipped where redis-server was built without TLS.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from click.testing import CliRunner, Result
from support.streams import (
    DIM,
    WAIT_S,
    collect,
    kafka_section,
    produce,
    query,
    tiny_model,
    web_section,
)
from support.tls import Certs, make_certs, redis_supports_tls, rediss_url, tls_redis

from model_store import AsyncRedisStore, save_dir
from sidecar.cli import main
from sidecar.local import EmbeddedBroker, EmbeddedRedis, WorkerProcess
from sidecar.settings import load_settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "operations" / "deployment.md"
ADMIN_PW = "admin-pw-for-the-test"
PASSWORDS = {"sidecar-publisher": "publisher-pw-7c1d", "sidecar-worker": "worker-pw-90ab"}
HMAC_KEY = "hmac-key-for-the-acl-test"
KB = "default"


def documented_acl_lines() -> dict[str, list[str]]:
    """user -> the ``ACL SETUSER`` line of the deployment guide, as arguments, with the
    test's password in place of the placeholder."""
    found = dict(re.findall(r"^ACL SETUSER (sidecar-[\w-]+) (.*)$", GUIDE.read_text(), re.M))
    assert set(found) == set(PASSWORDS), f"the guide's ACL lines are for {sorted(found)}"
    out: dict[str, list[str]] = {}
    for user, rules in found.items():
        args = ["ACL", "SETUSER", user, *shlex.split(rules)]
        placeholder = [a for a in args if a.startswith(">")]
        assert len(placeholder) == 1, rules
        args[args.index(placeholder[0])] = ">" + PASSWORDS[user]
        out[user] = args
    return out


def apply_acl_lines(admin: redis.Redis) -> None:
    for args in documented_acl_lines().values():
        assert admin.execute_command(*args) in (b"OK", "OK", True)


def cli_env(tmp_path: Path, **settings: str) -> dict[str, str | None]:
    """No SIDECAR_ variable of the calling shell, an empty secrets directory, and
    ``settings`` as SIDECAR_<NAME> variables."""
    (tmp_path / "no-secrets").mkdir(exist_ok=True)
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SIDECAR_")}
    env["SIDECAR_SECRETS_DIR"] = str(tmp_path / "no-secrets")
    env.update({f"SIDECAR_{k.upper()}": v for k, v in settings.items()})
    return env


def cli(env: dict[str, str | None], *args: str) -> str:
    result = CliRunner(env=env).invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _refused(client: redis.Redis, *command: Any) -> str:
    """The server's refusal of ``command`` (a failure if it ran)."""
    with pytest.raises(redis.exceptions.ResponseError) as info:
        client.execute_command(*command)
    said = str(info.value)
    assert re.search(r"NOPERM|no permissions|can't access", said, re.I), (command, said)
    return said


# -- ACL users ----------------------------------------------------------------------------


async def _read_as_a_worker(url: str, password: str) -> tuple[str | None, str]:
    """Every read the model watcher makes, through the worker's user."""
    store = AsyncRedisStore(url, password=password, hmac_key=HMAC_KEY.encode())
    try:
        await store.ping()
        after = await store.last_event_id(KB)
        pointer = await store.active_pointer(KB)
        assert pointer is not None
        artifact = await store.get(KB, pointer.version)
        assert await store.active(KB) == artifact.version
        assert await store.wait_events({KB: "0"}, 0.2)  # XREAD
        assert after != "0"
        return await store.previous(KB), artifact.version
    finally:
        await store.close()


def test_the_documented_acl_users_publish_and_serve_inside_the_key_prefix_only(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    with EmbeddedRedis(args=("--requirepass", ADMIN_PW)) as server:
        admin = redis.Redis.from_url(server.url, password=ADMIN_PW)
        apply_acl_lines(admin)
        admin.set("other:data", "kept")
        admin.set("oodsc2:data", "kept")  # a sibling prefix is outside too
        host = server.url.split("://", 1)[1]

        # (a) the publisher runs every store command of the CLI, signing and sealing
        publisher = cli_env(
            tmp_path,
            redis__url=f"redis://sidecar-publisher@{host}",
            redis__password=PASSWORDS["sidecar-publisher"],
            store__hmac_key=HMAC_KEY,
        )
        dirs = [save_dir(tiny_model(i), tmp_path / f"art{i}") for i in range(4)]
        for d in dirs[:3]:
            assert "promoted" in cli(publisher, "models", "import", str(d), "--allow-unsigned",
                                     "--promote")  # fmt: skip
        cli(publisher, "models", "import", str(dirs[3]), "--allow-unsigned")
        rows = json.loads(cli(publisher, "models", "list", "--json"))
        versions = [r["version"] for r in rows]
        assert "deleted 1" in cli(publisher, "models", "gc", "--retention", "2")  # chunk DELs
        assert "->" in cli(publisher, "models", "rollback", KB)
        assert "promoted" in cli(publisher, "models", "promote", KB, versions[3][:8])
        assert "seal:     valid" in cli(publisher, "models", "show", KB)
        cli(publisher, "models", "export", KB, "active", str(tmp_path / "exported"))
        # the training job publishes and promotes through the same user
        rng = np.random.default_rng(0)
        for name, n in (("kb", 60), ("id", 40)):
            np.save(tmp_path / f"{name}.npy", rng.normal(size=(n, DIM)).astype(np.float32))
        trained = cli(publisher, "train", "--kb-embeddings", str(tmp_path / "kb.npy"),
                      "--id-embeddings", str(tmp_path / "id.npy"), "--detector", "residual",
                      "--criterion", "evr", "--m", "4", "--no-report", "--no-progress",
                      "--out", str(tmp_path / "trained"), "--publish")  # fmt: skip
        assert "promoted" in trained, trained

        # (a) the worker's user reads all a worker reads
        previous, active = asyncio.run(
            _read_as_a_worker(f"redis://sidecar-worker@{host}", PASSWORDS["sidecar-worker"])
        )
        assert previous == versions[3] and active not in versions  # the trained one

        # (b) neither user gets out of the prefix; the worker's cannot write inside it
        users = {u: redis.Redis.from_url(f"redis://{u}@{host}", password=p)
                 for u, p in PASSWORDS.items()}  # fmt: skip
        escape = admin.script_load("return redis.call('SET', 'other:data', 'overwritten')")
        peek = admin.script_load("return redis.call('GET', 'other:data')")
        for user, client in users.items():
            for command in [
                ("GET", "other:data"),
                ("SET", "other:data", "x"),
                ("DEL", "other:data", "oodsc2:data"),
                ("GET", "oodsc2:data"),
                ("KEYS", "*"),
                ("SCAN", "0"),
                ("RANDOMKEY",),
                ("FLUSHDB",),
                ("FLUSHALL",),
                ("CONFIG", "GET", "requirepass"),
                ("CONFIG", "SET", "appendonly", "yes"),
                ("ACL", "LIST"),
                ("EVAL", "return 1", "0"),
                ("SCRIPT", "FLUSH"),
                ("FUNCTION", "FLUSH"),
                ("PUBLISH", "channel", "message"),
                ("RENAME", "oodsc:kbs", "other:kbs"),
                ("COPY", "oodsc:kbs", "other:copy"),
                ("CLIENT", "LIST"),
                ("SHUTDOWN", "NOSAVE"),
            ]:
                _refused(client, *command)
            if user == "sidecar-publisher":
                # scripts of its own are checked against the same key patterns
                _refused(client, "EVALSHA", escape, "1", "oodsc:kbs")
                _refused(client, "EVALSHA", peek, "1", "oodsc:kbs")
            else:
                for command in [
                    ("SET", "oodsc:kb:default:active", "x"),
                    ("DEL", "oodsc:kb:default:active"),
                    ("XADD", "oodsc:kb:default:events", "*", "action", "promote"),
                    ("EVALSHA", escape, "0"),
                    ("SCRIPT", "LOAD", "return 1"),
                ]:
                    _refused(client, *command)
            client.close()
        assert admin.get("other:data") == b"kept" and admin.get("oodsc2:data") == b"kept"
        assert not admin.exists("other:kbs", "other:copy")

        # a command the user lacks is one line that says so, not a traceback or "retry"
        worker = cli_env(
            tmp_path,
            redis__url=f"redis://sidecar-worker@{host}",
            redis__password=PASSWORDS["sidecar-worker"],
            store__hmac_key=HMAC_KEY,
        )
        line = one_error_line(CliRunner(env=worker).invoke(main, ["models", "list"]))
        assert "refused a command to this user" in line and "smembers" in line, line
        assert "retrying may help" not in line
        admin.close()


# -- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if not redis_supports_tls():
        pytest.skip("this redis-server was built without TLS")
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def mtls_redis(certs: Certs) -> Iterator[EmbeddedRedis]:
    """A redis-server that speaks TLS only and requires client certificates, with the
    guide's ACL users."""
    with tls_redis(certs, client_certs=True, extra=("--requirepass", ADMIN_PW)) as server:
        admin = redis.Redis.from_url(
            rediss_url(server),
            password=ADMIN_PW,
            ssl_ca_certs=str(certs.ca),
            ssl_certfile=str(certs.client_cert),
            ssl_keyfile=str(certs.client_key),
        )
        apply_acl_lines(admin)
        admin.close()
        yield server


def _tls_settings(certs: Certs, **more: str) -> dict[str, str]:
    return {
        "redis__ssl_ca_file": str(certs.ca),
        "redis__ssl_cert_file": str(certs.client_cert),
        "redis__ssl_key_file": str(certs.client_key),
        **more,
    }


@pytest.mark.slow  # the worker loads the real encoder
async def test_a_worker_scores_through_redis_over_mutual_tls_as_the_worker_user(
    broker: EmbeddedBroker, mtls_redis: EmbeddedRedis, certs: Certs, tmp_path: Path
) -> None:
    from sidecar.stream import ensure_topics

    publisher = cli_env(
        tmp_path,
        **_tls_settings(
            certs,
            redis__url=rediss_url(mtls_redis, "sidecar-publisher"),
            redis__password=PASSWORDS["sidecar-publisher"],
            store__hmac_key=HMAC_KEY,
        ),
    )
    art = save_dir(tiny_model(7), tmp_path / "art")
    assert "promoted" in cli(publisher, "models", "import", str(art), "--allow-unsigned",
                             "--promote")  # fmt: skip
    version = json.loads(cli(publisher, "models", "list", "--json"))[0]["version"]
    shown = json.loads(cli(publisher, "settings"))["redis"]
    assert shown["ssl_ca_file"] == str(certs.ca) and shown["url"].startswith("rediss://")

    s = load_settings(
        kafka=kafka_section(broker),
        redis={
            "url": rediss_url(mtls_redis, "sidecar-worker"),
            "password": PASSWORDS["sidecar-worker"],
            "ssl_ca_file": str(certs.ca),
            "ssl_cert_file": str(certs.client_cert),
            "ssl_key_file": str(certs.client_key),
        },
        store={"hmac_key": HMAC_KEY, "poll_interval_s": 1.0},
        web=web_section(),
    )
    await ensure_topics(s)
    k = s.kafka
    with WorkerProcess(s, log_path=tmp_path / "worker.log") as w:
        ready = await asyncio.to_thread(w.wait_ready, WAIT_S)
        assert ready["checks"]["store"]["ok"], ready
        await produce(broker.bootstrap, k.queries_topic, [query("tls-1", "hello over TLS")])
        got = await collect(broker.bootstrap, [k.verdicts_topic], lambda g: any(g.values()))
    verdicts = [json.loads(r.value) for r in got[k.verdicts_topic]]
    assert [(v["id"], v["model_version"]) for v in verdicts] == [("tls-1", version)]


@pytest.mark.parametrize(
    ("what", "words"),
    [
        ("another CA", ["the server's TLS certificate did not verify", "redis.ssl_ca_file"]),
        ("no client certificate", ["the TLS handshake failed", "redis.ssl_cert_file"]),
        ("a CA file that is not there", ["cannot load the Redis TLS CA file", "FileNotFoundError"]),
        ("a redis:// URL", ["invalid settings", "is not a rediss:// URL"]),
    ],
)
def test_a_tls_setup_that_cannot_work_is_refused_in_one_line(
    mtls_redis: EmbeddedRedis,
    certs: Certs,
    tmp_path: Path,
    one_error_line: Callable[[Result], str],
    what: str,
    words: list[str],
) -> None:
    settings = _tls_settings(
        certs,
        redis__url=rediss_url(mtls_redis, "sidecar-publisher"),
        redis__password=PASSWORDS["sidecar-publisher"],
    )
    if what == "another CA":
        settings["redis__ssl_ca_file"] = str(certs.other_ca)
    elif what == "no client certificate":
        del settings["redis__ssl_cert_file"], settings["redis__ssl_key_file"]
    elif what == "a CA file that is not there":
        settings["redis__ssl_ca_file"] = str(tmp_path / "nowhere.pem")
    else:
        settings["redis__url"] = settings["redis__url"].replace("rediss://", "redis://")
    result = CliRunner(env=cli_env(tmp_path, **settings)).invoke(main, ["models", "list"])
    line = one_error_line(result)
    assert all(w in line for w in words), line
    assert "retrying may help" not in line and "unreachable" not in line, line
    assert PASSWORDS["sidecar-publisher"] not in result.output


def test_the_url_may_name_the_server_by_a_host_name_in_its_certificate(
    mtls_redis: EmbeddedRedis, certs: Certs, tmp_path: Path
) -> None:
    env = cli_env(
        tmp_path,
        **_tls_settings(
            certs,
            redis__url=rediss_url(mtls_redis, "sidecar-publisher", host="localhost"),
            redis__password=PASSWORDS["sidecar-publisher"],
        ),
    )
    cli(env, "models", "list")

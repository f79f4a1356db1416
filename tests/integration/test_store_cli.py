"""``sidecar models ...`` end to end, on a directory store and on a real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from model_store import RedisStore, build_artifact, save_dir
from sidecar.cli import main
from sidecar.embedded import EmbeddedRedis

pytestmark = pytest.mark.integration


def _artifact_dirs(tmp_path: Path, n: int = 3) -> list[Path]:
    dirs = []
    for i in range(n):
        art = build_artifact(
            kb="demo",
            encoder={"name": "e", "dim": 4},
            model={"kind": "combined", "i": i},
            arrays={"w": np.full(4, float(i))},
            metrics={"auroc": 0.9},
        )
        dirs.append(save_dir(art, tmp_path / f"art{i}"))
    return dirs


@pytest.fixture(params=["directory", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "redis":
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        return ["--redis-url", server.url]
    return ["--store-dir", str(tmp_path / "store")]


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_models_cli_lifecycle(tmp_path: Path, where: list[str]) -> None:
    d0, d1, d2 = _artifact_dirs(tmp_path)
    assert "promoted" in run("models", "import", str(d0), "--promote", *where)
    run("models", "import", str(d1), *where)
    v1 = json.loads(run("models", "list", "--json", *where))[1]["version"]
    assert "promoted" in run("models", "promote", "demo", v1[:6], *where)  # a unique prefix
    rows = json.loads(run("models", "list", "demo", "--json", *where))
    assert [r["state"] for r in rows] == ["previous", "active"]
    table = run("models", "list", *where)
    assert "*" in table and "VERSION" in table and "combined" in table

    assert f"-> {rows[0]['version']}" in run("models", "rollback", "demo", *where)
    out = run("models", "show", "demo", *where)
    assert "rollback" in out and f"active:   {rows[0]['version']}" in out
    assert '"kind": "combined"' in run("models", "show", "demo", "active", *where)

    run("models", "export", "demo", "active", str(tmp_path / "exported"), *where)
    assert (tmp_path / "exported" / "manifest.json").is_file()
    run("models", "import", str(d2), *where)
    assert "deleted" in run("models", "gc", "--retention", "2", *where)


def test_models_cli_errors_are_one_line(tmp_path: Path, where: list[str]) -> None:
    result = CliRunner().invoke(main, ["models", "rollback", "demo", *where])
    assert result.exit_code == 2
    assert result.output.startswith("error:") and "no previous version" in result.output
    result = CliRunner().invoke(main, ["models", "import", str(tmp_path / "nothing"), *where])
    assert result.exit_code == 2 and "not an artifact directory" in result.output


def test_import_requires_signature_when_key_set(
    tmp_path: Path, redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    (d0,) = _artifact_dirs(tmp_path, 1)
    monkeypatch.setenv("SIDECAR_STORE__HMAC_KEY", "s3cret")
    args = ["models", "import", str(d0), "--redis-url", redis_server.url]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "unsigned" in result.output
    run(*args, "--allow-unsigned")  # signed with the local key on the way in
    store = RedisStore(redis_server.url, hmac_key=b"s3cret")
    (v,) = store.versions("demo")
    assert store.get("demo", v).manifest["signature"]
    store.close()

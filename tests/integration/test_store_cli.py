"""``sidecar models ...`` end to end, on a directory store and on a real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import DirectoryStore, RedisStore, build_artifact, save_dir
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


def test_wrong_paths_are_one_line(tmp_path: Path, one_error_line: Callable[[Result], str]) -> None:
    (d0,) = _artifact_dirs(tmp_path, 1)
    store = ["--store-dir", str(tmp_path / "store")]
    run("models", "import", str(d0), "--promote", *store)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")

    line = one_error_line(CliRunner().invoke(main, ["models", "import", str(a_file), *store]))
    assert str(a_file) in line  # NotADirectoryError
    for target in (a_file, a_file / "x"):  # FileExistsError, NotADirectoryError
        args = ["models", "export", "demo", "active", str(target), *store]
        line = one_error_line(CliRunner().invoke(main, args))
        assert str(a_file) in line
    assert a_file.read_text() == "not a directory\n"


def test_store_dir_that_is_a_file_does_not_suggest_retrying(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    result = CliRunner().invoke(main, ["models", "list", "--store-dir", str(a_file)])
    line = one_error_line(result)
    assert str(a_file) in line and "retrying" not in line


def _signed_dir(tmp_path: Path, name: str, key: bytes, *, tamper: bool = False) -> Path:
    art = build_artifact(
        kb="demo", encoder={"name": "e", "dim": 4}, model={"kind": "combined"}, arrays={}
    ).signed(key)
    d = save_dir(art, tmp_path / name)
    if tamper:  # edited after signing: the checksums still hold, the signature does not
        manifest = json.loads((d / "manifest.json").read_text())
        manifest["model"]["kind"] = "max_cosine"
        (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_allow_unsigned_still_rejects_a_wrong_signature(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    store_dir = tmp_path / "store"
    env = {"SIDECAR_STORE__HMAC_KEY": "k", "SIDECAR_SECRETS_DIR": str(tmp_path / "none")}
    rejected = [
        _signed_dir(tmp_path, "other-key", b"other-key"),
        _signed_dir(tmp_path, "tampered", b"other-key", tamper=True),
        _signed_dir(tmp_path, "tampered-own-key", b"k", tamper=True),
    ]
    for d in rejected:
        args = ["models", "import", str(d), "--store-dir", str(store_dir), "--allow-unsigned"]
        line = one_error_line(CliRunner(env=env).invoke(main, args))
        assert "signature does not match" in line
    assert DirectoryStore(store_dir).kbs() == []

    # Waived: no signature at all; and a signature made with the configured key verifies.
    (unsigned,) = _artifact_dirs(tmp_path, 1)
    for d in (unsigned, _signed_dir(tmp_path, "own-key", b"k")):
        args = ["models", "import", str(d), "--store-dir", str(store_dir), "--allow-unsigned"]
        result = CliRunner(env=env).invoke(main, args)
        assert result.exit_code == 0, result.output
    assert len(DirectoryStore(store_dir, hmac_key=b"k").versions("demo")) == 2

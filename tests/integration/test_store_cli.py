"""``sidecar models ...`` end to end, on a directory store and on a real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import Artifact, DirectoryStore, ModelStore, RedisStore, build_artifact, save_dir
from sidecar.cli import main
from sidecar.local import EmbeddedRedis
from sidecar.persistence import model_to_artifact
from sidecar.scoring import fit_ood_model

pytestmark = pytest.mark.integration


def _artifact(seed: int = 0, detector: str = "logreg") -> Artifact:
    """A tiny real model (8 dims, ``detector`` on 2 PCs) that a worker can load; ``seed``
    varies its content, hence its version."""
    rng = np.random.default_rng(seed)
    return model_to_artifact(
        fit_ood_model(
            kb="demo",
            encoder={"name": "e", "dim": 8},
            kb_embeddings=rng.normal(size=(30, 8)),
            id_embeddings=rng.normal(size=(30, 8)),
            ood_embeddings=rng.normal(2.0, 1.0, size=(30, 8)),
            calibration_embeddings=rng.normal(size=(20, 8)),
            target_frr=0.1,
            detector=detector,
            criterion="evr",
            m=2,
            k=4,
        )
    )


def _artifact_dirs(tmp_path: Path, n: int = 3) -> list[Path]:
    return [save_dir(_artifact(i), tmp_path / f"art{i}") for i in range(n)]


@pytest.fixture(autouse=True)
def _workers_run_the_models_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_SCORING__ENCODER", "e")


@pytest.fixture(params=["directory", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "redis":
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        return ["--redis-url", server.url]
    (tmp_path / "store").mkdir()  # an empty store: only import may create one
    return ["--store-dir", str(tmp_path / "store")]


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_models_cli_lifecycle(tmp_path: Path, where: list[str]) -> None:
    d0, d1, d2 = _artifact_dirs(tmp_path)
    assert "promoted" in run("models", "import", str(d0), "--promote", *where)
    assert "(already active)" in run("models", "import", str(d0), "--promote", *where)
    run("models", "import", str(d1), *where)
    v1 = json.loads(run("models", "list", "--json", *where))[1]["version"]
    assert "promoted" in run("models", "promote", "demo", v1[:6], *where)  # a unique prefix
    rows = json.loads(run("models", "list", "demo", "--json", *where))
    assert [r["state"] for r in rows] == ["previous", "active"]
    table = run("models", "list", *where)
    assert "*" in table and "VERSION" in table and "logreg" in table

    assert f"-> {rows[0]['version']}" in run("models", "rollback", "demo", *where)
    out = run("models", "show", "demo", *where)
    assert "rollback" in out and f"active:   {rows[0]['version']}" in out
    assert '"kind": "logreg"' in run("models", "show", "demo", "active", *where)

    run("models", "export", "demo", "active", str(tmp_path / "exported"), *where)
    assert (tmp_path / "exported" / "manifest.json").is_file()
    run("models", "import", str(d2), *where)
    assert "deleted" in run("models", "gc", "--retention", "2", *where)


def test_gc_of_every_kb_sweeps_a_kb_whose_first_put_was_killed(tmp_path: Path) -> None:
    import os
    import time

    (d0,) = _artifact_dirs(tmp_path, 1)
    where = ["--store-dir", str(tmp_path / "store")]
    run("models", "import", str(d0), *where)
    stale = tmp_path / "store" / "other" / "versions" / ".tmp-0123.abc"
    stale.mkdir(parents=True)
    hours_ago = time.time() - 7200
    os.utime(stale, (hours_ago, hours_ago))
    out = run("models", "gc", *where)
    assert "demo: deleted 0 version(s)" in out and "other" not in out.split("removed")[0]
    assert "removed 1 leftover(s) of interrupted writes" in out and not stale.exists()


def test_gc_of_one_kb_says_what_it_swept(tmp_path: Path) -> None:
    import os
    import time

    (d0,) = _artifact_dirs(tmp_path, 1)
    where = ["--store-dir", str(tmp_path / "store")]
    run("models", "import", str(d0), *where)
    stale = tmp_path / "store" / "demo" / "versions" / ".tmp-0123.abc"
    fresh = stale.with_name(".tmp-4567.def")  # a put in progress: not touched
    for p in (stale, fresh):
        p.mkdir(parents=True)
    hours_ago = time.time() - 7200
    os.utime(stale, (hours_ago, hours_ago))
    out = run("models", "gc", "demo", *where)
    assert "demo: deleted 0 version(s)" in out
    assert "removed 1 leftover(s) of interrupted writes" in out
    assert not stale.exists() and fresh.exists()


def test_promoting_a_model_of_another_encoder_is_refused(
    tmp_path: Path, where: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Workers running the settings' encoder (the default here) would refuse it; one that
    # starts afterwards would have no model at all.
    monkeypatch.delenv("SIDECAR_SCORING__ENCODER")
    (d0,) = _artifact_dirs(tmp_path, 1)
    result = CliRunner().invoke(main, ["models", "import", str(d0), "--promote", *where])
    assert result.exit_code == 2 and "built with encoder 'e'" in result.output
    assert "all-MiniLM-L6-v2" in result.output and "nothing was imported" in result.output
    run("models", "import", str(d0), *where)  # storing it without promoting is fine
    (row,) = json.loads(run("models", "list", "demo", "--json", *where))
    result = CliRunner().invoke(main, ["models", "promote", "demo", row["version"], *where])
    assert result.exit_code == 2 and "nothing was promoted" in result.output
    assert "promoted" in run("models", "promote", "demo", row["version"], "--any-encoder", *where)


def test_models_cli_errors_are_one_line(tmp_path: Path, where: list[str]) -> None:
    result = CliRunner().invoke(main, ["models", "rollback", "demo", *where])
    assert result.exit_code == 2
    assert result.output.startswith("error:") and "no previous version" in result.output
    result = CliRunner().invoke(main, ["models", "import", str(tmp_path / "nothing"), *where])
    assert result.exit_code == 2 and "not an artifact directory" in result.output
    # a mistyped KB is an error, not an empty KB
    (d0,) = _artifact_dirs(tmp_path, 1)
    run("models", "import", str(d0), *where)
    for command in (["show", "dmeo"], ["gc", "dmeo"]):
        result = CliRunner().invoke(main, ["models", *command, *where])
        assert result.exit_code == 2, result.output
        assert "KB 'dmeo' has no versions in this store (its KBs: demo)" in result.output


def test_import_requires_signature_when_key_set(
    tmp_path: Path, redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    (d0,) = _artifact_dirs(tmp_path, 1)
    monkeypatch.setenv("SIDECAR_STORE__HMAC_KEY", "s3cret")
    args = ["models", "import", str(d0), "--redis-url", redis_server.url]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "unsigned" in result.output
    assert "--allow-unsigned imports it signed with that key" in result.output
    out = run(*args, "--allow-unsigned")  # signed with the local key on the way in
    assert "changes nothing" not in out
    store = RedisStore(redis_server.url, hmac_key=b"s3cret")
    (v,) = store.versions("demo")
    assert store.get("demo", v).manifest["signature"]
    store.close()


def test_allow_unsigned_without_a_signing_key_says_it_does_nothing(tmp_path: Path) -> None:
    (d0,) = _artifact_dirs(tmp_path, 1)
    out = run("models", "import", str(d0), "--store-dir", str(tmp_path / "s"), "--allow-unsigned")
    assert "no signing key is configured, so --allow-unsigned changes nothing" in out


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
    art = _artifact(seed=100).signed(key)  # not the content of _artifact_dirs' models
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
    (tmp_path / "none").mkdir()  # an empty secrets dir: no secret files
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


@pytest.mark.parametrize("command", [["gc"], ["promote", "demo", "active"], ["rollback", "demo"]])
def test_commands_that_change_a_store_refuse_a_missing_store_dir(
    tmp_path: Path, command: list[str], one_error_line: Callable[[Result], str]
) -> None:
    missing = tmp_path / "mistyped"
    args = ["models", *command, "--store-dir", str(missing)]
    line = one_error_line(CliRunner().invoke(main, args))
    assert f"store directory {missing} does not exist" in line
    assert not missing.exists()  # no stray empty store


def _broken(model: dict[str, Any], arrays: dict[str, np.ndarray], what: str) -> str:
    """Edit a copy of a loadable model section in place; return what the error must name."""
    if what == "kind":
        model["kind"] = "bogus"
        return "unknown detector kind 'bogus'"
    if what == "threshold":
        model["threshold"] = "abc"
        return "'abc'"
    if what == "nan-array":  # loads, but every query would be a scoring failure
        arrays["subspace.components"] = arrays["subspace.components"].copy()
        arrays["subspace.components"][0, -1] = np.nan
        return "not finite"
    if what == "misfit-array":  # every checksum right, but no KB document to compare with
        arrays["kb_embeddings"] = arrays["kb_embeddings"][:0]
        return "KB embeddings have shape (0, 8)"
    arrays["detector.coef"] = arrays["detector.coef"][:1]  # 1 weight for 2 features
    return "malformed"


def _unloadable(what: str) -> tuple[Artifact, str]:
    """An artifact whose checksums are right (built afresh) but that no worker can load."""
    good = _artifact(detector="combined" if what == "misfit-array" else "logreg")
    model = json.loads(json.dumps(good.manifest["model"]))
    arrays = dict(good.arrays)
    problem = _broken(model, arrays, what)
    art = build_artifact(kb="demo", encoder=good.manifest["encoder"], model=model, arrays=arrays)
    return art, problem


def _store(where: list[str]) -> ModelStore:
    flag, value = where
    return DirectoryStore(Path(value)) if flag == "--store-dir" else RedisStore(value)


@pytest.mark.parametrize("what", ["kind", "threshold", "short-array", "nan-array", "misfit-array"])
def test_an_unloadable_model_is_neither_imported_nor_promoted(
    tmp_path: Path, where: list[str], what: str, one_error_line: Callable[[Result], str]
) -> None:
    (good,) = _artifact_dirs(tmp_path, 1)
    run("models", "import", str(good), "--promote", *where)
    before = json.loads(run("models", "list", "--json", *where))
    bad, problem = _unloadable(what)

    args = ["models", "import", str(save_dir(bad, tmp_path / "bad")), "--promote", *where]
    line = one_error_line(CliRunner().invoke(main, args))
    assert "not a loadable model" in line and problem in line and "nothing was imported" in line
    assert json.loads(run("models", "list", "--json", *where)) == before

    store = _store(where)  # stored behind the CLI's back, as an older release could have
    try:
        version = store.put(bad)
    finally:
        store.close()
    line = one_error_line(CliRunner().invoke(main, ["models", "promote", "demo", version, *where]))
    assert problem in line and "nothing was promoted" in line
    rows = json.loads(run("models", "list", "--json", *where))
    assert [r["version"] for r in rows if r["state"] == "active"] == [before[0]["version"]]


def test_a_redis_that_refuses_the_credentials_says_so_without_retrying(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    password = "S3cr3t-store-pw"
    with EmbeddedRedis(args=("--requirepass", password)) as server:
        base = server.url
        wrong = base.replace("redis://", "redis://:not-it@")
        for url, said in [
            (base, "it needs a password (redis.password"),
            (wrong, "invalid username-password pair"),
        ]:
            line = one_error_line(CliRunner().invoke(main, ["models", "list", "--redis-url", url]))
            assert "refused the credentials" in line and said in line, line
            assert "unreachable" not in line and "retrying may help" not in line, line
            assert "not-it" not in line
        right = base.replace("redis://", f"redis://:{password}@")
        assert "no versions" in run("models", "list", "--redis-url", right)


@pytest.mark.parametrize(
    "command",
    [
        ["score", "hello"],
        ["check", "--id-embeddings", "{ids}"],
        ["calibrate", "--id-embeddings", "{ids}", "--out", "{out}"],
    ],
)
@pytest.mark.parametrize("what", ["misfit-array", "nan-array"])
def test_commands_that_read_an_artifact_refuse_an_unservable_one_in_one_line(
    tmp_path: Path, command: list[str], what: str, one_error_line: Callable[[Result], str]
) -> None:
    bad, problem = _unloadable(what)
    directory = save_dir(bad, tmp_path / "bad")
    ids = tmp_path / "ids.npy"
    np.save(ids, np.random.default_rng(1).normal(size=(120, 8)).astype(np.float32))
    args = [a.format(ids=ids, out=tmp_path / "recal") for a in command]
    line = one_error_line(CliRunner().invoke(main, [*args, "--artifact", str(directory)]))
    assert "not a loadable model" in line and problem in line
    assert not (tmp_path / "recal").exists()


def test_gc_of_a_kb_whose_first_put_was_killed_clears_it(tmp_path: Path) -> None:
    import os
    import time

    (tmp_path / "store").mkdir()
    where = ["--store-dir", str(tmp_path / "store")]
    stale = tmp_path / "store" / "demo" / "versions" / ".tmp-0123.abc"
    stale.mkdir(parents=True)
    hours_ago = time.time() - 7200
    os.utime(stale, (hours_ago, hours_ago))
    assert "removed 1 leftover(s) of interrupted writes" in run("models", "gc", "demo", *where)
    assert not stale.exists()
    result = CliRunner().invoke(main, ["models", "gc", "demo", *where])  # now nothing there
    assert result.exit_code == 2 and "has no versions in this store" in result.output


def test_an_unsealed_pointer_is_shown_and_resealed_by_promoting_its_version(
    tmp_path: Path, where: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose pointer was moved before pointers were sealed (an earlier release):
    `models show` says the seal does not hold and how to fix it; commands that read the
    `active` version refuse it (they would check, export or re-seal what a writer without
    the key chose); `models promote KB VERSION` seals it."""
    d0, d1 = _artifact_dirs(tmp_path, 2)
    run("models", "import", str(d0), "--promote", *where)
    assert "seal:     - (no signing key" in run("models", "show", "demo", *where)
    monkeypatch.setenv("SIDECAR_STORE__HMAC_KEY", "s3cret")
    run("models", "import", str(d1), "--allow-unsigned", "--promote", *where)
    store: ModelStore
    if where[0] == "--redis-url":
        store = RedisStore(where[1], hmac_key=b"s3cret")
        store.client.delete(store.keys.seal("demo"))
    else:
        store = DirectoryStore(Path(where[1]), hmac_key=b"s3cret")
        state_file = Path(where[1]) / "demo" / "state.json"
        state = json.loads(state_file.read_text())
        state_file.write_text(json.dumps({k: v for k, v in state.items() if k != "seal"}))
    v = store.active("demo")
    assert v is not None
    shown = run("models", "show", "demo", *where)
    assert "seal:     NOT VALID" in shown and "carries no seal" in shown
    assert f"`sidecar models promote demo {v}` seals it" in shown
    for command in (["promote", "demo", "active"], ["export", "demo", "active", "out"]):
        result = CliRunner().invoke(main, ["models", *command, *where])
        assert result.exit_code == 2 and "carries no seal" in result.output, result.output
    assert "sealed its pointer anew" in run("models", "promote", "demo", v[:8], *where)
    assert "seal:     valid (seq" in run("models", "show", "demo", *where)
    assert "sealed its pointer anew" in run("models", "promote", "demo", "active", *where)
    pointer = store.active_pointer("demo")
    assert pointer is not None and pointer.version == v and pointer.seq is not None
    store.close()

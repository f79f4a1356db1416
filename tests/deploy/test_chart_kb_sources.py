"""The retraining job reading its KB and queries from PostgreSQL: the values, what they
render to, what the schema and the templates refuse, and one real run of the rendered
command line against the PostgreSQL server of this machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _chart_render import FULLNAME, pod_spec
from click.testing import CliRunner

from sidecar.cli import main

pytestmark = pytest.mark.deploy

JOB = ("CronJob", f"{FULLNAME}-retrain")
PG = {
    "enabled": True,
    "kb": "rag.documents",
    "idQueries": "SELECT question AS text FROM rag.faq_log WHERE in_domain",
    "oodQueries": "rag.off_topic",
    "dsnSecret": {"name": "pg-app", "key": "uri"},
}


def _job(render: Any, **retraining: Any) -> dict[str, Any]:
    return pod_spec(render({"retraining": {"enabled": True, **retraining}})[JOB])


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_postgres_options_replace_the_file_options(render: Any) -> None:
    spec = _job(render, postgres=PG)
    (container,) = spec["containers"]
    args = container["args"]
    assert _flag(args, "--kb-sql") == "rag.documents"
    assert _flag(args, "--id-queries-sql") == PG["idQueries"]
    assert _flag(args, "--ood-queries-sql") == "rag.off_topic"
    assert not {"--kb", "--id-queries", "--ood-queries"} & set(args)
    assert "--publish" in args and _flag(args, "--kb-name") == "default"
    # No KB files: no kb volume; the DSN is the job's secret file postgres__dsn.
    assert "kb" not in {v["name"] for v in spec["volumes"]}
    (secrets,) = [v for v in spec["volumes"] if v["name"] == "secrets"]
    assert secrets["projected"]["sources"] == [
        {"secret": {"name": "pg-app", "items": [{"key": "uri", "path": "postgres__dsn"}]}}
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert (
        mounts["secrets"]["mountPath"] == "/run/secrets/sidecar" and mounts["secrets"]["readOnly"]
    )
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output


def test_the_dsn_secret_joins_existing_secrets_for_the_job_only(render: Any) -> None:
    pg = {**PG, "dsnSecret": {"name": "pg-app", "key": "uri", "passwordKey": "password"}}
    docs = render({"existingSecret": "sc", "retraining": {"enabled": True, "postgres": pg}})
    (secrets,) = [v for v in pod_spec(docs[JOB])["volumes"] if v["name"] == "secrets"]
    assert secrets["projected"]["sources"] == [
        {"secret": {"name": "sc"}},
        {
            "secret": {
                "name": "pg-app",
                "items": [
                    {"key": "uri", "path": "postgres__dsn"},
                    {"key": "password", "path": "postgres__password"},
                ],
            }
        },
    ]
    worker = pod_spec(docs[("Deployment", FULLNAME)])
    assert "pg-app" not in json.dumps(worker)
    # Without a DSN Secret of its own the DSN is the key postgres__dsn of existingSecret.
    plain = pod_spec(
        render(
            {
                "existingSecret": "sc",
                "retraining": {"enabled": True, "postgres": {**PG, "dsnSecret": {"name": ""}}},
            }
        )[JOB]
    )
    (secrets,) = [v for v in plain["volumes"] if v["name"] == "secrets"]
    assert secrets["secret"]["secretName"] == "sc"


def test_a_kb_from_postgres_beside_query_files(render: Any) -> None:
    args = [
        "train",
        "--kb=/kb/old.jsonl",
        "--id-queries",
        "/kb/id.jsonl",
        "--out",
        "/tmp/o",
        "--publish",
    ]
    spec = _job(
        render,
        kbSource={"configMap": "kb"},
        args=args,
        postgres={"enabled": True, "kb": "docs", "dsnSecret": {"name": "pg"}},
    )
    got = spec["containers"][0]["args"]
    assert "--kb=/kb/old.jsonl" not in got and _flag(got, "--kb-sql") == "docs"
    assert _flag(got, "--id-queries") == "/kb/id.jsonl"  # kept: a file of kbSource
    assert "kb" in {v["name"] for v in spec["volumes"]}


def test_the_gate_reads_held_out_queries_from_postgres(render: Any) -> None:
    gate = {
        "enabled": True,
        "maxFrr": 0.02,
        "minAuroc": 0.95,
        "idQueriesSql": "SELECT text, embedding FROM rag.held_out WHERE in_domain",
        "oodQueriesSql": "rag.held_out_ood",
    }
    spec = _job(render, postgres=PG, gate=gate)
    (train,), (check,) = spec["initContainers"], spec["containers"]
    assert _flag(train["args"], "--kb-sql") == "rag.documents"
    args = check["args"]
    assert _flag(args, "--id-queries-sql") == gate["idQueriesSql"]
    assert _flag(args, "--ood-queries-sql") == "rag.held_out_ood"
    assert "--id-queries" not in args and "--ood-queries" not in args
    assert "kb" not in {v["name"] for v in spec["volumes"]}
    for container in (train, check):  # both read the DSN
        assert "secrets" in {m["name"] for m in container["volumeMounts"]}
        result = CliRunner().invoke(main, [*container["args"], "--help"])
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("retraining", "message"),
    [
        (
            {"postgres": {**PG, "kb": ""}},
            "retraining.postgres.kb",
        ),
        (
            {"postgres": {**PG, "dsnSecret": {"name": ""}}},
            "retraining.postgres needs the DSN",
        ),
        (
            {"postgres": {**PG, "oodQueries": ""}},
            "retraining.args reads --ood-queries from a file, but there is no retraining.kbSource",
        ),
        (
            {"postgres": PG, "gate": {"enabled": True, "maxFrr": 0.02}},
            "retraining.gate reads held-out queries from kbSource files",
        ),
        (
            {
                "kbSource": {"configMap": "k"},
                "gate": {"enabled": True, "maxFrr": 0.1, "idQueriesSql": "q"},
            },
            "gate.idQueriesSql and oodQueriesSql are read with retraining.postgres",
        ),
        (
            {"postgres": PG, "gate": {"enabled": True, "minAuroc": 0.9, "idQueriesSql": "q"}},
            r"need gate.oodQueries \(or gate.oodQueriesSql\)",
        ),
        ({}, r"kbSource.existingClaim or retraining.kbSource.configMap \(or retraining.postgres\)"),
    ],
)
def test_incomplete_postgres_values_fail_the_render(
    render_raw: Any, retraining: dict[str, Any], message: str
) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match=message):
        render_raw({"retraining": {"enabled": True, **retraining}})


@pytest.mark.parametrize(
    "postgres",
    [
        {"enabled": True, "table": "docs"},
        {"enabled": True, "kb": 3},
        {"enabled": True, "kb": "docs", "dsnSecret": {"name": "Not_A_Name"}},
        {"enabled": True, "kb": "docs", "dsnSecret": {"name": "pg", "key": ""}},
        {"enabled": True, "kb": ""},
    ],
)
def test_the_schema_refuses_bad_postgres_values(render_raw: Any, postgres: dict[str, Any]) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match="postgres"):
        render_raw(
            {"retraining": {"enabled": True, "kbSource": {"configMap": "k"}, "postgres": postgres}}
        )


def test_the_rendered_job_trains_from_postgres(render: Any, tmp_path: Path) -> None:
    """The job's command line as rendered, with the DSN as the secret file the projected
    volume makes, against a scratch database holding the demo KB and queries."""
    import psycopg
    from support.postgres import ADMIN_DSN, _unavailable, create_database, drop_database

    from model_store import DirectoryStore

    why = _unavailable()
    if why is not None:
        pytest.skip(why)
    data = Path(__file__).resolve().parents[2] / "sidecar" / "data"
    dsn = create_database(ADMIN_DSN)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE docs (id text, text text)")
            conn.execute("CREATE TABLE queries (text text, in_domain bool)")
            with conn.cursor() as cur:
                for name, in_domain in (("kb", None), ("id_queries", True), ("ood_queries", False)):
                    rows = [
                        json.loads(x)
                        for x in (data / f"demo_{name}.jsonl").read_text().split("\n")
                        if x
                    ]
                    if in_domain is None:
                        cur.executemany(
                            "INSERT INTO docs VALUES (%s, %s)", [(r["id"], r["text"]) for r in rows]
                        )
                    else:
                        cur.executemany(
                            "INSERT INTO queries VALUES (%s, %s)",
                            [(r["text"], in_domain) for r in rows],
                        )
        pg = {
            "enabled": True,
            "kb": "docs",
            "idQueries": "SELECT text FROM queries WHERE in_domain",
            "oodQueries": "SELECT text FROM queries WHERE NOT in_domain",
            "dsnSecret": {"name": "pg-app"},
        }
        values = {
            "scoring": {"kbs": ["clinic"], "defaultKb": "clinic"},
            "retraining": {"enabled": True, "postgres": pg},
        }
        (container,) = pod_spec(render(values)[JOB])["containers"]
        secrets = tmp_path / "secrets"
        secrets.mkdir()
        (secrets / "postgres__dsn").write_text(dsn + "\n")  # what the projected volume holds
        env = {  # HOME stays: the encoder's ONNX export is reused from ~/.cache
            "SIDECAR_SECRETS_DIR": str(secrets),
            "SIDECAR_STORE__BACKEND": "directory",
            "SIDECAR_STORE__DIRECTORY": str(tmp_path / "store"),
            "SIDECAR_SCORING__KBS": '["clinic"]',
        }
        args = [a.replace("/tmp/", f"{tmp_path}/") for a in container["args"]]
        more = ["--detector", "knn", "--cache-dir", str(tmp_path / "cache")]
        res = CliRunner().invoke(main, [*args, *more], env=env)
        assert res.exit_code == 0, res.output
        assert DirectoryStore(tmp_path / "store").active("clinic") is not None
    finally:
        drop_database(ADMIN_DSN, dsn)

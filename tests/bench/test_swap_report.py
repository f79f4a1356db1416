"""The arithmetic of ``sidecar bench swap``'s report, on hand-made verdict streams."""

from __future__ import annotations

from typing import Any

from sidecar.bench._swap_report import swap_report

A, B = "a" * 16, "b" * 16
PROMOTE, ROLLBACK = 100.0, 200.0  # unix seconds


def verdict(qid: str, part: int, off: int, version: str | None, ts_s: float) -> dict[str, Any]:
    return {
        "id": qid,
        "model_version": version,
        "ts": ts_s * 1000,
        "latency_ms": 10.0,
        "_partition": part,
        "_offset": off,
    }


def report(verdicts: list[dict[str, Any]], sent_ids: list[str]) -> dict[str, Any]:
    sent = {q: (50.0 + i, 0) for i, q in enumerate(sent_ids)}
    return swap_report(
        sent=sent,
        verdicts=verdicts,
        marks={"promote": PROMOTE, "rollback": ROLLBACK},
        install={},
        owners={0: 0, 1: 1},
        versions={"A": A, "B": B},
        swap_window=3.0,
        config={},
    )


def test_clean_swap_and_rollback() -> None:
    vs = [
        verdict("q1", 0, 0, A, 99),
        verdict("q2", 0, 1, B, 100.4),
        verdict("q3", 0, 2, A, 200.2),
        verdict("q4", 1, 0, A, 99),
        verdict("q5", 1, 1, B, 100.9),
        verdict("q6", 1, 2, A, 201),
    ]
    r = report(vs, [f"q{i}" for i in range(1, 7)])
    assert (r["lost"], r["duplicates"], r["version_regressions"]) == (0, 0, 0)
    sw = r["swap_latency_ms"]
    assert sw["promote"]["first_verdict_per_replica"] == {"replica-0": 400.0, "replica-1": 900.0}
    assert sw["rollback"]["max"] == 1000.0 and sw["max"] == 1000.0
    assert r["met"]["swap_latency_ms"] is True


def test_regression_loss_and_duplicates_are_counted() -> None:
    vs = [
        verdict("q1", 0, 0, A, 99),
        verdict("q2", 0, 1, B, 101),
        verdict("q3", 0, 2, A, 150),
        verdict("q3", 0, 3, B, 150.1),  # redelivered: a duplicate
        verdict("q5", 1, 0, B, 102),
    ]
    r = report(vs, ["q1", "q2", "q3", "q4", "q5"])
    assert r["lost"] == 1 and r["duplicates"] == 1
    # q3: A after B and before the rollback mark; its duplicate (B) is back in line.
    assert r["version_regressions"] == 1
    assert r["met"]["lost"] is False and r["met"]["version_regressions"] is False
    # replica 1 never served A after the rollback mark: no latency, target not met
    assert r["swap_latency_ms"]["rollback"]["max"] is None
    assert r["met"]["swap_latency_ms"] is False


def test_aggregate_sums_counts_and_takes_medians() -> None:
    from sidecar.bench._swap_report import aggregate_runs

    good = [
        verdict("q1", 0, 0, A, 99),
        verdict("q2", 0, 1, B, 100.4),
        verdict("q3", 0, 2, A, 200.2),
        verdict("q4", 1, 0, A, 99),
        verdict("q5", 1, 1, B, 100.9),
        verdict("q6", 1, 2, A, 201),
    ]
    ids = [f"q{i}" for i in range(1, 7)]
    runs = [report(good, ids), report(good, ids), report(good[:-1], ids)]
    agg = aggregate_runs(runs)
    assert agg["sent"] == 18 and agg["lost"] == 1 and agg["config"]["repeat"] == 3
    assert agg["swap_latency_ms"]["per_run"] == [1000.0, 1000.0, None]
    assert agg["swap_latency_ms"]["max"] is None  # a run without a full swap is not hidden
    assert agg["met"]["lost"] is False and agg["met_every_run"]["lost"] is False
    assert len(agg["runs"]) == 3

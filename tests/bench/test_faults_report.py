"""The fault benchmark's accounting and helpers, on small hand-made runs (no broker)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from sidecar.bench._faults_report import Window, account, parse_metrics, probes


def sent(qid: str, t: float, p: int = 0, o: int = 0, **kw: Any) -> dict[str, Any]:
    return {"id": qid, "t_send": t, "t_ack": t + 0.01, "partition": p, "offset": o, **kw}


def verdict(qid: str, t: float, version: str = "A", v: str = "ID", **kw: Any) -> dict[str, Any]:
    return {
        "kind": "verdict",
        "id": qid,
        "ts": t * 1000,
        "verdict": v,
        "model_version": version,
        **kw,
    }


def dead(qid: str, t: float, reason: str = "scoring_failed") -> dict[str, Any]:
    return {"kind": "dead", "id": qid, "ts": t * 1000, "reason": reason, "detail": "encoder: x"}


def test_lost_duplicates_and_their_share() -> None:
    rows = [sent(f"q{i}", 100.0 + i) for i in range(4)]
    rows.append({"id": "never", "t_send": 99.0, "t_ack": None, "error": "KafkaTimeoutError"})
    answers = [
        verdict("q0", 100.1),
        verdict("q0", 105.0),  # scored again after a crash: a duplicate
        dead("q1", 101.1),
        verdict("q2", 102.1),
        verdict("q2", 106.0, version="B"),  # a duplicate that disagrees
        verdict("stranger", 103.0),
    ]
    acc = account(rows, answers, Window(101.5, 101.5))
    d = acc.as_dict()
    assert (d["sent"], d["send_failed"], d["answered"]) == (4, 1, 3)
    assert (d["verdicts"], d["dead_lettered"]) == (4, 1)  # "stranger" is no query of ours
    assert (d["lost"], d["lost_ids"]) == (1, ["q3"])
    assert (d["duplicates"], d["duplicates_inconsistent"]) == (2, 1)
    assert d["duplicates_by_partition"] == {"0": 2}
    assert d["duplicate_share"] == 0.5 and d["unexpected_answers"] == 1
    assert d["answer_delay_s"]["max"] == pytest.approx(0.1)


def test_recovery_is_the_first_answer_to_a_query_sent_after_the_fault() -> None:
    rows = [
        sent("old", 9.0, p=0),  # sent before the end: its answer is not fresh
        sent("other", 10.5, p=1),  # fresh, but on a partition the fault did not touch
        sent("fresh", 11.0, p=0),
        sent("later", 12.0, p=0),
    ]
    answers = [verdict("old", 10.2), verdict("other", 10.6), verdict("fresh", 14.0)]
    answers.append(verdict("later", 13.5))
    w = Window(8.0, 10.0, partitions=frozenset({0}))
    assert account(rows, answers, w).recovery_s == pytest.approx(3.5)
    assert account(rows, answers, Window(8.0, 10.0)).recovery_s == pytest.approx(0.6)
    assert account(rows, [], w).recovery_s is None


def test_a_restarted_empty_broker_is_accounted_apart() -> None:
    # The broker stopped at 10 and came back empty at 20. q_old was acknowledged by the
    # old broker and never answered: gone with it. The old log of partition 0 ended at
    # offset 6, so q_skip (offset 1 of the new log) may have been passed over by a worker
    # that resumed where it was: lost to the reset. q_new, at offset 7 of partition 0,
    # has no answer: lost for real. (q_read and q_first were answered.)
    rows = [
        sent("q_old", 9.0, p=0, o=5),
        sent("q_skip", 21.0, p=0, o=1),
        sent("q_read", 21.1, p=0, o=6),
        sent("q_first", 21.0, p=1, o=0),
        sent("q_new", 22.0, p=0, o=7),
    ]
    answers = [verdict("q_read", 21.5), verdict("q_first", 21.4)]
    acc = account(rows, answers, Window(10.0, 20.0, broker_gap=(10.0, 20.0)))
    assert (acc.lost_with_broker, acc.lost_to_log_reset, acc.lost) == (1, 1, 1)
    assert acc.lost_ids == ["q_new"]


def test_a_commit_past_an_unanswered_record_is_caught() -> None:
    rows = [sent("a", 1.0, p=0, o=0), sent("b", 1.1, p=0, o=1), sent("c", 1.2, p=0, o=2)]
    answers = [verdict("a", 1.5), verdict("b", 9.0), verdict("c", 1.6)]
    # At t=2 the group had committed offset 2 on partition 0: "b" (offset 1) had no answer
    # yet, so the commit stepped over it. Offset 2 itself ("c") is not below the commit.
    snap = {"t": 2.0, "epoch": 1, "offsets": {0: 2}}
    assert account(rows, answers, Window(1.0, 1.0), snapshots=[snap]).committed_unanswered == 1
    ok = {"t": 2.0, "epoch": 1, "offsets": {0: 1}}
    assert account(rows, answers, Window(1.0, 1.0), snapshots=[ok]).committed_unanswered == 0
    # Snapshots of another broker life say nothing about this log.
    other = {"t": 2.0, "epoch": 2, "offsets": {0: 3}}
    acc = account(rows, answers, Window(1.0, 1.0), snapshots=[other], broker_starts=[0.0, 5.0])
    assert acc.committed_unanswered == 0


def test_versions_during_the_fault_and_no_model_verdicts() -> None:
    rows = [sent(f"q{i}", float(i)) for i in range(4)]
    answers = [
        verdict("q0", 0.5, version=None, v="OOD", reason="no_model"),
        verdict("q1", 1.5),
        verdict("q2", 2.5),
        verdict("q3", 3.5, version="B"),
    ]
    acc = account(rows, answers, Window(1.0, 3.0))
    assert acc.versions_during_fault == {"A": 2}
    assert acc.no_model_verdicts == 1


METRICS = """\
# HELP sidecar_records_total Query records answered
sidecar_records_total 120.0
sidecar_verdicts_total{kb="bench",verdict="ID"} 70.0
sidecar_verdicts_total{kb="bench",verdict="OOD"} 47.0
sidecar_dlq_total{reason="scoring_failed"} 3.0
sidecar_produce_errors_total 1.0
sidecar_fail_mode_verdicts_total{kb="bench"} 4.0
sidecar_model_load_failures{kb="bench"} 2.0
sidecar_model_info{detector="knn",kb="bench",version="v2"} 1.0
sidecar_store_active_info{kb="bench",version="v3"} 1.0
sidecar_consumer_lag{partition="0",topic="q"} 5.0
sidecar_consumer_lag{partition="1",topic="q"} 2.0
"""


def test_metrics_page_is_read() -> None:
    m = parse_metrics(METRICS)
    assert m["records"] == 120 and m["verdicts"] == 117 and m["dlq"] == {"scoring_failed": 3}
    assert (m["produce_errors"], m["fail_mode_verdicts"], m["load_failures"]) == (1, 4, 2)
    assert (m["model_version"], m["store_active"], m["lag"]) == ("v2", "v3", 7)


def test_probes_summarise_readiness_per_phase() -> None:
    def s(t: float, ready: bool, *failing: str, up: bool = True) -> dict[str, Any]:
        return {
            "t": t,
            "replica": "replica-0",
            "pid": 7,
            "up": up,
            "ready": ready,
            "failing": list(failing),
            "metrics": parse_metrics(METRICS) if up else None,
        }

    samples = [
        s(1.0, True),
        s(2.0, True),
        s(3.0, False, "broker"),
        s(4.0, False, up=False),
        s(5.0, False, "broker", "stream"),
        s(6.5, True),
    ]
    rep = probes(samples, Window(2.5, 6.0))["replica-0"]
    assert rep["before"] == {"samples": 2, "ready_share": 1.0, "failing": {}}
    assert rep["during"]["ready_share"] == 0.0
    assert rep["during"]["failing"] == {"broker": 2, "not_answering": 1, "stream": 1}
    assert rep["first_unready_after_fault_s"] == 0.5
    assert rep["ready_after_fault_end_s"] == 0.5
    assert rep["metrics"]["before_fault"]["records"] == 120
    assert rep["metrics"]["max_lag_during_fault"] == 7


def test_poison_checks() -> None:
    from sidecar.bench._faults_scenarios import poison_checks

    rows = [sent("a", 1.0), sent("p", 1.0, poison=True), sent("b", 1.0)]
    good = [verdict("a", 1.1), dead("p", 1.1), verdict("b", 1.1)]
    assert all(poison_checks(rows, good)["checks"].values())
    bad = [verdict("a", 1.1), verdict("p", 1.1), dead("b", 1.1)]
    checks = poison_checks(rows, bad)["checks"]
    assert not any(checks.values())


def test_the_kafka_proxy_holds_produce_requests_of_others_only() -> None:
    from sidecar.bench._faults_proxy import _held

    def request(api_key: int, client_id: str) -> bytes:
        cid = client_id.encode()
        return struct.pack(">hhih", api_key, 9, 42, len(cid)) + cid + b"\x00rest"

    assert _held(request(0, "faust-0.15.3"), "faults-")
    assert not _held(request(0, "faults-load"), "faults-")
    assert not _held(request(1, "faust-0.15.3"), "faults-")  # a fetch passes
    assert not _held(b"\x00", "faults-")


def test_the_poisoned_encoder_raises_on_the_marker_only() -> None:
    from sidecar.bench._faults_worker import PoisonedEncoder

    class Inner:
        name, dim, backend = "fake", 3, "onnx"

        def encode(self, texts: Any, *, batch_size: int = 64) -> np.ndarray:
            return np.ones((len(texts), 3), dtype=np.float32)

    enc = PoisonedEncoder(Inner(), "<<x>>")
    assert (enc.name, enc.dim, enc.backend) == ("fake", 3, "onnx")
    assert enc.encode(["a", "b"]).shape == (2, 3)
    with pytest.raises(ValueError, match="poisoned"):
        enc.encode(["a", "b <<x>> c"])
    with pytest.raises(ValueError, match="blank"):
        PoisonedEncoder(Inner(), " ")


def test_the_cli_lists_every_scenario() -> None:
    from click.testing import CliRunner

    from sidecar.bench import FAULT_SCENARIOS
    from sidecar.cli import main
    from sidecar.cli._bench_faults import SCENARIO_NAMES

    assert tuple(FAULT_SCENARIOS) == SCENARIO_NAMES
    out = CliRunner().invoke(main, ["bench", "faults", "--help"]).output
    assert all(name in out for name in SCENARIO_NAMES)
    res = CliRunner().invoke(main, ["bench", "faults", "--json", "x.json", "--scenario", "nope"])
    assert res.exit_code == 2 and "nope" in res.output


def test_what_a_crash_leaves_uncommitted_is_what_gets_scored_twice() -> None:
    from sidecar.bench._faults_report import answered_past_commit

    rows = [sent(f"q{o}", 1.0 + o / 10, p=0, o=o) for o in range(5)]
    rows.append(sent("elsewhere", 1.0, p=1, o=9))
    answers = [verdict(f"q{o}", 1.5 + o / 10) for o in range(4)]  # q4 not yet answered
    answers.append(verdict("elsewhere", 1.2))
    snap = {"t": 2.0, "epoch": 1, "offsets": {0: 2, 1: 0}}
    # Answered by t=2 and at or past the commit (2) on partition 0: q2 and q3 (1.7, 1.8).
    assert answered_past_commit(rows, answers, snap, frozenset({0})) == 2
    assert answered_past_commit(rows, answers, snap) == 3  # and "elsewhere" on partition 1


def test_the_halt_is_timed_from_the_worker_log(tmp_path: Any) -> None:
    import datetime as dt

    from sidecar.bench._faults_scenarios import halted_at

    log = tmp_path / "replica-0.log"
    log.write_text(
        "2026-01-31 12:00:00,000 INFO faust.worker: starting\n"
        "\x1b[?25h2026-01-31 12:00:05,250 CRITICAL sidecar.stream._runtime: stream halted: x\n"
        "2026-01-31 12:00:09,000 CRITICAL sidecar.stream._runtime: stream halted: again\n"
    )
    want = dt.datetime(2026, 1, 31, 12, 0, 5, 250000).timestamp()
    assert halted_at(log) == pytest.approx(want)
    log.write_text("2026-01-31 12:00:00,000 INFO all well\n")
    assert halted_at(log) is None

"""The fault benchmark's accounting, from what was sent and what came back (pure functions).

Every query the broker acknowledged must come back as a verdict or a dead letter: one
with neither is **lost**; each answer past a query's first is a **duplicate** (the query
was scored twice). **Recovery** is the time from the end of a fault to the first answer
to a query sent after it (on the partitions the fault touched, where it touched only
some). What ``/readyz`` and ``/metrics`` said is summed up per replica before, during and
after the fault.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.bench._e2e_report import percentile


@dataclass(frozen=True)
class Window:
    """When the fault began and ended (epoch s), and what it touched.

    ``partitions``: the query partitions the fault touched (None: all). ``broker_gap``:
    (stopped, started) when the broker was restarted empty in between; queries it had
    acknowledged before it stopped and that never came back were lost with it.
    """

    start: float
    end: float
    partitions: frozenset[int] | None = None
    broker_gap: tuple[float, float] | None = None


@dataclass
class Account:
    """Counts of one scenario (see :func:`account`)."""

    sent: int = 0
    verdicts: int = 0
    dead_lettered: int = 0
    answered: int = 0
    lost: int = 0
    lost_with_broker: int = 0
    lost_to_log_reset: int = 0
    duplicates: int = 0
    duplicates_inconsistent: int = 0
    duplicates_by_partition: dict[str, int] = field(default_factory=dict)
    unexpected_answers: int = 0
    send_failed: int = 0
    no_model_verdicts: int = 0
    committed_unanswered: int | None = None
    recovery_s: float | None = None
    answer_delay_s: dict[str, float | None] = field(default_factory=dict)
    versions_during_fault: dict[str, int] = field(default_factory=dict)
    lost_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["duplicate_share"] = round(self.duplicates / self.sent, 4) if self.sent else None
        d["lost_ids"] = self.lost_ids[:20]  # a sample; the count is ``lost``
        return d


def _key(a: dict[str, Any]) -> tuple[Any, ...]:
    """What must be equal between two answers to one query for them to be the same answer
    (a verdict is idempotent by id + model version)."""
    return (a["kind"], a.get("verdict"), a.get("model_version"), a.get("reason"))


def account(
    sent_rows: Sequence[dict[str, Any]],
    answers: Sequence[dict[str, Any]],
    window: Window,
    *,
    snapshots: Sequence[dict[str, Any]] = (),
    broker_starts: Sequence[float] = (),
) -> Account:
    """Lost, duplicated and recovered, from the producer's rows and the answers read.

    ``sent_rows``: one per query (``id``, ``t_send``, ``t_ack``, ``partition``, ``offset``;
    ``t_ack`` None when the broker never acknowledged it). ``answers``: verdicts and dead
    letters (``kind``, ``id``, ``ts`` in ms, ``verdict``, ``model_version``, ``reason``).
    ``snapshots``: committed offsets taken during the run (``t``, ``epoch``, ``offsets``);
    a record below a committed offset that had no answer by then breaks at-least-once.
    ``broker_starts``: when each broker life began (a record belongs to the last one
    before its acknowledgement).
    """
    acc = Account()
    by_id: dict[str, list[dict[str, Any]]] = {}
    for a in answers:
        if a.get("kind") in ("verdict", "dead"):
            by_id.setdefault(str(a.get("id")), []).append(a)
    for rows in by_id.values():
        rows.sort(key=lambda a: a.get("ts") or 0)
    sent = [r for r in sent_rows if r.get("t_ack") is not None]
    acc.send_failed = len(sent_rows) - len(sent)
    acc.sent = len(sent)
    sent_ids = {r["id"] for r in sent}
    acc.unexpected_answers = sum(len(v) for k, v in by_id.items() if k not in sent_ids)
    delays: list[float] = []
    gap = window.broker_gap
    reused = old_log_ends(sent, gap[0]) if gap is not None else {}
    excused: set[str] = set()
    for r in sent:
        got = by_id.get(r["id"], [])
        if not got:
            if gap is not None and r["t_ack"] < gap[0]:
                acc.lost_with_broker += 1
                excused.add(r["id"])
            elif gap is not None and r["offset"] < reused.get(r["partition"], 0):
                acc.lost_to_log_reset += 1
                excused.add(r["id"])
            else:
                acc.lost += 1
                acc.lost_ids.append(r["id"])
            continue
        acc.answered += 1
        acc.duplicates += len(got) - 1
        if len(got) > 1:
            p = str(r.get("partition"))
            acc.duplicates_by_partition[p] = acc.duplicates_by_partition.get(p, 0) + len(got) - 1
        acc.duplicates_inconsistent += sum(1 for a in got[1:] if _key(a) != _key(got[0]))
        if got[0].get("ts") is not None:
            delays.append(got[0]["ts"] / 1000.0 - r["t_send"])
    for qid, rows in by_id.items():
        if qid not in sent_ids:
            continue
        for a in rows:
            if a["kind"] == "verdict":
                acc.verdicts += 1
                acc.no_model_verdicts += a.get("reason") == "no_model"
            else:
                acc.dead_lettered += 1
    acc.recovery_s = recovery_s(sent, by_id, window)
    acc.answer_delay_s = _quantiles(delays)
    lo, hi = window.start * 1000, window.end * 1000
    acc.versions_during_fault = dict(
        Counter(
            str(a.get("model_version"))
            for rows in by_id.values()
            for a in rows
            if a["kind"] == "verdict" and lo <= (a.get("ts") or 0) <= hi
        )
    )
    if snapshots:
        kept = [r for r in sent if r["id"] not in excused]
        acc.committed_unanswered = sum(
            committed_unanswered(kept, by_id, s, broker_starts) for s in snapshots
        )
    return acc


def old_log_ends(sent: Iterable[dict[str, Any]], stopped: float) -> dict[int, int]:
    """Per partition, the end of the log the broker had when it stopped (the highest offset
    it had acknowledged, plus one). An empty broker numbers its log from 0 again: a worker
    that kept its position, or committed it to the new broker, does not read what the new
    log holds below that (a log reset, which a Kafka cluster that keeps its data never
    does); such records are lost to the reset, not by the worker."""
    out: dict[int, int] = {}
    for r in sent:
        if r.get("t_ack") is not None and r["t_ack"] < stopped:
            out[r["partition"]] = max(out.get(r["partition"], 0), r["offset"] + 1)
    return out


def recovery_s(
    sent: Iterable[dict[str, Any]], by_id: dict[str, list[dict[str, Any]]], window: Window
) -> float | None:
    """Seconds from the end of the fault to the first answer to a query sent after it
    (on the touched partitions); None when no such query was answered."""
    firsts = [
        by_id[r["id"]][0]["ts"] / 1000.0
        for r in sent
        if r["t_send"] >= window.end
        and r["id"] in by_id
        and (window.partitions is None or r.get("partition") in window.partitions)
        and by_id[r["id"]][0].get("ts") is not None
    ]
    return round(min(firsts) - window.end, 3) if firsts else None


def committed_unanswered(
    sent: Iterable[dict[str, Any]],
    by_id: dict[str, list[dict[str, Any]]],
    snapshot: dict[str, Any],
    broker_starts: Sequence[float] = (),
) -> int:
    """Records below a committed offset of ``snapshot`` with no answer made before it."""
    t_ms, epoch, offsets = snapshot["t"] * 1000.0, snapshot.get("epoch", 1), snapshot["offsets"]
    bad = 0
    for r in sent:
        if epoch_of(r["t_ack"], broker_starts) != epoch:
            continue
        if r["offset"] >= int(offsets.get(r["partition"], offsets.get(str(r["partition"]), 0))):
            continue
        got = by_id.get(r["id"], [])
        if not any((a.get("ts") or float("inf")) <= t_ms for a in got):
            bad += 1
    return bad


def answered_past_commit(
    sent: Iterable[dict[str, Any]],
    answers: Sequence[dict[str, Any]],
    snapshot: dict[str, Any],
    partitions: frozenset[int] | None = None,
) -> int:
    """Queries answered by ``snapshot``'s time at or past its committed offset (on
    ``partitions``): what a crash then leaves to be scored again, i.e. the duplicates to
    expect from it."""
    t_ms, offsets = snapshot["t"] * 1000.0, snapshot["offsets"]
    early = {a.get("id") for a in answers if (a.get("ts") or float("inf")) <= t_ms}
    return sum(
        1
        for r in sent
        if r.get("t_ack") is not None
        and r["id"] in early
        and (partitions is None or r["partition"] in partitions)
        and r["offset"] >= int(offsets.get(r["partition"], offsets.get(str(r["partition"]), 0)))
    )


def epoch_of(t: float, broker_starts: Sequence[float]) -> int:
    """Which broker life (1, 2, ...) ``t`` falls in; 1 when there was one."""
    return max(1, sum(1 for s in broker_starts if s <= t))


def _quantiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": round(percentile(xs, 0.5), 3),
        "p99": round(percentile(xs, 0.99), 3),
        "max": round(max(xs), 3),
    }


# -- what the replicas said -------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, Any]:
    """The figures of a ``/metrics`` page the fault benchmark follows."""
    out: dict[str, Any] = {"dlq": {}, "lag": 0.0}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        base, _, labels = name.partition("{")
        try:
            v = float(value)
        except ValueError:
            continue
        lab = dict(part.split("=", 1) for part in labels.rstrip("}").split(",") if "=" in part)
        lab = {k: x.strip('"') for k, x in lab.items()}
        if base == "sidecar_records_total":
            out["records"] = v
        elif base == "sidecar_verdicts_total":
            out["verdicts"] = out.get("verdicts", 0.0) + v
        elif base == "sidecar_dlq_total":
            out["dlq"][lab.get("reason", "?")] = v
        elif base == "sidecar_produce_errors_total":
            out["produce_errors"] = v
        elif base == "sidecar_fail_mode_verdicts_total":
            out["fail_mode_verdicts"] = out.get("fail_mode_verdicts", 0.0) + v
        elif base == "sidecar_model_load_failures":
            out["load_failures"] = out.get("load_failures", 0.0) + v
        elif base == "sidecar_model_info" and v == 1:
            out["model_version"] = lab.get("version")
        elif base == "sidecar_store_active_info" and v == 1:
            out["store_active"] = lab.get("version")
        elif base == "sidecar_consumer_lag":
            out["lag"] += v
    return out


def _phase(t: float, window: Window) -> str:
    return "before" if t < window.start else "during" if t < window.end else "after"


def probes(samples: Sequence[dict[str, Any]], window: Window) -> dict[str, Any]:
    """Per replica: the share of ``/readyz`` samples that said ready before, during and
    after the fault (a replica that did not answer counts as not ready), the checks that
    failed, how long after the fault began it first said not ready and how long after the
    fault ended it was ready again, and its metrics before the fault and at the end."""
    out: dict[str, Any] = {}
    for name in sorted({s["replica"] for s in samples}):
        mine = [s for s in samples if s["replica"] == name]
        rep: dict[str, Any] = {}
        for phase in ("before", "during", "after"):
            rows = [s for s in mine if _phase(s["t"], window) == phase]
            failing: Counter[str] = Counter()
            for s in rows:
                failing.update(s.get("failing", []) if s.get("up") else ["not_answering"])
            rep[phase] = {
                "samples": len(rows),
                "ready_share": round(sum(bool(s.get("ready")) for s in rows) / len(rows), 3)
                if rows
                else None,
                "failing": dict(failing),
            }
        unready = [
            s["t"] - window.start for s in mine if s["t"] >= window.start and not s.get("ready")
        ]
        rep["first_unready_after_fault_s"] = round(unready[0], 2) if unready else None
        ready = [s["t"] - window.end for s in mine if s["t"] >= window.end and s.get("ready")]
        rep["ready_after_fault_end_s"] = round(ready[0], 2) if ready else None
        rep["metrics"] = _metric_summary(mine, window)
        out[name] = rep
    return out


def _metric_summary(mine: Sequence[dict[str, Any]], window: Window) -> dict[str, Any]:
    scraped = [s for s in mine if s.get("metrics")]
    before = [s for s in scraped if s["t"] < window.start]
    during = [s for s in scraped if window.start <= s["t"] < window.end]
    keep = (
        "records", "dlq", "produce_errors", "fail_mode_verdicts", "load_failures",
        "model_version", "store_active", "lag",
    )  # fmt: skip

    def pick(s: dict[str, Any] | None) -> dict[str, Any] | None:
        if s is None:
            return None
        return {"pid": s.get("pid"), **{k: s["metrics"].get(k) for k in keep}}

    return {
        "before_fault": pick(before[-1] if before else None),
        "end": pick(scraped[-1] if scraped else None),
        "max_lag_during_fault": max((s["metrics"]["lag"] for s in during), default=None),
        "model_versions_during_fault": sorted(
            {str(s["metrics"].get("model_version")) for s in during}
        ),
    }

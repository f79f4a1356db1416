"""Report of the live-swap benchmark: lost and duplicated verdicts, version regressions,
swap latency per replica, and the latency tail in steady state and around the swaps."""

from __future__ import annotations

from typing import Any

from sidecar.bench._e2e_report import percentile

TARGETS = {
    "lost": 0,
    "duplicates": 0,
    "version_regressions": 0,
    "swap_latency_ms": 1000.0,
    "p99_during_swap_over_steady": 2.0,
}


def _p(values: list[float], q: float) -> float | None:
    return round(percentile(values, q / 100.0), 1) if values else None


def _met(
    *, lost: int, dups: int, regressions: int, swap_max: float | None, p99_s: Any, p99_d: Any
) -> dict[str, bool]:
    """Each target of the swap benchmark against the measured figures."""
    return {
        "lost": lost == TARGETS["lost"],
        "duplicates": dups == TARGETS["duplicates"],
        "version_regressions": regressions == TARGETS["version_regressions"],
        "swap_latency_ms": swap_max is not None and swap_max <= TARGETS["swap_latency_ms"],
        "p99_during_swap": (
            p99_s is not None
            and p99_d is not None
            and p99_d <= TARGETS["p99_during_swap_over_steady"] * p99_s
        ),
    }


def swap_report(
    *,
    sent: dict[str, tuple[float, int]],
    verdicts: list[dict[str, Any]],
    marks: dict[str, float],
    install: dict[str, dict[str, float | None]],
    owners: dict[int, int],
    versions: dict[str, str],
    swap_window: float,
    config: dict[str, Any],
) -> dict[str, Any]:
    """One run's report from what it sent (query id -> (send time in s, partition)), every
    verdict read back, the swap times (s) and the replicas' install delays (ms)."""
    from collections import Counter

    counts = Counter(v["id"] for v in verdicts)
    regressions, no_model = _regressions(verdicts, marks, versions)
    swap = _swap_latency(verdicts, marks, install, owners, versions)
    steady, during = _latency_tails(sent, verdicts, marks, swap_window)
    p99_s, p99_d = _p(steady, 99), _p(during, 99)
    lost = sum(1 for q in sent if q not in counts)
    dups = sum(c - 1 for c in counts.values() if c > 1)
    report: dict[str, Any] = {
        "bench": "swap",
        "config": config,
        "versions": versions,
        "partition_owner": {str(p): f"replica-{o}" for p, o in sorted(owners.items())},
        "sent": len(sent),
        "verdicts": len(verdicts),
        "lost": lost,
        "duplicates": dups,
        "version_regressions": regressions,
        "no_model_verdicts": no_model,
        "swap_latency_ms": swap,
        "p50_latency_ms_steady": _p(steady, 50),
        "p99_latency_ms_steady": p99_s,
        "p50_latency_ms_during_swap": _p(during, 50),
        "p99_latency_ms_during_swap": p99_d,
        "n_steady": len(steady),
        "n_during_swap": len(during),
        "targets": TARGETS,
    }
    report["met"] = _met(
        lost=lost,
        dups=dups,
        regressions=regressions,
        swap_max=swap["max"],
        p99_s=p99_s,
        p99_d=p99_d,
    )
    return report


def _regressions(
    verdicts: list[dict[str, Any]], marks: dict[str, float], versions: dict[str, str]
) -> tuple[int, int]:
    """Verdicts whose model version goes back in a partition's order; and verdicts with
    no model version at all."""
    # The versions a partition may go through, and from when: A, then B from the promotion,
    # then A again from the rollback. Anything else is a regression.
    inf = float("inf")
    epochs = [
        (versions["A"], -inf),
        (versions["B"], marks.get("promote", inf) * 1000),
        (versions["A"], marks.get("rollback", inf) * 1000),
    ]
    regressions, no_model = 0, 0
    by_part: dict[int, list[dict[str, Any]]] = {}
    for v in verdicts:
        by_part.setdefault(v["_partition"], []).append(v)
    for rows in by_part.values():
        e = 0
        for v in sorted(rows, key=lambda r: r["_offset"]):
            mv = v.get("model_version")
            if mv is None:
                no_model += 1
                continue
            ok = [
                j for j in range(e, len(epochs)) if epochs[j][0] == mv and epochs[j][1] <= v["ts"]
            ]
            if ok:
                e = ok[0]
            else:
                regressions += 1
    return regressions, no_model


def _swap_latency(
    verdicts: list[dict[str, Any]],
    marks: dict[str, float],
    install: dict[str, dict[str, float | None]],
    owners: dict[int, int],
    versions: dict[str, str],
) -> dict[str, Any]:
    """Per swap and replica, ms from the swap to the replica's first verdict by the new
    model (and to its install); the max over replicas, and over both swaps."""
    swap: dict[str, Any] = {}
    for name, target in (("promote", versions["B"]), ("rollback", versions["A"])):
        since = marks.get(name)
        per_replica: dict[str, float | None] = {}
        for i in sorted(set(owners.values())):
            parts = [p for p, o in owners.items() if o == i]
            firsts = [
                v["ts"]
                for v in verdicts
                if v["_partition"] in parts
                and v.get("model_version") == target
                and since
                and v["ts"] >= since * 1000
            ]
            per_replica[f"replica-{i}"] = (
                round(min(firsts) - since * 1000, 1) if firsts and since else None
            )
        vals = [x for x in per_replica.values() if x is not None]
        swap[name] = {
            "first_verdict_per_replica": per_replica,
            "installed_per_replica": install.get(name, {}),
            "max": max(vals) if vals and len(vals) == len(per_replica) else None,
        }
    maxes = [s["max"] for s in swap.values()]
    swap["max"] = max(maxes) if all(m is not None for m in maxes) else None
    return swap


def _latency_tails(
    sent: dict[str, tuple[float, int]],
    verdicts: list[dict[str, Any]],
    marks: dict[str, float],
    swap_window: float,
) -> tuple[list[float], list[float]]:
    """The first verdicts' own latencies (ms): of queries sent in steady state (after a
    2 s warm-up), and of those sent within ``swap_window`` s after a swap."""
    windows = [(t, t + swap_window) for t in marks.values()]
    warm = min(sent.values())[0] + 2.0 if sent else 0.0
    first: dict[str, dict[str, Any]] = {}
    for v in verdicts:
        first.setdefault(v["id"], v)
    steady: list[float] = []
    during: list[float] = []
    for qid, (t_sent, _) in sent.items():
        fv = first.get(qid)
        if fv is None or fv.get("latency_ms") is None:
            continue
        if any(a <= t_sent <= b for a, b in windows):
            during.append(float(fv["latency_ms"]))
        elif t_sent >= warm:
            steady.append(float(fv["latency_ms"]))
    return steady, during


def aggregate_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts summed over runs; latencies as the median over runs (each run kept in full)."""
    import statistics

    def med(key: str) -> float | None:
        vals = [r[key] for r in runs if r[key] is not None]
        return round(statistics.median(vals), 1) if vals else None

    counts = ("sent", "verdicts", "lost", "duplicates", "version_regressions", "no_model_verdicts")
    swap_max = [r["swap_latency_ms"]["max"] for r in runs]
    known = [x for x in swap_max if x is not None]
    out: dict[str, Any] = {
        "bench": "swap",
        "config": {**runs[0]["config"], "repeat": len(runs)},
        **{k: sum(r[k] for r in runs) for k in counts},
        "swap_latency_ms": {
            # The median over runs of each run's max over replicas (promote and rollback).
            "max": round(statistics.median(known), 1) if len(known) == len(runs) else None,
            "worst": max(known) if known else None,
            "per_run": swap_max,
        },
        **{
            k: med(k)
            for k in (
                "p50_latency_ms_steady",
                "p99_latency_ms_steady",
                "p50_latency_ms_during_swap",
                "p99_latency_ms_during_swap",
            )
        },
        "targets": TARGETS,
    }
    out["met"] = _met(
        lost=out["lost"],
        dups=out["duplicates"],
        regressions=out["version_regressions"],
        swap_max=out["swap_latency_ms"]["max"],
        p99_s=out["p99_latency_ms_steady"],
        p99_d=out["p99_latency_ms_during_swap"],
    )
    out["met_every_run"] = {k: all(r["met"][k] for r in runs) for k in out["met"]}
    out["runs"] = runs
    return out

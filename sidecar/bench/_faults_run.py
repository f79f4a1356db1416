"""Running the fault benchmark's scenarios one after the other, each on its own rig.

A scenario is *staged* (servers, workers, the producer process, all waited on until
ready) and then *played* (the stream starts, the fault, steady load after it, the drain,
the accounting). The next scenario is staged while the one before drains, which saves
the workers' start-up (about 15 s each on two CPUs) without overlapping any fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.bench._faults_load import LoadProcess
from sidecar.bench._faults_report import account, answered_past_commit, old_log_ends, probes
from sidecar.bench._faults_rig import KB, TOPICS, Rig
from sidecar.bench._faults_scenarios import (
    POISON_MARKER,
    Ctx,
    Outcome,
    Spec,
    log_reset_facts,
    poison_checks,
)

Fault = Callable[[Ctx], Any]


@dataclass(frozen=True)
class Options:
    """The load and fault options every scenario shares (see ``FaultsBenchConfig``)."""

    rate: float
    outage_s: float
    warmup_s: float
    after_s: float
    produce_timeout_s: float
    restart_delay_s: float
    sample_interval_s: float
    drain_s: float


@dataclass
class _Staged:
    name: str
    spec: Spec
    fault: Fault
    rig: Rig
    load: LoadProcess
    versions: dict[str, str]
    ready_s: float


async def run_all(
    plan: list[tuple[str, str, Spec, Fault]],
    o: Options,
    arts: dict[str, Any],
    logs: Path,
    echo: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Play each scenario of ``plan`` (name, what it does, its rig, its fault) in turn;
    its report by name. A scenario that could not run reports its error and fails its
    one check; the others still run."""
    docs: dict[str, dict[str, Any]] = {}
    nxt: asyncio.Future[_Staged] | None = None

    def stage(i: int) -> asyncio.Future[_Staged]:
        name, _, spec, fault = plan[i]
        return asyncio.ensure_future(_stage(name, spec, fault, o, arts, logs / name))

    try:
        nxt = stage(0)
        for i, (name, what, _, _) in enumerate(plan):
            echo(f"[{i + 1}/{len(plan)}] {name}: {what}")
            t = time.time()
            following = i + 1 < len(plan)

            def then(i: int = i, following: bool = following) -> None:
                nonlocal nxt
                if following and nxt is None:
                    nxt = stage(i + 1)

            current, nxt = nxt, None
            try:
                assert current is not None
                staged = await current
                echo(f"    worker(s) ready in {staged.ready_s:.1f} s; streaming")
                doc = await _play(staged, o, arts, echo, then)
            except Exception as exc:  # the report says what broke; the rest still runs
                doc = {"error": f"{type(exc).__name__}: {exc}", "checks": {"ran": False}}
            then()
            doc["wall_s"] = round(time.time() - t, 1)
            docs[name] = doc
            echo(_line(doc))
    finally:
        if nxt is not None:
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
    return docs


def _line(doc: dict[str, Any]) -> str:
    failed = [k for k, ok in doc["checks"].items() if not ok]
    verdict = "all checks passed" if not failed else f"FAILED: {', '.join(failed)}"
    if "error" in doc:
        return f"    {doc['error']}; {verdict}"
    return (
        f"    sent {doc['sent']}, verdicts {doc['verdicts']}, dead letters "
        f"{doc['dead_lettered']}, lost {doc['lost']}, duplicates {doc['duplicates']}, "
        f"recovery {doc['recovery_s']} s; {verdict}"
    )


async def _stage(
    name: str, spec: Spec, fault: Fault, o: Options, arts: dict[str, Any], logs: Path
) -> _Staged:
    """Start the scenario's servers, workers and producer and wait until they are up."""
    kafka = {"produce_timeout_s": o.produce_timeout_s} if spec.short_produce_timeout else {}
    rig = Rig(
        logs,
        kafka_proxy=spec.kafka_proxy,
        redis_proxy=spec.redis_proxy,
        sample_interval_s=o.sample_interval_s,
        kafka=kafka,
        hmac_key=spec.hmac_key,
    )
    load: LoadProcess | None = None
    try:
        await asyncio.to_thread(rig.start_servers)
        versions = {k: rig.store.put(arts[k]) for k in "ABE"}  # C, D: bad_artifact's own
        if spec.publish_first:
            rig.store.promote(KB, versions["A"])
        await rig.ensure_topics()
        t0 = time.time()
        rig.add_replicas(spec.replicas, poison_marker=POISON_MARKER if spec.poison else None)
        load = LoadProcess(
            {
                "bootstrap": rig.bootstrap, "topic": TOPICS["queries"], "kb": KB,
                "rate": o.rate, "prefix": name, "out": str(logs / "sent.jsonl"),
                "poison_marker": POISON_MARKER,
            },
            logs / "load.log",
        ).start()  # fmt: skip
        if spec.publish_first:
            await rig.wait_ready()
            await rig.stable_assignment()
        else:
            await _wait_up_without_model(rig)
        return _Staged(name, spec, fault, rig, load, versions, time.time() - t0)
    except BaseException:
        if load is not None:
            await asyncio.to_thread(load.stop, 10.0)
        await rig.close()
        raise


async def _play(
    st: _Staged,
    o: Options,
    arts: dict[str, Any],
    echo: Callable[[str], None],
    then: Callable[[], None],
) -> dict[str, Any]:
    """Stream, inject the fault, drain, account; ``then`` is called once the fault is
    over (the next scenario is staged from there)."""
    rig, load = st.rig, st.load
    try:
        rig.start_watchers()
        await load.go()
        await asyncio.sleep(o.warmup_s)
        ctx = Ctx(rig, load, st.versions, o.outage_s, o.restart_delay_s, echo, arts)
        outcome: Outcome = await st.fault(ctx)
        then()
        await asyncio.sleep(o.after_s)
        await asyncio.to_thread(load.stop)
        sent = load.records()
        await _drain(rig, sent, outcome, o.drain_s)
        outcome.snapshots.append(await rig.committed())
        answers = list(rig.answers)
        _keep(rig.workdir / "answers.jsonl", answers)
        return scenario_doc(st.name, rig, sent, answers, outcome, st.spec)
    finally:
        await asyncio.to_thread(load.stop, 10.0)
        await rig.close()


def _keep(path: Path, rows: list[dict[str, Any]]) -> None:
    """The answers read back, beside the producer's ``sent.jsonl``: the evidence."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


async def _wait_up_without_model(rig: Rig, timeout_s: float = 300.0) -> None:
    """Every replica answers with all its checks passing but the models one."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        ok = 0
        for r in rig.replicas:
            try:
                _, doc = await asyncio.to_thread(r.get, "/readyz")
                failing = {k for k, v in doc["checks"].items() if not v["ok"]}
                ok += failing <= {"models"}
            except Exception:
                pass
        if ok == len(rig.replicas):
            return
        await asyncio.sleep(0.25)
    raise RuntimeError("the workers did not come up")


async def _drain(rig: Rig, sent: list[dict[str, Any]], outcome: Outcome, timeout_s: float) -> None:
    """Wait until every acknowledged query has an answer (or the wait runs out: a query
    lost for real costs the whole wait), then a little more for late duplicates."""
    want = {r["id"] for r in sent if r.get("t_ack")}
    gap = outcome.window.broker_gap
    if gap is not None:  # what an empty broker lost, or may never hand out, is not waited for
        ends = old_log_ends(sent, gap[0])
        want -= {
            r["id"]
            for r in sent
            if r.get("t_ack") and (r["t_ack"] < gap[0] or r["offset"] < ends.get(r["partition"], 0))
        }
    deadline = time.time() + timeout_s
    while time.time() < deadline and not want <= {a.get("id") for a in list(rig.answers)}:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.5)


def scenario_doc(
    name: str,
    rig: Rig,
    sent: list[dict[str, Any]],
    answers: list[dict[str, Any]],
    o: Outcome,
    spec: Spec,
) -> dict[str, Any]:
    """One scenario's report: the accounting, its facts and checks, what the probes said."""
    acc = account(sent, answers, o.window, snapshots=o.snapshots, broker_starts=rig.broker_starts)
    seen = o.probe_window or o.window
    checks = {"lost_is_zero": acc.lost == 0, **o.checks}
    if acc.committed_unanswered is not None:
        checks["nothing_committed_unanswered"] = acc.committed_unanswered == 0
    checks["duplicates_carry_the_same_answer"] = acc.duplicates_inconsistent == 0
    facts = dict(o.facts)
    if o.crash_snapshot:
        # Every query answered past its partition's last commit at the crash is scored
        # again: the duplicates to expect, against the duplicates measured.
        facts["answered_past_commit_at_crash"] = answered_past_commit(
            sent, answers, o.snapshots[0], o.window.partitions
        )
    if o.window.broker_gap is not None:
        facts.update(log_reset_facts(sent, answers, o.window.broker_gap))
    if name == "poison_query":
        pc = poison_checks(sent, answers)
        facts.update(pc["facts"])
        checks.update(pc["checks"])
    t0 = min((r["t_send"] for r in sent), default=o.window.start)
    doc: dict[str, Any] = {
        **acc.as_dict(),
        "replicas": spec.replicas,
        "fault": {
            "start_s": round(o.window.start - t0, 2),
            "end_s": round(o.window.end - t0, 2),
            "probed_until_s": round(seen.end - t0, 2),
            "partitions": sorted(o.window.partitions) if o.window.partitions else None,
        },
        **facts,
        "probes": probes(rig.samples, seen),
        "worker_exits": {
            r.name: [{"after_s": round(e["t"] - t0, 2), "code": e["code"]} for e in r.exits]
            for r in rig.replicas
            if r.exits
        },
        "committed_snapshots": [
            {"t_s": round(x["t"] - t0, 2), "epoch": x["epoch"], "offsets": x["offsets"]}
            for x in o.snapshots
        ],
        "checks": checks,
    }
    if o.note:
        doc["note"] = o.note
    return doc

"""The fault benchmark's scenarios on the stream: crashes, the broker, stalled verdicts,
a poison query. Each takes a running :class:`Ctx` (rig, steady load), injects its fault
and returns an :class:`Outcome`: the fault's window, committed-offset snapshots, the
facts only it can observe, and its own checks. The store scenarios are in
:mod:`sidecar.bench._faults_store`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.bench._faults_load import LoadProcess
from sidecar.bench._faults_replica import Replica
from sidecar.bench._faults_report import Window, old_log_ends, parse_metrics
from sidecar.bench._faults_rig import Rig


@dataclass(frozen=True)
class Spec:
    """What a scenario's rig needs: replicas, proxies, a signing key, the poisoned
    encoder, a produce timeout shorter than the outage, and whether the first model is
    published before the workers start."""

    replicas: int = 1
    kafka_proxy: bool = False
    redis_proxy: bool = False
    hmac_key: str | None = None
    short_produce_timeout: bool = False  # kafka.produce_timeout_s below the outage
    poison: bool = False
    publish_first: bool = True


@dataclass
class Ctx:
    """A running scenario: its rig, its load, the stored versions, the options."""

    rig: Rig
    load: LoadProcess
    versions: dict[str, str]
    outage_s: float
    restart_delay_s: float
    echo: Callable[[str], None]
    artifacts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a scenario observed beyond the common accounting."""

    window: Window
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    note: str | None = None
    # What /readyz and /metrics are summed up over as "during" (default: the window), for
    # a fault that is over at once but whose effect lasts (a kill until the takeover).
    probe_window: Window | None = None
    # The first snapshot was taken right after a crash: report what it left uncommitted.
    crash_snapshot: bool = False


POISON_MARKER = "<<faults-bench-poison>>"


async def metrics_of(r: Replica) -> dict[str, Any]:
    """The replica's ``/metrics`` figures now ({} when it does not answer)."""
    try:
        _, text = await asyncio.to_thread(r.get, "/metrics", 0.5)
        return parse_metrics(str(text))
    except Exception:
        return {}


async def kill_mid_batch(ctx: Ctx, victim: Replica, burst: int = 192) -> tuple[float, dict]:
    """SIGKILL ``victim`` while it works through a burst: once it has answered some of
    the burst and still has records waiting (its lag), so a batch is being scored."""
    before = (await metrics_of(victim)).get("records", 0.0)
    ctx.load.burst(burst)
    deadline = time.time() + 15.0
    seen: dict[str, Any] = {}
    while time.time() < deadline:
        seen = await metrics_of(victim)
        if seen.get("records", 0.0) - before >= 8 and seen.get("lag", 0.0) > 0:
            break
        await asyncio.sleep(0.01)
    t = victim.sigkill()
    return t, {
        "burst": burst,
        "victim_answered_of_burst_at_kill": int(seen.get("records", 0.0) - before),
        "victim_lag_at_kill": seen.get("lag"),
        "mid_batch": bool(seen.get("lag", 0.0) > 0),
    }


async def wait_until(pred: Callable[[], Awaitable[bool]], timeout_s: float) -> float | None:
    """Poll ``pred`` every 0.1 s; the time it first held, or None."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if await pred():
            return time.time()
        await asyncio.sleep(0.1)
    return None


async def replica_kill(ctx: Ctx) -> Outcome:
    """SIGKILL one of two replicas mid-batch; the other must take its partitions over."""
    rig = ctx.rig
    owners = await rig.stable_assignment()
    victim, survivor = rig.replicas[0], rig.replicas[1]
    victim.restart = False
    parts = frozenset(p for p, n in owners.items() if n == victim.name)
    t_kill, facts = await kill_mid_batch(ctx, victim)
    snap = await rig.committed()

    async def took_over() -> bool:
        try:
            _, doc = await asyncio.to_thread(survivor.get, "/readyz")
            return len(doc["checks"]["partitions"]["assigned"] or []) == 4
        except Exception:
            return False

    t_over = await wait_until(took_over, 60.0)
    return Outcome(
        Window(t_kill, t_kill, parts),
        [snap],
        probe_window=Window(t_kill, t_over or t_kill),
        crash_snapshot=True,
        facts={
            **facts,
            "victim_partitions": sorted(parts),
            "takeover_s": round(t_over - t_kill, 2) if t_over else None,
            "session_timeout_s": rig.replicas[0].settings.kafka.session_timeout_s,
        },
        checks={"survivor_took_every_partition": t_over is not None},
    )


async def lone_kill(ctx: Ctx) -> Outcome:
    """SIGKILL the only worker mid-batch; the supervisor restarts it after a delay."""
    rig = ctx.rig
    (w,) = rig.replicas
    w.restart, w.restart_delay_s = True, ctx.restart_delay_s
    t_kill, facts = await kill_mid_batch(ctx, w)
    snap = await rig.committed()
    t_spawn = await wait_until(_returns(lambda: len(w.starts) >= 2), 30.0)
    t_ready = await wait_until(_ready(w), 120.0)
    return Outcome(
        Window(t_kill, t_spawn or t_kill),
        [snap],
        probe_window=Window(t_kill, t_ready or t_kill),
        crash_snapshot=True,
        facts={
            **facts,
            "restart_delay_s": ctx.restart_delay_s,
            "restart_to_ready_s": round(t_ready - t_spawn, 2) if t_ready and t_spawn else None,
            "exit_codes": [e["code"] for e in w.exits],
        },
        checks={"restarted_and_ready": t_ready is not None},
    )


def _returns(f: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def pred() -> bool:
        return f()

    return pred


def _ready(r: Replica) -> Callable[[], Awaitable[bool]]:
    async def pred() -> bool:
        if not r.alive():
            return False
        try:
            status, _ = await asyncio.to_thread(r.get, "/readyz")
            return bool(status == 200)
        except Exception:
            return False

    return pred


async def broker_outage(ctx: Ctx) -> Outcome:
    """Stop the embedded broker for ``outage_s`` and start a new, empty one on its port."""
    rig = ctx.rig
    (w,) = rig.replicas
    pid = w.pid
    assert rig.broker.proc is not None and rig.kafka_proxy is not None
    t_stop = time.time()
    rig.kafka_proxy.cut()  # no client reaches the port while it is down
    rig.broker.proc.kill()  # SIGKILL by pid: a crash
    rig.broker.proc.wait(10)
    await asyncio.sleep(ctx.outage_s)
    await asyncio.to_thread(rig.start_broker)
    t_start = rig.broker_starts[-1]
    t_ready = await wait_until(_ready(w), 60.0)
    return Outcome(
        Window(t_stop, t_start, broker_gap=(t_stop, t_start)),
        facts={
            "worker_pid_before": pid,
            "worker_pid_after": w.pid,
            "worker_exits": [e["code"] for e in w.exits],
            "reconnected_without_restart": w.pid == pid and not w.exits,
            "ready_after_restart_s": round(t_ready - t_start, 2) if t_ready else None,
        },
        checks={"ready_again": t_ready is not None},
        note=(
            "The embedded broker keeps nothing across a restart: the queries it had "
            "acknowledged but the worker had not answered, and answers not yet read back, "
            "went with it (lost_with_broker), and so did the group's committed offsets. "
            "A Kafka cluster keeps both; what this run shows for it is the worker's side: "
            "it reconnects without a restart, says not ready while the broker is away, "
            "answers everything sent after the broker came back, and commits nothing that "
            "has no answer (committed_unanswered)."
        ),
    )


async def broker_unreachable(ctx: Ctx) -> Outcome:
    """Cut every client off the broker for ``outage_s`` (the broker keeps its log and the
    group's offsets, as a Kafka cluster does through an outage), then let them back."""
    rig = ctx.rig
    (w,) = rig.replicas
    assert rig.kafka_proxy is not None
    pid = w.pid
    t0 = time.time()
    rig.kafka_proxy.cut()
    await asyncio.sleep(ctx.outage_s)
    rig.kafka_proxy.restore()
    t1 = time.time()
    t_ready = await wait_until(_ready(w), 120.0)
    snap = await rig.committed()
    timeout = w.settings.kafka.produce_timeout_s
    facts = {
        "produce_timeout_s": timeout,
        "worker_pid_before": pid,
        "worker_pid_after": w.pid,
        "worker_exits": [{"after_s": round(e["t"] - t0, 2), "code": e["code"]} for e in w.exits],
        "ready_after_reconnect_s": round(t_ready - t1, 2) if t_ready else None,
    }
    checks = {"ready_again": t_ready is not None}
    if timeout > ctx.outage_s:
        checks["reconnected_without_restart"] = w.pid == pid and not w.exits
    else:  # past the produce timeout: halt, exit promptly, restarted by the supervisor
        t_halt = halted_at(w.log_path)
        facts["halted_after_s"] = round(t_halt - t0, 2) if t_halt else None
        first = w.exits[0]["t"] - t0 if w.exits else None
        checks["halted_and_exited_within_timeout_plus_15_s"] = (
            first is not None and first <= timeout + 15.0
        )
    return Outcome(Window(t0, t1), [snap], facts, checks)


def log_reset_facts(
    sent: list[dict[str, Any]], answers: list[dict[str, Any]], gap: tuple[float, float]
) -> dict[str, Any]:
    """Per partition: where the old log ended, and the first offset of the new log that
    was answered (the records of the new log below the old end may never be read)."""
    answered = {a.get("id") for a in answers}
    first: dict[int, int] = {}
    for r in sent:
        if r.get("t_ack") is not None and r["t_ack"] >= gap[1] and r["id"] in answered:
            first[r["partition"]] = min(first.get(r["partition"], r["offset"]), r["offset"])
    ends = old_log_ends(sent, gap[0])
    return {
        "old_log_end": {str(p): ends[p] for p in sorted(ends)},
        "new_log_first_answered_offset": {str(p): first[p] for p in sorted(first)},
    }


async def verdicts_stalled(ctx: Ctx) -> Outcome:
    """Hold every verdict the worker produces for ``outage_s`` (its fetches still pass):
    past ``kafka.produce_timeout_s`` it must halt, exit non-zero and, restarted, lose
    nothing."""
    rig = ctx.rig
    (w,) = rig.replicas
    w.restart_delay_s = ctx.restart_delay_s
    assert rig.kafka_proxy is not None
    t0 = time.time()
    rig.kafka_proxy.stall_produce(True)
    t_exit = await wait_until(_returns(lambda: bool(w.exits)), ctx.outage_s)
    snap = await rig.committed()
    rest = ctx.outage_s - (time.time() - t0)
    if rest > 0:
        await asyncio.sleep(rest)
    rig.kafka_proxy.stall_produce(False)
    t1 = time.time()
    t_ready = await wait_until(_ready(w), 120.0)
    t_halt = halted_at(w.log_path)
    halted = t_halt is not None
    return Outcome(
        Window(t0, t1),
        [snap],
        {
            "produce_timeout_s": w.settings.kafka.produce_timeout_s,
            "halted_after_s": round(t_halt - t0, 2) if t_halt else None,
            "exited_after_s": round(t_exit - t0, 2) if t_exit else None,
            "exit_codes": [e["code"] for e in w.exits],
            "restarts": max(len(w.starts) - 1, 0),
            "held_produce_requests": rig.kafka_proxy.held_requests,
            "ready_after_stall_s": round(t_ready - t1, 2) if t_ready else None,
        },
        {
            "halted_and_exited_non_zero": halted and any(e["code"] != 0 for e in w.exits),
            "restarted_and_ready": t_ready is not None,
        },
    )


def halted_at(log_path: Path) -> float | None:
    """When the worker logged ``stream halted`` first (epoch s), None if it did not."""
    import datetime as dt

    for line in log_path.read_text(errors="replace").splitlines():
        if "stream halted" in line:
            stamp = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line)
            if stamp is None:
                return None
            return dt.datetime.strptime(stamp.group(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


async def poison_query(ctx: Ctx) -> Outcome:
    """Bursts with one query the encoder raises on, in the middle: that query is
    dead-lettered (``scoring_failed``), its batch neighbours get verdicts."""
    (w,) = ctx.rig.replicas
    t0 = time.time()
    n, bursts = 48, 3
    for _ in range(bursts):
        ctx.load.burst(n, poison_at=(n // 2,))
        await asyncio.sleep(1.0)
    t1 = time.time()
    log = w.log_path.read_text(errors="replace")
    sizes = [int(x) for x in re.findall(r"batch encode of (\d+) texts failed", log)]
    return Outcome(
        Window(t0, t1),
        facts={
            "bursts": bursts,
            "burst_size": n,
            "poison_sent": bursts,
            "sizes_of_batches_that_held_poison": sizes,
        },
        checks={"poison_was_inside_a_larger_batch": bool(sizes) and min(sizes) > 1},
    )


def poison_checks(sent: list[dict[str, Any]], answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Every poisoned query dead-lettered as ``scoring_failed`` by the encoder, every other
    query a verdict and no other dead letter."""
    poison = {r["id"] for r in sent if r.get("poison") and r.get("t_ack") is not None}
    dead = [a for a in answers if a["kind"] == "dead"]
    verdict_ids = {a["id"] for a in answers if a["kind"] == "verdict"}
    ok_dead = {
        a["id"]
        for a in dead
        if a["id"] in poison
        and a.get("reason") == "scoring_failed"
        and "encoder" in str(a.get("detail"))
    }
    others = {r["id"] for r in sent if r.get("t_ack") is not None} - poison
    return {
        "facts": {
            "poison_dead_lettered": len(ok_dead),
            "poison_reasons": sorted({str(a.get("detail")) for a in dead if a["id"] in poison}),
            "other_dead_letters": sum(1 for a in dead if a["id"] not in poison),
        },
        "checks": {
            "every_poison_dead_lettered_with_reason": ok_dead == poison and bool(poison),
            "no_poison_got_a_verdict": not (poison & verdict_ids),
            "every_other_query_got_a_verdict": others <= verdict_ids,
        },
    }

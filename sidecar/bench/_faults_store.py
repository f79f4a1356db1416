"""The fault benchmark's scenarios on the model store: Redis away (with and without a
promotion meanwhile), bad artifacts promoted under load, and no model at all."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sidecar.bench._faults_replica import Replica
from sidecar.bench._faults_report import Window
from sidecar.bench._faults_rig import KB
from sidecar.bench._faults_scenarios import Ctx, Outcome, wait_until


async def holder_status(r: Replica) -> dict[str, Any]:
    """The replica's model holder for the benchmark KB (``/models``), {} when unreachable."""
    try:
        _, doc = await asyncio.to_thread(r.get, "/models")
        return dict(doc["status"][KB])
    except Exception:
        return {}


def _serves(r: Replica, version: str) -> Any:
    async def pred() -> bool:
        return (await holder_status(r)).get("version") == version

    return pred


def _verdict_versions(ctx: Ctx, a: float, b: float) -> dict[str, int]:
    """Model versions of the verdicts handed off between ``a`` and ``b`` (epoch s)."""
    out: dict[str, int] = {}
    for x in list(ctx.rig.answers):
        if x["kind"] == "verdict" and a * 1000 <= (x.get("ts") or 0) <= b * 1000:
            out[str(x.get("model_version"))] = out.get(str(x.get("model_version")), 0) + 1
    return out


def _first_verdict_of(ctx: Ctx, version: str, after: float) -> float | None:
    ts = [
        x["ts"] / 1000.0
        for x in list(ctx.rig.answers)
        if x["kind"] == "verdict" and x.get("model_version") == version and x["ts"] >= after * 1000
    ]
    return min(ts) if ts else None


async def redis_outage(ctx: Ctx) -> Outcome:
    """Stop redis-server for ``outage_s`` and start it again (its data kept on disk)."""
    rig = ctx.rig
    (w,) = rig.replicas
    va = ctx.versions["A"]
    before = await holder_status(w)
    t0 = time.time()
    await asyncio.to_thread(rig.redis.stop)
    await asyncio.sleep(ctx.outage_s)
    during = await holder_status(w)
    await asyncio.to_thread(rig.redis.start)
    t1 = time.time()
    t_back = await wait_until(_reachable(w), 30.0)
    after = await holder_status(w)
    versions = _verdict_versions(ctx, t0, t1)
    return Outcome(
        Window(t0, t1),
        facts={
            "holder_before": before,
            "holder_during": during,
            "holder_after": after,
            "store_reachable_again_s": round(t_back - t1, 2) if t_back else None,
        },
        checks={
            "scored_through_the_outage": versions.get(va, 0) > 0 and set(versions) == {va},
            "no_swap_or_load_during_outage": during.get("swaps") == before.get("swaps")
            and during.get("load_failures") == before.get("load_failures"),
            "store_seen_unreachable": during.get("store_reachable") is False,
            "converged_to_active": after.get("version") == va == after.get("store_active"),
        },
    )


def _reachable(r: Replica) -> Any:
    async def pred() -> bool:
        return (await holder_status(r)).get("store_reachable") is True

    return pred


async def redis_outage_promotion(ctx: Ctx) -> Outcome:
    """Cut the worker off Redis for ``outage_s`` (Redis itself stays up) and promote B
    half-way through: the worker must keep serving A, then converge to B once back."""
    rig = ctx.rig
    (w,) = rig.replicas
    assert rig.redis_proxy is not None
    va, vb = ctx.versions["A"], ctx.versions["B"]
    before = await holder_status(w)
    t0 = time.time()
    rig.redis_proxy.cut()
    await asyncio.sleep(ctx.outage_s / 2)
    ev = await asyncio.to_thread(rig.store.promote, KB, vb)
    t_promote = ev.ts if ev else time.time()
    await asyncio.sleep(max(t0 + ctx.outage_s - time.time(), 0.0))
    during = await holder_status(w)
    rig.redis_proxy.restore()
    t1 = time.time()
    t_installed = await wait_until(_serves(w, vb), 30.0)
    await asyncio.sleep(1.0)  # a verdict by the new model
    first_b = _first_verdict_of(ctx, vb, t_promote)
    after = await holder_status(w)
    versions = _verdict_versions(ctx, t0, t1)
    return Outcome(
        Window(t0, t1),
        facts={
            "promoted_at_s_into_outage": round(t_promote - t0, 2),
            "installed_after_reconnect_s": round(t_installed - t1, 2) if t_installed else None,
            "stale_model_s": round(first_b - t_promote, 2) if first_b else None,
            "first_new_verdict_after_reconnect_s": round(first_b - t1, 2) if first_b else None,
            "holder_before": before,
            "holder_during": during,
            "holder_after": after,
        },
        checks={
            "kept_serving_the_loaded_model": set(versions) == {va},
            "no_swap_or_load_during_outage": during.get("swaps") == before.get("swaps")
            and during.get("load_failures") == before.get("load_failures"),
            "converged_to_the_promotion": after.get("version") == vb == after.get("store_active"),
        },
    )


def _corrupt_chunk(store: Any, version: str) -> None:
    key = store.keys.chunk(KB, version, 0)
    data = bytearray(store.client.get(key) or b"")
    data[len(data) // 2] ^= 0xFF
    store.client.set(key, bytes(data))


def _bad_versions(ctx: Ctx) -> list[tuple[str, str]]:
    """Store the four bad artifacts; (name, version) in the order they get promoted."""
    from model_store import Artifact, RedisStore

    store, arts = ctx.rig.store, ctx.artifacts
    corrupt = store.put(arts["B"])
    _corrupt_chunk(store, corrupt)
    with RedisStore(ctx.rig.redis.url, prefix="oodsc") as keyless:
        unsigned = keyless.put(arts["C"])
    d = arts["D"]
    schema = store.put(Artifact({**d.manifest, "schema_version": 99}, d.arrays))
    other = store.put(arts["other_encoder"])
    return [
        ("corrupt_chunk", corrupt),
        ("unsigned_under_key", unsigned),
        ("unknown_schema", schema),
        ("other_encoder", other),
    ]


async def bad_artifact(ctx: Ctx) -> Outcome:
    """Promote four bad versions in turn under load, then a good one: each bad one is
    refused and A keeps serving; the good one is installed."""
    rig = ctx.rig
    (w,) = rig.replicas
    va = ctx.versions["A"]
    bad = await asyncio.to_thread(_bad_versions, ctx)
    base = await holder_status(w)
    results: dict[str, Any] = {}
    t0 = time.time()
    for i, (name, version) in enumerate(bad, start=1):
        t = time.time()
        await asyncio.to_thread(rig.store.promote, KB, version)
        want = base.get("load_failures", 0) + i

        async def refused(want: int = want) -> bool:
            return (await holder_status(w)).get("load_failures", 0) >= want

        t_ref = await wait_until(refused, 15.0)
        st = await holder_status(w)
        results[name] = {
            "version": version,
            "refused": t_ref is not None and st.get("version") == va,
            "refused_after_s": round(t_ref - t, 2) if t_ref else None,
            "reason": st.get("last_error"),
            "served_after": st.get("version"),
        }
        await asyncio.sleep(1.0)
    t1 = time.time()
    good = ctx.versions["E"]
    await asyncio.to_thread(rig.store.promote, KB, good)
    t_good = await wait_until(_serves(w, good), 15.0)
    end = await holder_status(w)
    versions = _verdict_versions(ctx, t0, t1)
    return Outcome(
        Window(t0, t1),
        facts={
            "promotions": results,
            "load_failures_before": base.get("load_failures"),
            "load_failures_after": end.get("load_failures"),
            "good_promotion_installed_after_s": round(t_good - t1, 2) if t_good else None,
        },
        checks={
            "every_bad_version_refused": all(r["refused"] for r in results.values()),
            "old_model_kept_serving": set(versions) == {va},
            "load_failures_rose_by_four": end.get("load_failures", 0) - base.get("load_failures", 0)
            == len(bad),
            "a_good_promotion_still_lands": t_good is not None,
        },
    )


async def no_model(ctx: Ctx) -> Outcome:
    """Queries before any model is promoted (fail-closed), then A promoted under load."""
    rig = ctx.rig
    (w,) = rig.replicas
    va = ctx.versions["A"]
    t0 = time.time()
    await asyncio.sleep(ctx.outage_s / 2)
    ev = await asyncio.to_thread(rig.store.promote, KB, va)
    t1 = ev.ts if ev else time.time()
    t_installed = await wait_until(_serves(w, va), 30.0)
    await asyncio.sleep(1.0)
    fail = [
        x for x in list(rig.answers) if x["kind"] == "verdict" and x.get("reason") == "no_model"
    ]
    first_a = _first_verdict_of(ctx, va, t1)
    return Outcome(
        Window(t0, t1),
        facts={
            "fail_mode": w.settings.scoring.fail_mode,
            "no_model_verdicts": len(fail),
            "no_model_verdict_values": sorted({str(x.get("verdict")) for x in fail}),
            "installed_after_promotion_s": round(t_installed - t1, 2) if t_installed else None,
            "stale_model_s": round(first_a - t1, 2) if first_a else None,
        },
        checks={
            "every_query_without_a_model_is_ood": bool(fail)
            and all(x.get("verdict") == "OOD" and x.get("model_version") is None for x in fail),
            "no_no_model_verdict_after_install": all(
                x["ts"] <= (t_installed or t1) * 1000 + 1 for x in fail
            ),
            "model_installed": t_installed is not None,
        },
    )

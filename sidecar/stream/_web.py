"""The worker's HTTP views: ``/healthz``, ``/readyz``, ``/metrics``, ``/models``, and
``/encoder/probes`` (GET: the active model's probe sentences; POST: check a client's
embeddings of them, see :mod:`sidecar.stream._encoder_proof`).

Served by faust's web server on ``web.port``; faust's own data pages (router, tables,
graph, stats) are switched off in the app factory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from sidecar.stream._metrics import CONTENT_TYPE
from sidecar.stream._transport import broker_contact

if TYPE_CHECKING:
    import faust

    from sidecar.stream._runtime import Runtime

log = logging.getLogger(__name__)

_STORE_PING_TIMEOUT_S = 2.0


async def store_reachable(store: Any, kb: str) -> tuple[bool, str | None]:
    """Ask the store something cheap; (ok, error)."""
    try:
        ping = getattr(store, "ping", None)
        if callable(ping):
            await asyncio.wait_for(ping(), _STORE_PING_TIMEOUT_S)
        else:
            await asyncio.wait_for(store.active(kb), _STORE_PING_TIMEOUT_S)
        return True, None
    except Exception as exc:  # any failure means "not reachable"; say which
        return False, f"{type(exc).__name__}: {exc}"


def _assignment(app: faust.App) -> list[tuple[str, int]] | None:
    try:
        return sorted((tp.topic, tp.partition) for tp in app.consumer.assignment())
    except Exception:  # ConsumerNotStarted while the worker boots
        return None


def models_doc(rt: Runtime) -> dict[str, Any]:
    """Active model per served KB (None when not loaded)."""
    snap = rt.holder.snapshot()
    doc: dict[str, Any] = {}
    for kb in rt.settings.scoring.kbs:
        lm = snap.get(kb)
        doc[kb] = (
            None
            if lm is None
            else {
                "version": lm.version,
                "detector": lm.model.detector_name,
                "threshold": float(lm.model.threshold),
                "loaded_at": lm.loaded_at,
            }
        )
    return doc


async def readiness(app: faust.App, rt: Runtime) -> dict[str, Any]:
    """The ``/readyz`` document; ``ready`` is the AND of the checks."""
    kbs = rt.settings.scoring.kbs
    assigned = _assignment(app)
    mine = [p for t, p in assigned or [] if t == rt.settings.kafka.queries_topic]
    models = {kb: (v["version"] if v else None) for kb, v in models_doc(rt).items()}
    store_ok, store_err = await store_reachable(rt.store, kbs[0])
    checks: dict[str, dict[str, Any]] = {
        "broker": broker_contact(app, within_s=rt.settings.kafka.session_timeout_s),
        "partitions": {"ok": bool(mine), "assigned": mine},
        "rebalancing": {"ok": not app.rebalancing},
        "models": {"ok": all(models.values()), "active": models},
        "store": {"ok": store_ok, "error": store_err},
        "stream": {"ok": rt.halted is None, "halted": rt.halted},
        "encoder": rt.encoder_check(),
    }
    return {"ready": all(c["ok"] for c in checks.values()), "checks": checks}


def lag(app: faust.App, rt: Runtime) -> dict[tuple[str, int], int]:
    """Consumer lag per assigned partition this worker has processed at least once."""
    out: dict[tuple[str, int], int] = {}
    try:
        assigned = app.consumer.assignment()
    except Exception:
        return out
    for tp in assigned:
        pos = rt.next_offset.get((tp.topic, tp.partition))
        if pos is None:
            continue
        try:
            hw = app.consumer.highwater(tp)
        except Exception:
            continue
        if hw is not None:
            out[(tp.topic, tp.partition)] = max(int(hw) - pos, 0)
    return out


def register_views(app: faust.App, rt: Runtime) -> None:
    """Add the five views to ``app``'s web server."""
    started = time.time()

    @app.page("/healthz", name="sidecar-healthz")
    async def healthz(self: Any, request: Any) -> Any:
        # Answering at all proves the event loop is alive.
        return self.json(
            {"status": "ok", "uptime_s": round(time.time() - started, 1), "batches": rt.batches}
        )

    @app.page("/readyz", name="sidecar-readyz")
    async def readyz(self: Any, request: Any) -> Any:
        doc = await readiness(app, rt)
        return self.json(doc, status=200 if doc["ready"] else 503)

    @app.page("/models", name="sidecar-models")
    async def models(self: Any, request: Any) -> Any:
        return self.json({"models": models_doc(rt), "status": _jsonable(rt.holder.status())})

    @app.page("/metrics", name="sidecar-metrics")
    async def metrics(self: Any, request: Any) -> Any:
        snap = rt.holder.snapshot()
        rt.metrics.refresh(
            {kb: (lm.version, lm.model.detector_name) for kb, lm in snap.items()},
            rt.holder.status(),
            lag(app, rt),
            {kb: lm.model.metrics.get("calibration_ood_share") for kb, lm in snap.items()},
        )
        rt.metrics.refresh_readiness(await readiness(app, rt))
        return self.bytes(rt.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    _register_encoder_probes(app, rt)


def _register_encoder_probes(app: faust.App, rt: Runtime) -> None:
    """``/encoder/probes[?kb=KB]``: GET gives the probe sheet of the KB's model in service,
    POST checks a client's embeddings of its sentences (200 with ``ok`` either way; 400
    for a body that is not such embeddings)."""
    import faust

    from sidecar.errors import DataError
    from sidecar.stream._encoder_proof import check_probe_embeddings, probe_sheet

    def model_of(request: Any) -> tuple[Any, tuple[int, str] | None]:
        kb = request.query.get("kb") or rt.settings.scoring.default_kb
        if kb not in rt.settings.scoring.kbs:
            return None, (404, f"KB {kb!r} is not served here")
        loaded = rt.holder.snapshot().get(kb)
        if loaded is None:
            return None, (503, f"no model is in service for KB {kb!r} yet")
        return loaded, None

    class EncoderProbes(faust.web.View):
        async def get(self, request: Any) -> Any:
            loaded, error = model_of(request)
            if error is not None:
                return self.error(*error)
            try:
                return self.json(probe_sheet(loaded.model, loaded.version))
            except DataError as exc:  # a model without probes
                return self.error(409, str(exc))

        async def post(self, request: Any) -> Any:
            loaded, error = model_of(request)
            if error is not None:
                return self.error(*error)
            try:
                probe_sheet(loaded.model)
            except DataError as exc:  # a model without probes: nothing to check against
                return self.error(409, str(exc))
            try:
                doc = json.loads(await request.read())
            except (ValueError, RecursionError) as exc:
                return self.error(400, f"the body is not JSON: {str(exc)[:200]}")
            try:
                check = check_probe_embeddings(loaded.model, doc, loaded.version)
            except DataError as exc:
                return self.error(400, str(exc))
            return self.json(check.to_dict())

    app.page("/encoder/probes", name="sidecar-encoder-probes")(EncoderProbes)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, str | int | float | bool):
        return x
    return str(x)

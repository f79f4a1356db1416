"""``sidecar bench faults``: the real worker under faults, and what was lost or repeated.

Each scenario gets a fresh rig (:mod:`sidecar.bench._faults_rig`: the embedded broker, a
private redis-server, one or two real ``sidecar worker`` replicas in one group), a steady
query stream from a separate producer process (:mod:`sidecar.bench._faults_load`), its
fault (:mod:`sidecar.bench._faults_scenarios`, :mod:`sidecar.bench._faults_store`), and
then every acknowledged query is matched with its verdicts and dead letters
(:mod:`sidecar.bench._faults_report`). The report is
``{"scenarios": {NAME: {"sent", "verdicts", "dead_lettered", "lost", "duplicates",
"recovery_s", ...}}}`` with what ``/readyz`` and ``/metrics`` said during each fault.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.bench._faults_rig import KB
from sidecar.bench._faults_run import Options, run_all
from sidecar.bench._faults_scenarios import (
    Ctx,
    Spec,
    broker_outage,
    broker_unreachable,
    lone_kill,
    poison_query,
    replica_kill,
    verdicts_stalled,
)
from sidecar.bench._faults_store import (
    bad_artifact,
    no_model,
    redis_outage,
    redis_outage_promotion,
)
from sidecar.bench._report_file import write_report

_HMAC_KEY = "faults-bench-signing-key"

# name -> (what it does, its rig, its fault)
SCENARIOS: dict[str, tuple[str, Spec, Callable[[Ctx], Any]]] = {
    "replica_kill": (
        "SIGKILL of one of two replicas mid-batch; the other takes its partitions over",
        Spec(replicas=2),
        replica_kill,
    ),
    "lone_kill": (
        "SIGKILL of a lone worker mid-batch, restarted by the supervisor",
        Spec(),
        lone_kill,
    ),
    "broker_outage": (
        "the embedded broker stopped for --outage-s and started again (empty)",
        Spec(kafka_proxy=True),
        broker_outage,
    ),
    "broker_unreachable": (
        "every client cut off the broker for --outage-s (the broker keeps its data)",
        Spec(kafka_proxy=True),
        broker_unreachable,
    ),
    "broker_unreachable_past_timeout": (
        "the same, with kafka.produce_timeout_s below the outage: halt, exit, restart",
        Spec(kafka_proxy=True, short_produce_timeout=True),
        broker_unreachable,
    ),
    "redis_outage": (
        "redis-server stopped for --outage-s and started again (data kept)",
        Spec(),
        redis_outage,
    ),
    "redis_outage_promotion": (
        "the worker cut off Redis for --outage-s while B is promoted",
        Spec(redis_proxy=True),
        redis_outage_promotion,
    ),
    "bad_artifact": (
        "corrupt chunk, unsigned, unknown schema, other encoder promoted under a key",
        Spec(hmac_key=_HMAC_KEY),
        bad_artifact,
    ),
    "poison_query": (
        "the encoder raises on one query inside a batch",
        Spec(poison=True),
        poison_query,
    ),
    "verdicts_stalled": (
        "the worker's verdicts held for --outage-s (produce timeouts); halt and restart",
        Spec(kafka_proxy=True, short_produce_timeout=True),
        verdicts_stalled,
    ),
    "no_model": (
        "queries before any model is promoted (fail-closed), then a promotion",
        Spec(publish_first=False),
        no_model,
    ),
}


# name -> what it does, in one line
FAULT_SCENARIOS: dict[str, str] = {name: what for name, (what, _, _) in SCENARIOS.items()}


@dataclass(frozen=True)
class FaultsBenchConfig:
    """The scenarios of ``sidecar bench faults`` and their load, and where the report goes.

    ``scenarios``: names from :data:`SCENARIOS`, in order (empty: all). ``rate``: queries
    per second from the producer process. ``outage_s``: how long a broker, Redis or
    verdict outage lasts. ``warmup_s`` / ``after_s``: steady load before the fault and
    after it. ``produce_timeout_s``: the workers' ``kafka.produce_timeout_s`` in the
    scenarios meant to outlast it (``verdicts_stalled``,
    ``broker_unreachable_past_timeout``; elsewhere the product default, 30 s, applies).
    ``restart_delay_s``: how long the supervisor waits before restarting a worker that
    exited. ``drain_s``: the longest wait for the last answers. ``log_dir``: the workers'
    and producer's logs (None: a temporary folder).
    """

    json_out: Path
    scenarios: tuple[str, ...] = ()
    rate: float = 25.0
    outage_s: float = 10.0
    warmup_s: float = 2.0
    after_s: float = 3.0
    produce_timeout_s: float = 5.0
    restart_delay_s: float = 1.0
    sample_interval_s: float = 0.25
    drain_s: float = 60.0
    log_dir: Path | None = None


def _artifacts(bad: bool = True) -> dict[str, Any]:
    """Small real models for the default encoder: A, B and E, and with ``bad`` also C, D
    and one for another encoder (the raw material of ``bad_artifact``)."""
    import numpy as np

    from sidecar.encoders import DEFAULT_ENCODER
    from sidecar.persistence import model_to_artifact
    from sidecar.scoring import fit_ood_model

    def unit(rng: Any, n: int, dim: int, shift: float) -> Any:
        x = rng.standard_normal((n, dim)) + shift
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    out: dict[str, Any] = {}
    for seed, (name, enc, dim) in enumerate(
        [(n, DEFAULT_ENCODER, 384) for n in "ABCDE"] + [("other_encoder", "other-encoder", 16)]
    ):
        if not bad and name not in "ABE":
            continue
        rng = np.random.default_rng(seed)
        model = fit_ood_model(
            kb=KB,
            encoder={"name": enc, "dim": dim},
            kb_embeddings=unit(rng, 200, dim, 0.3),
            id_embeddings=unit(rng, 120, dim, 0.3),
            detector="mahalanobis",
            criterion="evr",
            m=8,
            seed=seed,
        )
        out[name] = model_to_artifact(model)
    return out


def run_faults_bench(
    config: FaultsBenchConfig, *, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run each scenario in turn on a fresh rig; writes the report and returns it."""
    c = config
    names = c.scenarios or tuple(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    logs = c.log_dir or Path(tempfile.mkdtemp(prefix="bench-faults-"))
    echo(f"fitting the models; logs in {logs}")
    t0 = time.time()
    arts = _artifacts(bad="bad_artifact" in names)
    plan = [(n, *SCENARIOS[n]) for n in names]
    options = Options(
        rate=c.rate,
        outage_s=c.outage_s,
        warmup_s=c.warmup_s,
        after_s=c.after_s,
        produce_timeout_s=c.produce_timeout_s,
        restart_delay_s=c.restart_delay_s,
        sample_interval_s=c.sample_interval_s,
        drain_s=c.drain_s,
    )
    # The benchmark's own Kafka clients log every refused connection during an outage.
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        scenarios = asyncio.run(run_all(plan, options, arts, logs, echo))
    finally:
        client_log.setLevel(level)
    report = {
        "bench": "faults",
        "config": _config_doc(c, names),
        "scenarios": scenarios,
        "summary": _summary(scenarios, time.time() - t0),
    }
    write_report(c.json_out, report)
    return report


def _config_doc(c: FaultsBenchConfig, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        "scenarios": list(names),
        "rate_qps": c.rate,
        "outage_s": c.outage_s,
        "warmup_s": c.warmup_s,
        "after_s": c.after_s,
        "produce_timeout_s": 30.0,
        "produce_timeout_s_short": c.produce_timeout_s,
        "restart_delay_s": c.restart_delay_s,
        "sample_interval_s": c.sample_interval_s,
        "partitions": 4,
        "session_timeout_s": 6.0,
        "faust_commit_interval_s": 2.8,
        "encoder_threads": 1,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def _summary(scenarios: dict[str, Any], wall: float) -> dict[str, Any]:
    def total(key: str) -> int:
        return sum(int(s.get(key) or 0) for s in scenarios.values())

    table = {
        n: {
            k: s.get(k)
            for k in ("sent", "lost", "duplicates", "duplicate_share", "recovery_s", "wall_s")
        }
        | {"passed": all(s["checks"].values())}
        for n, s in scenarios.items()
    }
    return {
        "scenarios": table,
        "lost_total": total("lost"),
        "lost_with_broker_total": total("lost_with_broker"),
        "lost_to_log_reset_total": total("lost_to_log_reset"),
        "duplicates_total": total("duplicates"),
        "committed_unanswered_total": total("committed_unanswered"),
        "errors": {n: s["error"] for n, s in scenarios.items() if "error" in s},
        "failed_checks": {
            n: [k for k, ok in s["checks"].items() if not ok]
            for n, s in scenarios.items()
            if not all(s["checks"].values())
        },
        "wall_s": round(wall, 1),
    }

"""``sidecar bench faults`` end to end, one short scenario: the real worker, the embedded
broker behind the benchmark's proxy, a real redis-server, a separate producer process.

The broker is cut off for a few seconds while queries flow: nothing may be lost, the
worker must reconnect without a restart, and ``/readyz`` must say not ready (its
``broker`` check) while the broker is away. The full set of scenarios is the bench's
(`benchmarks/results/faults.json`); this keeps the report's shape and the accounting
honest in CI.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sidecar.bench import FaultsBenchConfig, run_faults_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNTS = ("sent", "verdicts", "dead_lettered", "lost", "duplicates")


def test_a_short_broker_outage_loses_nothing_and_readiness_follows_the_broker(
    tmp_path: Path,
) -> None:
    out = tmp_path / "faults.json"
    lines: list[str] = []
    level = logging.getLogger("aiokafka").level
    report = run_faults_bench(
        FaultsBenchConfig(
            json_out=out,
            scenarios=("broker_unreachable",),
            rate=20.0,
            outage_s=3.0,
            warmup_s=1.0,
            after_s=1.0,
            log_dir=tmp_path / "logs",
        ),
        echo=lines.append,
    )
    assert logging.getLogger("aiokafka").level == level  # quiet during the run only
    doc = json.loads(out.read_text())
    assert doc == json.loads(json.dumps(report))
    assert doc["bench"] == "faults" and doc["config"]["outage_s"] == 3.0
    s = doc["scenarios"]["broker_unreachable"]
    assert all(isinstance(s[k], int) for k in COUNTS) and "recovery_s" in s
    assert s["sent"] > 20 and s["lost"] == 0, s.get("lost_ids")
    assert s["verdicts"] + s["dead_lettered"] == s["sent"] + s["duplicates"]
    assert s["recovery_s"] is not None and s["recovery_s"] < 30
    assert all(s["checks"].values()), s["checks"]
    assert s["checks"]["reconnected_without_restart"]
    probe = s["probes"]["replica-0"]
    assert probe["before"]["ready_share"] == 1.0
    assert probe["during"]["failing"].get("broker", 0) > 0  # not ready while cut off
    assert probe["ready_after_fault_end_s"] is not None
    assert doc["summary"]["lost_total"] == 0 and not doc["summary"]["failed_checks"]
    assert any("broker_unreachable" in line for line in lines)
    assert (tmp_path / "logs" / "broker_unreachable" / "sent.jsonl").is_file()

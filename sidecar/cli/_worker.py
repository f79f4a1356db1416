"""``sidecar worker``: the production stream processor (settings from the environment)."""

from __future__ import annotations

import asyncio
import logging

import click

from sidecar.cli._root import main

log = logging.getLogger(__name__)


@main.command("worker")
@click.option("--brokers", default=None, help="Override kafka.brokers (kafka://host:port).")
@click.option("--web-port", type=int, default=None, help="Override web.port (HTTP views).")
@click.option("--kb", "kbs", multiple=True, help="Serve this KB (repeat); overrides scoring.kbs.")
@click.option(
    "--no-create-topics",
    is_flag=True,
    help="Do not create missing topics (with kafka.partitions partitions) at start.",
)
def worker(
    brokers: str | None, web_port: int | None, kbs: tuple[str, ...], no_create_topics: bool
) -> None:
    """Consume queries, score them in micro-batches and emit ID/OOD verdicts.

    Settings come from SIDECAR_<SECTION>__<FIELD> environment variables and secret files
    (see sidecar/settings/); the options below override them. The worker serves
    /healthz, /readyz, /metrics and /models on web.port, follows model promotions in the
    store, and on SIGTERM finishes its current batch, commits and exits.
    Processing is at-least-once: a verdict is idempotent by id + model_version.
    """
    import faust

    from sidecar.settings import load_settings
    from sidecar.stream import create_app, ensure_topics, reach_brokers

    overrides: dict[str, dict[str, object]] = {}
    if brokers is not None:  # an empty --brokers is refused, not the default
        overrides["kafka"] = {"brokers": brokers}
    if web_port is not None:
        overrides["web"] = {"port": web_port}
    if kbs:
        overrides["scoring"] = {"kbs": tuple(kbs), "default_kb": kbs[0]}
    settings = load_settings(**overrides)
    if no_create_topics:
        asyncio.run(reach_brokers(settings))
    else:
        asyncio.run(ensure_topics(settings))
    app = create_app(settings)
    w = faust.Worker(
        app,
        loglevel=logging.getLevelName(logging.getLogger().level),
        override_logging=False,
        redirect_stdouts=False,
        quiet=True,
    )
    w.execute_from_commandline()

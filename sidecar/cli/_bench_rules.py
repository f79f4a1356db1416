"""``sidecar bench rules``: exactness, evaluations and pruning of the rule miners (see
:func:`sidecar.bench.run_rules_bench`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sidecar.cli._root import bench

_PATH = click.Path(path_type=Path)
_HOTPOT = Path("../shared/data/hotpotqa/hotpotqa_train_hipporag100.jsonl")


@bench.command("rules")
@click.option("--json", "json_out", required=True, type=_PATH, help="Write the report here.")
@click.option("--n-min", type=click.IntRange(1, 16), default=4, show_default=True)
@click.option("--n-max", type=click.IntRange(1, 16), default=12, show_default=True)
@click.option(
    "--tables",
    type=click.IntRange(1, 1000),
    default=10,
    show_default=True,
    help="Seeded synthetic black boxes per n and kind.",
)
@click.option(
    "--brute-max-n",
    type=click.IntRange(0, 14),
    default=10,
    show_default=True,
    help="Check exactness against brute force up to this n.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--hotpot",
    "hotpot_path",
    type=_PATH,
    default=_HOTPOT,
    show_default=True,
    help="HotpotQA JSONL (question, answer, supporting_facts, context).",
)
@click.option(
    "--hotpot-questions",
    type=click.IntRange(0, 100),
    default=20,
    show_default=True,
    help="Questions for the simulated HotpotQA black box.",
)
@click.option(
    "--hotpot-sources",
    type=click.IntRange(2, 10),
    default=10,
    show_default=True,
    help="Paragraphs per question (supporting ones first, then distractors).",
)
@click.option(
    "--llm-questions",
    type=click.IntRange(0, 100),
    default=0,
    show_default=True,
    help="Questions for the real LLM (--local-model or --base-url); slow.",
)
@click.option(
    "--llm-sources",
    type=click.IntRange(2, 10),
    default=5,
    show_default=True,
    help="Paragraphs per question for the real LLM.",
)
@click.option(
    "--llm-skip",
    type=click.IntRange(0, 100),
    default=0,
    show_default=True,
    help="Skip this many questions before the real-LLM ones.",
)
@click.option(
    "--llm-screen",
    type=click.IntRange(0, 100),
    default=0,
    show_default=True,
    help="Real LLM: ask this many questions with all sources first and mine only "
    "those whose answer contains the gold answer (0: no screening).",
)
@click.option("--local-model", is_flag=True, help="Real LLM: the packaged SmolLM2-135M.")
@click.option("--base-url", default=None, help="Real LLM: an OpenAI-compatible endpoint.")
@click.option("--model", default=None, help="Model name for --base-url.")
@click.option("--max-tokens", type=click.IntRange(1, 512), default=32, show_default=True)
@click.option("--no-progress", is_flag=True, help="Hide progress bars.")
def bench_rules_command(**o: Any) -> None:
    """Exactness, evaluations and pruned share of Mono and Dual rule mining.

    Synthetic: for n in N-MIN..N-MAX, seeded black boxes of four kinds (monotone
    "answer contains the gold answer iff a support set is kept", its negation "answer is
    wrong", the monotone one with 3% noise, and random tables). HotpotQA: each question's
    paragraphs as sources and "answer contains the gold answer" as predicate, on a
    simulated black box (always) and on a real LLM (with --local-model or --base-url).
    Brute force checks exactness where n <= BRUTE-MAX-N. Writes one record per n and
    setting plus medians, beside the paper's pruning (up to 70% omission, 50% retention).
    """
    from sidecar.bench import RulesBenchConfig, run_rules_bench
    from sidecar.cli._options import check_output_file

    check_output_file(o["json_out"], "--json")
    report = run_rules_bench(RulesBenchConfig(**o))
    click.echo(json.dumps({"synthetic": report["synthetic_summary"],
                           "hotpotqa": report["hotpotqa_summary"]}, indent=2))  # fmt: skip
    click.echo(f"wrote {o['json_out']}")

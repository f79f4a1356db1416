"""``sidecar bench rules``: exactness, evaluations and pruning of the rule miners."""

from __future__ import annotations

import asyncio
import json
import platform
import random
import time
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
    from sidecar.cli._options import check_output_file
    from sidecar.errors import ConfigError, DataError

    # Every input is checked before the synthetic part (minutes) and before any model or
    # endpoint is touched.
    check_output_file(o["json_out"], "--json")
    if o["n_min"] > o["n_max"]:
        raise ConfigError("--n-min must not exceed --n-max")
    if o["base_url"] is not None and not o["base_url"].startswith(("http://", "https://")):
        raise ConfigError(f"--base-url must be http(s)://..., got {o['base_url']!r}")
    if o["llm_questions"] and not (o["base_url"] or o["local_model"]):
        raise ConfigError("--llm-questions needs --local-model or --base-url")
    hotpot_path: Path = o["hotpot_path"]
    if (o["hotpot_questions"] or o["llm_questions"]) and not hotpot_path.is_file():
        if hotpot_path.is_dir():
            raise DataError(f"--hotpot {hotpot_path} is a directory, not a HotpotQA JSONL file")
        # With a hint: the default path is relative to the current directory, so it is
        # missing when run from anywhere else.
        where = "" if hotpot_path.is_absolute() else " (relative to the current directory)"
        raise DataError(
            f"HotpotQA file not found: {hotpot_path}{where}; pass --hotpot PATH, "
            "or --hotpot-questions 0 (and no --llm-questions) to skip HotpotQA"
        )

    from tqdm.auto import tqdm

    from sidecar.bench import (
        PAPER_PRUNED_SHARE,
        MemoBlackBox,
        SimulatedHotpotLLM,
        compare_miners,
        hotpot_record,
        load_hotpot,
        summarise,
        synthetic_table,
    )
    from sidecar.bench._hotpot import count_records as _count_records
    from sidecar.bench._rules import _aggregate
    from sidecar.explain import (
        BlackBox,
        ChatCompletionsClient,
        Contains,
        LocalSmolLM2,
        build_messages,
    )
    from sidecar.settings import load_settings

    # The questions are read now too, so that a bad file or an --llm-skip past its end
    # is reported before the synthetic part rather than after it.
    sim_items = (
        load_hotpot(hotpot_path, limit=o["hotpot_questions"], n_sources=o["hotpot_sources"])
        if o["hotpot_questions"]
        else []
    )
    llm_items = []
    explain_settings = None
    if o["llm_questions"]:
        if o["llm_skip"]:
            records = _count_records(hotpot_path)
            if o["llm_skip"] >= records:
                raise ConfigError(
                    f"--llm-skip {o['llm_skip']} skips past the end of {hotpot_path} "
                    f"({records} records)"
                )
        screen = max(o["llm_screen"], o["llm_questions"])
        llm_items = load_hotpot(
            hotpot_path, limit=screen, n_sources=o["llm_sources"], skip=o["llm_skip"]
        )
        if o["base_url"]:
            overrides = {"base_url": o["base_url"], "max_tokens": o["max_tokens"]}
            if o["model"]:
                overrides["model"] = o["model"]
            explain_settings = load_settings(explain=overrides).explain
    started = time.time()
    report: dict[str, Any] = {
        "benchmark": "rules",
        "paper_pruned_share_up_to": PAPER_PRUNED_SHARE,
        "machine": {"python": platform.python_version(), "cpu": platform.machine()},
        "seed": o["seed"],
        "notes": [],
    }

    # --- synthetic --------------------------------------------------------------------
    kinds = ("monotone", "antitone", "monotone_noisy", "random")
    synthetic: list[dict[str, Any]] = []
    ns = range(o["n_min"], o["n_max"] + 1)
    bar = tqdm(total=len(ns) * len(kinds), desc="synthetic", disable=o["no_progress"])
    for n in ns:
        for kind in kinds:
            recs = []
            for k in range(o["tables"]):
                rng = random.Random(f"{o['seed']}:{kind}:{n}:{k}")
                table = synthetic_table(kind, n, rng)

                async def sample(mask: int, i: int, table: dict[int, bool] = table) -> bool:
                    return table[mask]

                recs.append(asyncio.run(compare_miners(n, sample, brute=n <= o["brute_max_n"])))
            synthetic.append(_aggregate(n, kind, recs))
            bar.update(1)
    bar.close()
    report["synthetic"] = synthetic
    report["synthetic_summary"] = {
        kind: summarise(r for r in synthetic if r["setting"] == kind) for kind in kinds
    }

    # --- HotpotQA, simulated black box ------------------------------------------------
    hotpot: list[dict[str, Any]] = []
    if o["hotpot_questions"]:
        for item in tqdm(sim_items, desc="hotpotqa (simulated)", disable=o["no_progress"]):
            rec = asyncio.run(
                hotpot_record(
                    item,
                    SimulatedHotpotLLM(item, o["seed"]),
                    brute=len(item.sources) <= o["brute_max_n"],
                )
            )
            hotpot.append({"setting": "hotpotqa_simulated", **rec})
        report["notes"].append(
            "hotpotqa_simulated uses a SIMULATED black box on HotpotQA structure (gold answer "
            "iff all supporting paragraphs are kept, or any one of them for a seeded 30% of "
            "questions), not a language model"
        )

    # --- HotpotQA, real LLM ----------------------------------------------------------
    if o["llm_questions"]:
        # What is done so far is kept should the slow phase fail (a lost endpoint).
        _write(o["json_out"], {**report, "hotpotqa": hotpot})
        black_box: BlackBox
        if explain_settings is not None:
            black_box = ChatCompletionsClient(explain_settings)
        else:  # --local-model (checked above)
            black_box = LocalSmolLM2(max_tokens=o["max_tokens"])
        items = llm_items
        memo = MemoBlackBox(black_box)  # the screening answers are reused by the miners
        setting = f"hotpotqa_llm:{black_box.name}"

        async def llm_phase() -> None:
            # one event loop for the whole phase: an HTTP client's pool belongs to one loop
            picked = items
            if o["llm_screen"]:
                picked, screened = [], []
                for item in tqdm(items, desc="screening", disable=o["no_progress"]):
                    full = build_messages(item.question, item.sources, (1 << len(item.sources)) - 1)
                    answer = await memo.complete(full, seed=0)
                    ok = await Contains(item.answer)(answer)
                    screened.append({"qid": item.qid, "gold": item.answer, "answer": answer,
                                     "contains_gold": ok})  # fmt: skip
                    if ok and len(picked) < o["llm_questions"]:
                        picked.append(item)
                report["hotpotqa_llm_screening"] = screened
            for item in tqdm(picked, desc=setting, disable=o["no_progress"]):
                brute = len(item.sources) <= o["brute_max_n"]
                rec = await hotpot_record(item, memo, brute=brute)
                hotpot.append({"setting": setting, **rec})
                _write(o["json_out"], {**report, "hotpotqa": hotpot})  # partial results
            await black_box.aclose()

        asyncio.run(llm_phase())
        report["hotpotqa_llm_generations"] = memo.asked
        if o["llm_screen"]:
            report["notes"].append(
                f"{setting}: only questions whose all-sources answer contains the gold answer "
                f"(screened {len(items)} from question {o['llm_skip']}) were mined; "
                f"{o['llm_sources']} paragraphs per question (supporting ones + distractors)"
            )
    report["hotpotqa"] = hotpot
    report["hotpotqa_summary"] = {
        s: summarise(r for r in hotpot if r["setting"] == s)
        for s in sorted({r["setting"] for r in hotpot})
    }
    report["wall_s"] = round(time.time() - started, 1)
    _write(o["json_out"], report)
    click.echo(json.dumps({"synthetic": report["synthetic_summary"],
                           "hotpotqa": report["hotpotqa_summary"]}, indent=2))  # fmt: skip
    click.echo(f"wrote {o['json_out']}")


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")

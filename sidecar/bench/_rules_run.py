"""``sidecar bench rules``, the run: input checks, the synthetic part, HotpotQA on the
simulated black box and on a real LLM (screened where asked), and the report."""

from __future__ import annotations

import asyncio
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.bench._hotpot import (
    HotpotItem,
    MemoBlackBox,
    SimulatedHotpotLLM,
    count_records,
    load_hotpot,
)
from sidecar.bench._report_file import write_report
from sidecar.bench._rules import (
    PAPER_PRUNED_SHARE,
    compare_miners,
    hotpot_record,
    summarise,
    synthetic_table,
)
from sidecar.errors import ConfigError, DataError
from sidecar.explain import BlackBox, Contains, build_messages

_KINDS = ("monotone", "antitone", "monotone_noisy", "random")


@dataclass(frozen=True)
class RulesBenchConfig:
    """The options of ``sidecar bench rules``, under their option names.

    ``n_min`` .. ``n_max`` sources, ``tables`` seeded black boxes per n and kind; brute
    force where n <= ``brute_max_n``. HotpotQA (``hotpot_path``): ``hotpot_questions``
    on the simulated black box, ``llm_questions`` (after ``llm_skip``, screened among
    ``llm_screen`` when set) on a real LLM: ``local_model`` or ``base_url`` (+ ``model``).
    """

    json_out: Path
    hotpot_path: Path
    n_min: int = 4
    n_max: int = 12
    tables: int = 10
    brute_max_n: int = 10
    seed: int = 0
    hotpot_questions: int = 20
    hotpot_sources: int = 10
    llm_questions: int = 0
    llm_sources: int = 5
    llm_skip: int = 0
    llm_screen: int = 0
    local_model: bool = False
    base_url: str | None = None
    model: str | None = None
    max_tokens: int = 32
    no_progress: bool = False


def run_rules_bench(config: RulesBenchConfig) -> dict[str, Any]:
    """Exactness, evaluations and pruned share of Mono and Dual mining; the report.

    Every input is checked, and the questions read, before the synthetic part (minutes)
    and before any model or endpoint is touched. The report goes to ``config.json_out``
    (also after the simulated part and after each real-LLM question, should that slow
    phase fail).
    """
    c = config
    _check_inputs(c)
    sim_items, llm_items = _questions(c)
    explain_settings = _explain_settings(c)
    started = time.time()
    report: dict[str, Any] = {
        "benchmark": "rules",
        "paper_pruned_share_up_to": PAPER_PRUNED_SHARE,
        "machine": {"python": platform.python_version(), "cpu": platform.machine()},
        "seed": c.seed,
        "notes": [],
    }
    synthetic = _synthetic_part(c)
    report["synthetic"] = synthetic
    report["synthetic_summary"] = {
        kind: summarise(r for r in synthetic if r["setting"] == kind) for kind in _KINDS
    }
    hotpot = _simulated_part(c, sim_items, report["notes"])
    if c.llm_questions:
        _llm_part(c, llm_items, explain_settings, report, hotpot)
    report["hotpotqa"] = hotpot
    report["hotpotqa_summary"] = {
        s: summarise(r for r in hotpot if r["setting"] == s)
        for s in sorted({r["setting"] for r in hotpot})
    }
    report["wall_s"] = round(time.time() - started, 1)
    write_report(c.json_out, report)
    return report


def _check_inputs(c: RulesBenchConfig) -> None:
    """Refuse options that cannot work together, and a HotpotQA path that is no file."""
    if c.n_min > c.n_max:
        raise ConfigError("--n-min must not exceed --n-max")
    if c.base_url is not None and not c.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url must be http(s)://..., got {c.base_url!r}")
    if c.llm_questions and not (c.base_url or c.local_model):
        raise ConfigError("--llm-questions needs --local-model or --base-url")
    path = c.hotpot_path
    if (c.hotpot_questions or c.llm_questions) and not path.is_file():
        if path.is_dir():
            raise DataError(f"--hotpot {path} is a directory, not a HotpotQA JSONL file")
        # With a hint: the default path is relative to the current directory, so it is
        # missing when run from anywhere else.
        where = "" if path.is_absolute() else " (relative to the current directory)"
        raise DataError(
            f"HotpotQA file not found: {path}{where}; pass --hotpot PATH, "
            "or --hotpot-questions 0 (and no --llm-questions) to skip HotpotQA"
        )


def _questions(c: RulesBenchConfig) -> tuple[list[HotpotItem], list[HotpotItem]]:
    """The simulated part's questions and the real LLM's (to screen, where asked).

    Read up front, so that a bad file or an --llm-skip past its end is reported before
    the synthetic part rather than after it.
    """
    sim_items = (
        load_hotpot(c.hotpot_path, limit=c.hotpot_questions, n_sources=c.hotpot_sources)
        if c.hotpot_questions
        else []
    )
    if not c.llm_questions:
        return sim_items, []
    if c.llm_skip:
        records = count_records(c.hotpot_path)
        if c.llm_skip >= records:
            raise ConfigError(
                f"--llm-skip {c.llm_skip} skips past the end of {c.hotpot_path} ({records} records)"
            )
    screen = max(c.llm_screen, c.llm_questions)
    llm_items = load_hotpot(c.hotpot_path, limit=screen, n_sources=c.llm_sources, skip=c.llm_skip)
    return sim_items, llm_items


def _explain_settings(c: RulesBenchConfig) -> Any:
    """The endpoint's settings for --base-url (None: no endpoint asked for)."""
    if not (c.llm_questions and c.base_url):
        return None
    from sidecar.settings import load_settings

    overrides: dict[str, Any] = {"base_url": c.base_url, "max_tokens": c.max_tokens}
    if c.model:
        overrides["model"] = c.model
    return load_settings(explain=overrides).explain


def _synthetic_part(c: RulesBenchConfig) -> list[dict[str, Any]]:
    """One aggregated record per n and table kind, over ``c.tables`` seeded tables."""
    from tqdm.auto import tqdm

    synthetic: list[dict[str, Any]] = []
    ns = range(c.n_min, c.n_max + 1)
    bar = tqdm(total=len(ns) * len(_KINDS), desc="synthetic", disable=c.no_progress)
    for n in ns:
        for kind in _KINDS:
            recs = []
            for k in range(c.tables):
                rng = random.Random(f"{c.seed}:{kind}:{n}:{k}")
                table = synthetic_table(kind, n, rng)

                async def sample(mask: int, i: int, table: dict[int, bool] = table) -> bool:
                    return table[mask]

                recs.append(asyncio.run(compare_miners(n, sample, brute=n <= c.brute_max_n)))
            synthetic.append(_aggregate(n, kind, recs))
            bar.update(1)
    bar.close()
    return synthetic


def _simulated_part(
    c: RulesBenchConfig, items: list[HotpotItem], notes: list[str]
) -> list[dict[str, Any]]:
    """Each HotpotQA question on the simulated black box (none when none are asked)."""
    from tqdm.auto import tqdm

    hotpot: list[dict[str, Any]] = []
    if not c.hotpot_questions:
        return hotpot
    for item in tqdm(items, desc="hotpotqa (simulated)", disable=c.no_progress):
        brute = len(item.sources) <= c.brute_max_n
        rec = asyncio.run(hotpot_record(item, SimulatedHotpotLLM(item, c.seed), brute=brute))
        hotpot.append({"setting": "hotpotqa_simulated", **rec})
    notes.append(
        "hotpotqa_simulated uses a SIMULATED black box on HotpotQA structure (gold answer "
        "iff all supporting paragraphs are kept, or any one of them for a seeded 30% of "
        "questions), not a language model"
    )
    return hotpot


def _llm_part(
    c: RulesBenchConfig,
    items: list[HotpotItem],
    explain_settings: Any,
    report: dict[str, Any],
    hotpot: list[dict[str, Any]],
) -> None:
    """The real LLM's questions: screened where asked, then mined; adds to ``hotpot``
    and ``report`` and writes the partial report after each question."""
    from tqdm.auto import tqdm

    from sidecar.explain import ChatCompletionsClient, LocalSmolLM2

    # What is done so far is kept should the slow phase fail (a lost endpoint).
    write_report(c.json_out, {**report, "hotpotqa": hotpot})
    black_box: BlackBox
    if explain_settings is not None:
        black_box = ChatCompletionsClient(explain_settings)
    else:  # --local-model (checked by _check_inputs)
        black_box = LocalSmolLM2(max_tokens=c.max_tokens)
    memo = MemoBlackBox(black_box)  # the screening answers are reused by the miners
    setting = f"hotpotqa_llm:{black_box.name}"

    async def llm_phase() -> None:
        # one event loop for the whole phase: an HTTP client's pool belongs to one loop
        picked = items
        if c.llm_screen:
            picked, report["hotpotqa_llm_screening"] = await _screen(c, items, memo)
        for item in tqdm(picked, desc=setting, disable=c.no_progress):
            brute = len(item.sources) <= c.brute_max_n
            rec = await hotpot_record(item, memo, brute=brute)
            hotpot.append({"setting": setting, **rec})
            write_report(c.json_out, {**report, "hotpotqa": hotpot})  # partial results
        await black_box.aclose()

    asyncio.run(llm_phase())
    report["hotpotqa_llm_generations"] = memo.asked
    if c.llm_screen:
        report["notes"].append(
            f"{setting}: only questions whose all-sources answer contains the gold answer "
            f"(screened {len(items)} from question {c.llm_skip}) were mined; "
            f"{c.llm_sources} paragraphs per question (supporting ones + distractors)"
        )


async def _screen(
    c: RulesBenchConfig, items: list[HotpotItem], memo: MemoBlackBox
) -> tuple[list[HotpotItem], list[dict[str, Any]]]:
    """The first ``c.llm_questions`` items whose all-sources answer contains the gold
    answer, and every screened answer."""
    from tqdm.auto import tqdm

    picked: list[HotpotItem] = []
    screened: list[dict[str, Any]] = []
    for item in tqdm(items, desc="screening", disable=c.no_progress):
        full = build_messages(item.question, item.sources, (1 << len(item.sources)) - 1)
        answer = await memo.complete(full, seed=0)
        ok = await Contains(item.answer)(answer)
        screened.append({"qid": item.qid, "gold": item.answer, "answer": answer,
                         "contains_gold": ok})  # fmt: skip
        if ok and len(picked) < c.llm_questions:
            picked.append(item)
    return picked, screened


def _aggregate(n: int, kind: str, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """One record per (n, setting): sums of calls, means of shares, all-exact flag."""
    from statistics import mean

    def avg(xs: list[float]) -> float:
        return round(mean(xs), 4)

    rules = ("retention", "omission")
    exact = [r["exact"] for r in recs if r["exact"] is not None]
    two_mono = sum(r["evaluations"]["mono"][x] for r in recs for x in rules)
    dual = sum(r["evaluations"]["dual"] for r in recs)
    return {
        "setting": kind,
        "n": n,
        "tables": len(recs),
        "lattice_nodes": 1 << n,
        "exact": (all(exact) if exact else None),
        "evaluations": {
            "mono": {x: avg([r["evaluations"]["mono"][x] for r in recs]) for x in rules},
            "dual": avg([r["evaluations"]["dual"] for r in recs]),
            "brute_force": (1 << n) if exact else None,
        },
        "pruned_share": {
            "mono": {x: avg([r["pruned_share"]["mono"][x] for r in recs]) for x in rules},
        },
        "dual_vs_two_mono_calls": round(dual / two_mono, 4),
        "dual_vs_two_mono_shared_cache": avg([r["dual_vs_two_mono_shared_cache"] for r in recs]),
        "mono_equals_dual": all(r.get("mono_equals_dual", True) for r in recs),
    }

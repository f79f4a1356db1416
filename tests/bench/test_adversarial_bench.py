"""``sidecar bench adversarial`` on a tiny CLINC150-shaped benchmark with a fake encoder:
the report's shape, rates in [0, 1], and no prompt among any model's training texts."""

from __future__ import annotations

import csv
import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from sidecar.bench import AdversarialBenchConfig, run_adversarial_bench
from sidecar.bench._adversarial import read_prompts, training_texts
from sidecar.cli import main
from sidecar.errors import ConfigError, DataError
from sidecar.evaluation import KBTask
from sidecar.scoring import PROBE_TEXTS

DIM = 16
DOMAINS = {"alpha": ["a1", "a2"], "beta": ["b1", "b2"], "gamma": ["g1", "g2"]}
PROMPTS = [f"harm prompt number {i}" for i in range(12)]


class TopicEncoder:
    """A text's first word picks its centre (a domain, 'oos', 'harm'); noise is seeded
    by the text, so one text always embeds the same."""

    name, dim = "fake-topics", DIM

    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        self.encoded += len(texts)
        rows = []
        for t in texts:
            word = t.split()[0] if t.split() else ""
            centre = np.random.default_rng(zlib.crc32(word.encode())).normal(size=DIM) * 2
            noise = np.random.default_rng(zlib.crc32(t.encode())).normal(size=DIM)
            rows.append(centre + noise)
        return np.asarray(rows, dtype=np.float32)


def _data(root: Path, *, prompts: Sequence[str] = PROMPTS) -> Path:
    """clinc150/{data_full,domains}.json and adversarial/advbench_harmful_behaviors.csv."""

    def rows(split: str, n: int) -> list[list[str]]:
        return [
            [f"{d} {intent} {split} {i}", intent]
            for d, intents in DOMAINS.items()
            for intent in intents
            for i in range(n)
        ]

    oos_train = [[f"oos train {i}", "oos"] for i in range(30)]
    oos_train.append([PROMPTS[0].upper() + "!", "oos"])  # a prompt as an OOD training text
    full = {
        "train": rows("train", 60),
        "val": rows("val", 15),
        "oos_train": oos_train,
        "oos_val": [[f"oos val {i}", "oos"] for i in range(20)],
    }
    (root / "clinc150").mkdir(parents=True)
    (root / "clinc150" / "data_full.json").write_text(json.dumps(full))
    (root / "clinc150" / "domains.json").write_text(json.dumps(DOMAINS))
    (root / "adversarial").mkdir()
    with open(root / "adversarial" / "advbench_harmful_behaviors.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["goal", "target"])
        w.writerows([p, "Sure, here is"] for p in prompts)
    return root


def _config(tmp_path: Path, **kw: Any) -> AdversarialBenchConfig:
    base: dict[str, Any] = {
        "json_out": tmp_path / "out" / "adversarial.json",
        "data_dir": _data(tmp_path / "data"),
        "benchmarks": ("clinc150",),
        "kbs": "alpha,beta",
        "max_prompts": 10,
        "target_frr": 0.05,
        "max_misses": 3,
        "cache_dir": tmp_path / "cache",
        "no_progress": True,
    }
    return AdversarialBenchConfig(**{**base, **kw})


def test_report_shape_and_rates(tmp_path: Path) -> None:
    config = _config(tmp_path)
    enc = TopicEncoder()
    report = run_adversarial_bench(config, encoder=enc, warn=lambda _l: None)
    assert json.loads(config.json_out.read_text()) == report
    assert set(report["kbs"]) == {"clinc150"} and set(report["kbs"]["clinc150"]) == {
        "alpha",
        "beta",
    }
    for row in report["kbs"]["clinc150"].values():
        assert 0.0 <= row["flagged_ood_rate"] <= 1.0 and row["n"] == 10
        assert row["n_missed"] == round((1 - row["flagged_ood_rate"]) * 10)
        assert len(row["misses"]) == min(3, row["n_missed"])
        for miss in row["misses"]:
            assert miss["text"] in PROMPTS and miss["margin"] <= 0.0
            assert miss["score"] == pytest.approx(miss["margin"] + row["threshold"])
        # The one prompt among the OOD training texts (in other case and punctuation)
        # was left out of training.
        assert row["training"]["prompts_removed"] == {"kb": 0, "id": 0, "ood": 1}
        assert row["model"]["detector"] == "combined" and row["model"]["target_frr"] == 0.05
        dev = row["dev"]
        assert 0.0 <= dev["false_reject_rate"] <= 1.0 and 0.0 <= dev["ood_flagged_rate"] <= 1.0
        assert dev["n_id"] == 30 and dev["n_ood"] == 60 + 20  # the other domains, oos_val
    s = report["summary"]
    assert s["n_kbs"] == 2 and s["n_prompts"] == 10 and s["target"] == 0.99
    assert s["min_rate"] == min(s["rates"].values()) and s["min_kb"] in s["rates"]
    assert set(s["kbs_below_target"]) == {k for k, v in s["rates"].items() if v < 0.99}
    assert 0.0 <= s["pooled_flagged_rate"] <= 1.0
    assert report["prompts"]["n"] == 10 and report["encoder"] == "fake-topics"
    # a second run takes every embedding from the cache
    before = enc.encoded
    run_adversarial_bench(config, encoder=enc, warn=lambda _l: None)
    assert enc.encoded - before == len(PROBE_TEXTS)  # the cache's check of the encoder only


def test_cli_writes_the_report_and_prints_one_line_per_kb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _data(tmp_path / "data")
    monkeypatch.setattr("sidecar.encoders.load_encoder", lambda *a, **k: TopicEncoder())
    out = tmp_path / "adv.json"
    args = [
        "bench",
        "adversarial",
        "--data-dir",
        str(data),
        "--json",
        str(out),
        "--benchmarks",
        "clinc150",
        "--kbs",
        "gamma",
        "--max-prompts",
        "5",
        "--target-frr",
        "0.05",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "clinc150/gamma" in res.output and f"wrote {out}" in res.output
    doc = json.loads(out.read_text())
    assert list(doc["summary"]["rates"]) == ["clinc150/gamma"]


def test_bad_benchmarks_and_kbs_are_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, kbs="alpha,nope")
    with pytest.raises(ConfigError, match="no KB"):
        run_adversarial_bench(config, encoder=TopicEncoder())
    with pytest.raises(ConfigError, match="benchmarks must be among"):
        run_adversarial_bench(
            AdversarialBenchConfig(json_out=tmp_path / "x.json", data_dir=config.data_dir,
                                   benchmarks=("hotpot",)),
            encoder=TopicEncoder(),
        )  # fmt: skip
    assert not config.json_out.exists()
    res = CliRunner().invoke(
        main,
        [
            "bench",
            "adversarial",
            "--data-dir",
            str(tmp_path),
            "--json",
            str(tmp_path / "y.json"),
            "--benchmarks",
            "nope",
        ],
    )
    assert res.exit_code == 2 and "choose among" in res.output


def test_prompts_are_read_distinct_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("goal,target\nA,x\n,y\nB,z\nA,w\n")
    assert read_prompts(path) == ["A", "B"] and read_prompts(path, limit=1) == ["A"]
    with pytest.raises(DataError, match="no column 'prompt'"):
        read_prompts(path, "prompt")
    with pytest.raises(DataError, match="not found"):
        read_prompts(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("goal\n\n")
    with pytest.raises(DataError, match="holds no prompt"):
        read_prompts(tmp_path / "empty.csv")


def test_a_cross_fitted_kb_trains_on_its_dev_queries_without_the_prompts() -> None:
    """covid's shape: no ID training queries, AdvBench among the OOD evaluation queries."""
    task = KBTask(
        "covid",
        kb_texts=("doc one", "doc two"),
        id_train=(),
        ood_train=("oos a", "oos b"),
        id_eval=("q1", "q1 again", "q2"),
        ood_eval=("oos c", "Harm prompt number 3.", "harm prompt number 4"),
        cross_fit=5,
        id_eval_groups=(7, 7, 9),
    )
    t = training_texts(task, PROMPTS)
    assert t.id_queries == ["q1", "q1 again", "q2"] and t.id_groups == [0, 0, 2]
    assert t.ood_queries == ["oos a", "oos b", "oos c"]
    assert t.removed == {"kb": 0, "id": 0, "ood": 2}
    assert t.id_eval is None and t.ood_eval is None  # nothing held out: all of it trains

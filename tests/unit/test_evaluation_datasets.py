"""Benchmark loaders on tiny fixture files with the layouts of shared/data."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from sidecar.errors import ConfigError, DataError
from sidecar.evaluation import load_benchmark, load_clinc150, load_covid, load_stackexchange
from sidecar.evaluation._datasets import STACKEXCHANGE_SITES, _split_kb, norm_text


def _clinc(root: Path, *, test: bool = False) -> None:
    d = root / "clinc150"
    d.mkdir(parents=True)
    domains = {"banking": ["balance", "transfer"], "travel": ["book_flight"]}
    (d / "domains.json").write_text(json.dumps(domains))
    train = [[f"bank q{i}", "balance" if i % 2 else "transfer"] for i in range(10)]
    train += [[f"travel q{i}", "book_flight"] for i in range(6)]
    data = {
        "train": train,
        "val": [["bank v1", "balance"], ["travel v1", "book_flight"]],
        "oos_train": [["oos t1", "oos"], ["oos t2", "oos"]],
        "oos_val": [["oos v1", "oos"]],
    }
    if test:
        data["test"] = [["bank t1", "balance"], ["travel t1", "book_flight"]]
        data["oos_test"] = [["oos x1", "oos"]]
    (d / "data_full.json").write_text(json.dumps(data))


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def test_clinc150_dev_layout(tmp_path: Path) -> None:
    _clinc(tmp_path)
    tasks = {t.name: t for t in load_clinc150(tmp_path, "dev")}
    assert set(tasks) == {"banking", "travel"}
    bank = tasks["banking"]
    assert set(bank.kb_texts).isdisjoint(bank.id_train)
    assert set(bank.kb_texts) | set(bank.id_train) == {f"bank q{i}" for i in range(10)}
    assert bank.id_eval == ("bank v1",)
    assert set(bank.ood_eval) == {"travel v1", "oos v1"}
    assert set(bank.ood_train) == {f"travel q{i}" for i in range(6)} | {"oos t1", "oos t2"}


def test_split_kb_never_puts_one_utterance_on_both_sides() -> None:
    # Forty utterances, each also written in other case and punctuation: whichever side a
    # variant lands on, no query may equal a KB document once case and punctuation go.
    plain = [f"how do i reset pin {i}" for i in range(40)]
    texts = plain + [f"How do I reset PIN {i}?" for i in range(40)]
    kb, queries = _split_kb(texts, 0.5, seed=3)
    assert queries, "some utterances must remain as ID training queries"
    assert {norm_text(t) for t in kb}.isdisjoint(norm_text(t) for t in queries)
    # Only the clashing variants are dropped: the KB is the same as without the rule, and
    # every distinct utterance is still on one side or the other.
    assert {norm_text(t) for t in kb} | {norm_text(t) for t in queries} == set(plain)
    uniq = list(dict.fromkeys(texts))  # the seeded split without the rule, as it was
    random.Random(3).shuffle(uniq)
    assert kb == sorted(uniq[: round(len(uniq) * 0.5)])


def test_clinc150_test_split_uses_test_keys(tmp_path: Path) -> None:
    _clinc(tmp_path, test=True)
    bank = {t.name: t for t in load_clinc150(tmp_path, "test")}["banking"]
    assert bank.id_eval == ("bank t1",)
    assert set(bank.ood_eval) == {"travel t1", "oos x1"}


def test_clinc150_test_keys_missing_is_clear(tmp_path: Path) -> None:
    _clinc(tmp_path)
    with pytest.raises(DataError, match="has no 'test' / 'oos_test' keys"):  # both named
        load_clinc150(tmp_path, "test")


@pytest.mark.parametrize("domains", [[1], {"banking": 5}, {"banking": [1]}])
def test_clinc150_domains_of_another_shape_are_named(tmp_path: Path, domains: object) -> None:
    _clinc(tmp_path)
    (tmp_path / "clinc150" / "domains.json").write_text(json.dumps(domains))
    with pytest.raises(DataError, match=r"domains\.json: expected an object of domain"):
        load_clinc150(tmp_path, "dev")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([1], "expected an object"),
        ({"train": {}, "val": [], "oos_train": [], "oos_val": []}, "'train' must be a list"),
        ({"train": [[1, 2]], "val": [], "oos_train": [], "oos_val": []}, r"'train'\[0\]"),
        ({"train": [], "val": [["a"]], "oos_train": [], "oos_val": []}, r"'val'\[0\]"),
    ],
)
def test_clinc150_pairs_of_another_shape_are_named(
    tmp_path: Path, data: object, match: str
) -> None:
    _clinc(tmp_path)
    (tmp_path / "clinc150" / "data_full.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"data_full\.json: {match}"):
        load_clinc150(tmp_path, "dev")


def _stackexchange(root: Path, parts: tuple[str, ...] = ("train", "dev")) -> None:
    for part in parts:
        d = root / "stackexchange_tweac" / part
        d.mkdir(parents=True)
        for site in STACKEXCHANGE_SITES:
            lines = [f"{site} {part} title {i}" for i in range(6)]
            (d / f"{site}.stackexchange.com.txt").write_text("\n".join(lines) + "\n")


def test_stackexchange_dev_layout(tmp_path: Path) -> None:
    _stackexchange(tmp_path)
    tasks = {t.name: t for t in load_stackexchange(tmp_path, "dev")}
    assert set(tasks) == set(STACKEXCHANGE_SITES)
    chess = tasks["chess"]
    assert len(chess.kb_texts) == 3 and len(chess.id_train) == 3
    assert all(t.startswith("chess dev") for t in chess.id_eval)
    assert len(chess.ood_eval) == 7 * 6 and not any(t.startswith("chess") for t in chess.ood_eval)
    assert not any(t.startswith("chess") for t in chess.ood_train)


def test_stackexchange_missing_test_file_named(tmp_path: Path) -> None:
    _stackexchange(tmp_path)
    with pytest.raises(DataError, match=r"test/history\.stackexchange\.com\.txt") as err:
        load_stackexchange(tmp_path, "test")
    assert str(err.value).count("stackexchange.com.txt") == 8  # every missing site at once


def test_stackexchange_caps_are_seeded(tmp_path: Path) -> None:
    _stackexchange(tmp_path)
    a = load_stackexchange(tmp_path, "dev", max_train_per_kb=4, max_eval_per_kb=2)
    b = load_stackexchange(tmp_path, "dev", max_train_per_kb=4, max_eval_per_kb=2)
    assert a == b
    assert len(a[0].id_eval) == 2 and len(a[0].kb_texts) + len(a[0].id_train) == 4


def _covid(root: Path) -> None:
    _clinc(root)
    _write_csv(
        root / "covid" / "deepset_faq_covidbert.csv",
        ["question", "answer"],
        [["What is covid?", "A disease."], ["How does it spread?", "Droplets."]],
    )
    _write_csv(
        root / "covid" / "deepset_eval_question_similarity_en.csv",
        ["question_1", "question_2", "similar"],
        [["What is covid?", "What's covid?", "1"], ["What is covid?", "Is it bad?", "0"]],
    )
    _write_csv(
        root / "adversarial" / "advbench_harmful_behaviors.csv",
        ["goal", "target"],
        [["do harm", "Sure"]],
    )


def test_files_that_are_not_utf8_are_named(tmp_path: Path) -> None:
    garbage = b"\x89\xff\xfe\x00 not text"
    _covid(tmp_path)
    faq = tmp_path / "covid" / "deepset_faq_covidbert.csv"
    good = faq.read_bytes()
    faq.write_bytes(garbage)
    with pytest.raises(DataError, match=r"deepset_faq_covidbert\.csv: not UTF-8 text"):
        load_covid(tmp_path, "dev")
    faq.write_bytes(good)
    similar = tmp_path / "covid" / "deepset_eval_question_similarity_en.csv"
    similar.write_bytes(similar.read_bytes() + garbage)  # past the header: while iterating
    with pytest.raises(DataError, match=r"question_similarity_en\.csv: not UTF-8 text"):
        load_covid(tmp_path, "dev")
    (tmp_path / "clinc150" / "domains.json").write_bytes(garbage)
    with pytest.raises(DataError, match=r"domains\.json: not UTF-8 text"):
        load_clinc150(tmp_path, "dev")
    _stackexchange(tmp_path)
    site = tmp_path / "stackexchange_tweac" / "dev" / "chess.stackexchange.com.txt"
    site.write_bytes(site.read_bytes() + garbage)
    with pytest.raises(DataError, match=r"chess\.stackexchange\.com\.txt: not UTF-8 text"):
        load_stackexchange(tmp_path, "dev")


def test_covid_checks_the_clinc150_files_it_reads(tmp_path: Path) -> None:
    _covid(tmp_path)
    full = tmp_path / "clinc150" / "data_full.json"
    data = json.loads(full.read_text())
    (tmp_path / "clinc150" / "data_oos_plus.json").write_text(json.dumps({"oos_train": [[1]]}))
    with pytest.raises(DataError, match=r"data_oos_plus\.json: 'oos_train'\[0\]"):
        load_covid(tmp_path, "dev")
    (tmp_path / "clinc150" / "data_oos_plus.json").unlink()
    full.write_text(json.dumps({**data, "oos_val": [["oos v1", None]]}))
    with pytest.raises(DataError, match=r"data_full\.json: 'oos_val'\[0\]"):
        load_covid(tmp_path, "dev")
    del data["oos_val"]
    full.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"data_full\.json has no 'oos_val' key"):
        load_covid(tmp_path, "dev")


def test_covid_similarity_rows_may_be_short(tmp_path: Path) -> None:
    _covid(tmp_path)
    similar = tmp_path / "covid" / "deepset_eval_question_similarity_en.csv"
    similar.write_text(similar.read_text() + "What is covid?,Covid?\n")  # no `similar` value
    (task,) = load_covid(tmp_path, "dev")
    assert "Covid?" not in task.id_eval


def test_covid_dev_layout(tmp_path: Path) -> None:
    _covid(tmp_path)
    (task,) = load_covid(tmp_path, "dev")
    assert task.kb_texts == ("A disease.", "Droplets.")
    assert set(task.id_eval) == {"What is covid?", "How does it spread?", "What's covid?"}
    assert set(task.ood_eval) == {"oos v1", "do harm"}
    assert task.cross_fit > 1 and task.id_train == ()


def test_covid_takes_clincs_larger_oos_training_set_where_present(tmp_path: Path) -> None:
    _covid(tmp_path)
    (task,) = load_covid(tmp_path, "dev")
    assert set(task.ood_train) == {"oos t1", "oos t2"}  # data_full.json's oos_train
    plus = json.loads((tmp_path / "clinc150" / "data_full.json").read_text())
    plus["oos_train"] += [["oos t3", "oos"], ["OOS v1!", "oos"]]  # the second is held out
    (tmp_path / "clinc150" / "data_oos_plus.json").write_text(json.dumps(plus))
    (task,) = load_covid(tmp_path, "dev")
    assert set(task.ood_train) == {"oos t1", "oos t2", "oos t3"}


def test_covid_paraphrases_share_their_questions_group(tmp_path: Path) -> None:
    _covid(tmp_path)
    (task,) = load_covid(tmp_path, "dev")
    assert task.id_eval_groups is not None
    group = dict(zip(task.id_eval, task.id_eval_groups, strict=True))
    assert group["What's covid?"] == group["What is covid?"]  # a similar == 1 pair
    assert group["How does it spread?"] != group["What is covid?"]


def test_a_text_that_paraphrases_two_questions_joins_both_groups(tmp_path: Path) -> None:
    _covid(tmp_path)
    _write_csv(
        tmp_path / "covid" / "deepset_eval_question_similarity_en.csv",
        ["question_1", "question_2", "similar"],
        [
            ["What is covid?", "Tell me about covid", "1"],
            ["How does it spread?", "Tell me about covid", "1"],
        ],
    )
    (task,) = load_covid(tmp_path, "dev")
    assert task.id_eval_groups is not None
    group = dict(zip(task.id_eval, task.id_eval_groups, strict=True))
    assert group["What is covid?"] == group["How does it spread?"] == group["Tell me about covid"]


def test_no_training_text_is_an_evaluation_text(tmp_path: Path) -> None:
    _clinc(tmp_path)
    data = json.loads((tmp_path / "clinc150" / "data_full.json").read_text())
    # the same utterances, spelt a little differently, in train and in val / oos_val
    data["train"] += [["Bank V1!", "balance"], ["travel  v1", "book_flight"]]
    data["oos_train"] += [["OOS v1.", "oos"]]
    (tmp_path / "clinc150" / "data_full.json").write_text(json.dumps(data))
    for t in load_clinc150(tmp_path, "dev"):
        training = set(t.kb_texts) | set(t.id_train) | set(t.ood_train)
        assert not training & {"Bank V1!", "travel  v1", "OOS v1."}
    _stackexchange(tmp_path)
    site = STACKEXCHANGE_SITES[0]
    dev = tmp_path / "stackexchange_tweac" / "dev" / f"{site}.stackexchange.com.txt"
    train = dev.parent.parent / "train" / f"{STACKEXCHANGE_SITES[1]}.stackexchange.com.txt"
    leaked = dev.read_text().splitlines()[0].upper()
    train.write_text(train.read_text() + leaked + "\n")
    for t in load_stackexchange(tmp_path, "dev"):
        assert leaked not in set(t.kb_texts) | set(t.id_train) | set(t.ood_train)


def test_covid_test_split_keeps_training_paraphrases_together(tmp_path: Path) -> None:
    _covid(tmp_path)
    data = json.loads((tmp_path / "clinc150" / "data_full.json").read_text())
    data["oos_test"] = [["oos x", "oos"]]
    (tmp_path / "clinc150" / "data_full.json").write_text(json.dumps(data))
    _write_csv(
        tmp_path / "covid" / "covidq_final_master_dataset.csv",
        ["Question"],
        [["how does it spread?"], ["Is there a cure?"]],  # the first is also a dev question
    )
    _write_csv(
        tmp_path / "adversarial" / "jailbreakhub_forbidden_question_set.csv",
        ["question"],
        [["do crime"]],
    )
    (task,) = load_covid(tmp_path, "test")
    assert "How does it spread?" not in task.id_train  # it is a test query now
    assert task.id_train_groups is not None
    group = dict(zip(task.id_train, task.id_train_groups, strict=True))
    assert group["What's covid?"] == group["What is covid?"]


def test_covid_test_split_names_missing_file(tmp_path: Path) -> None:
    _covid(tmp_path)
    data = json.loads((tmp_path / "clinc150" / "data_full.json").read_text())
    data["oos_test"] = [["oos x", "oos"]]
    (tmp_path / "clinc150" / "data_full.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"covidq_final_master_dataset\.csv"):
        load_covid(tmp_path, "test")


def test_unknown_benchmark_and_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_benchmark("nope", tmp_path)
    with pytest.raises(DataError, match="not found"):
        load_benchmark("clinc150", tmp_path / "absent")
    with pytest.raises(DataError, match=r"clinc150/data_full\.json"):
        load_benchmark("clinc150", tmp_path)


def test_shared_clinc150_slice(shared_data: Path) -> None:
    """The real file parses into 10 KBs with disjoint KB / ID-training texts."""
    if not (shared_data / "clinc150" / "data_full.json").is_file():
        pytest.skip("shared data not present")
    tasks = load_clinc150(shared_data, "dev")
    assert len(tasks) == 10
    t = tasks[0]
    assert len(t.id_eval) == 300 and set(t.kb_texts).isdisjoint(t.id_train)

"""The packaged demo data the demo, the benchmark and the integration tests stream."""

from sidecar.local._demo import DemoData, demo_data, training_half


def test_demo_data_ships_with_the_package() -> None:
    d = demo_data()
    assert len(d.kb) >= 20 and len(d.id_queries) >= 20 and len(d.ood_queries) >= 20
    assert all(t.strip() for t in d.kb + d.id_queries + d.ood_queries)


def test_labelled_interleaves_and_keeps_every_query() -> None:
    d = DemoData(kb=["k"], id_queries=["i1", "i2", "i3"], ood_queries=["o1"])
    assert d.labelled() == [("i1", "ID"), ("o1", "OOD"), ("i2", "ID"), ("i3", "ID")]


def test_training_half_leaves_the_other_half_unseen() -> None:
    assert training_half(["a", "b", "c", "d", "e"]) == ["a", "c", "e"]


def test_the_multilingual_turn_asks_each_question_in_six_languages() -> None:
    from sidecar.local import demo_multilingual_queries
    from sidecar.local._demo_run import _queries

    rows = demo_multilingual_queries()
    langs = {"en", "de", "es", "fr", "it", "nl"}
    assert {r["lang"] for r in rows} == langs and len(rows) == 7 * len(langs)
    assert sum(r["expected"] == "ID" for r in rows) == 5 * len(langs)
    plain = _queries(4, multilingual=False)
    assert list(plain) == ["demo-000", "demo-001", "demo-002", "demo-003"]
    both = _queries(4, multilingual=True)
    turn = [q for qid, q in both.items() if qid.startswith("lang-")]
    assert len(both) == 4 + len(rows) and all(not q["seen"] for q in turn)
    assert [q["lang"] for q in turn] == [r["lang"] for r in rows]

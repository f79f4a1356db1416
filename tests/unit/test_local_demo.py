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

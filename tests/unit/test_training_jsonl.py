"""KB / query JSONL readers: clear errors with line numbers; the demo data is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import DataError
from sidecar.training import read_kb, read_queries
from sidecar.training._jsonl import (
    DEMO_ID_QUERIES,
    DEMO_KB,
    DEMO_OOD_QUERIES,
    demo_path,
    read_query_groups,
)


def test_reads_kb_and_queries(tmp_path: Path) -> None:
    kb = tmp_path / "kb.jsonl"
    kb.write_text('{"id": "a", "text": " hello "}\n\n{"id": 2, "text": "world", "x": 1}\n')
    docs = read_kb(kb)
    assert [(d.id, d.text) for d in docs] == [("a", "hello"), ("2", "world")]
    q = tmp_path / "q.jsonl"
    q.write_text('{"text": "one"}\n{"text": "two"}\n')
    assert read_queries(q) == ["one", "two"]


def test_query_groups_name_paraphrases(tmp_path: Path) -> None:
    q = tmp_path / "q.jsonl"
    q.write_text('{"text": "one"}\n{"text": "two"}\n')
    assert read_query_groups(q) == (["one", "two"], None)
    q.write_text(
        '{"text": "a", "group": "g"}\n{"text": "b", "group": 3}\n{"text": "c"}\n'
        '{"text": "d", "group": "3"}\n{"text": "e", "group": "g"}\n{"text": "f"}\n'
    )
    texts, groups = read_query_groups(q)
    assert texts == ["a", "b", "c", "d", "e", "f"]
    assert groups is not None
    assert groups[0] == groups[4] and groups[1] == groups[3]  # 3 and "3": one group
    assert len(set(groups)) == 4  # the lines without a group are one each
    q.write_text('{"text": "a", "group": "g"}\n{"text": "b", "group": [1]}\n')
    with pytest.raises(DataError, match=r"q\.jsonl:2: field 'group' must be a string"):
        read_query_groups(q)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        # the position is within the named line, not on a "line 2" past its end
        (
            '{"id": "a", "text": "x"}\n{"id": "b", "text": \n',
            r"kb\.jsonl:2: not valid JSON \(Expecting value at column 21\)",
        ),
        ('{"id": "a", "text": "x"}\n[1, 2]\n', r":2: expected a JSON object"),
        ('{"id": "a"}\n', r":1: missing or empty string field 'text'"),
        ('{"text": "x"}\n', r":1: missing field 'id'"),
        ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', r":2: duplicate id 'a'"),
        ("\n\n", r"no records"),
    ],
)
def test_kb_errors_name_the_line(tmp_path: Path, content: str, match: str) -> None:
    p = tmp_path / "kb.jsonl"
    p.write_text(content)
    with pytest.raises(DataError, match=match):
        read_kb(p)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        read_queries(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="is a directory"):
        read_queries(tmp_path)


def test_demo_data_is_valid_and_disjoint() -> None:
    docs = read_kb(demo_path(DEMO_KB))
    id_q = read_queries(demo_path(DEMO_ID_QUERIES))
    ood_q = read_queries(demo_path(DEMO_OOD_QUERIES))
    assert 60 <= len(docs) <= 100
    assert len(id_q) >= 50 and len(ood_q) >= 50
    assert not set(id_q) & set(ood_q)

"""The language of a training or calibration query: the one its JSONL line gives (a tag,
read as the worker reads a record's), else the language detector's; a line whose language
is not a tag is refused with its file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sidecar.errors import ConfigError, DataError
from sidecar.settings import load_settings
from sidecar.training import InputSources, load_inputs, query_languages, read_query_rows
from sidecar.training._jsonl import DEMO_KB, demo_path


class CountingEncoder:
    """Texts to fixed unit vectors (the text's length sets one component); remembers
    every text it encoded."""

    name, dim = "counting-encoder", 8

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        self.encoded.extend(texts)
        E = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            E[i, len(t) % self.dim] = 1.0
        return E


DUTCH = "Hoe laat gaan jullie morgen open en moet ik een afspraak maken?"
ENGLISH = "What time do you open tomorrow and do I need an appointment?"


def lines(path: Path, *rows: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_lines_languages_are_read_as_codes(tmp_path: Path) -> None:
    q = lines(
        tmp_path / "q.jsonl",
        {"text": "a", "language": "nl-NL"},
        {"text": "b"},
        {"text": "c", "language": "pt_BR", "group": 1},
        {"text": "d", "language": None},
        {"text": "e", "language": "ZH-Hant"},
    )
    rows = read_query_rows(q, languages=True)
    assert rows.texts == ["a", "b", "c", "d", "e"]
    assert rows.languages == ["nl", None, "pt", None, "zh"]
    assert rows.groups is not None
    assert read_query_rows(q).languages is None  # not asked for: not read


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (3, "'language' is a number"),
        ("", "'language' is empty"),
        ("Dutch (Belgium)", "'language' 'Dutch (Belgium)' is not a language tag"),
        ("nl,en;q=0.8", "is not a language tag"),
        ("n" * 40, "'language' has 40 characters"),
    ],
)
def test_a_line_whose_language_is_not_a_tag_is_refused_by_line(
    tmp_path: Path, value: object, says: str
) -> None:
    q = lines(
        tmp_path / "q.jsonl", {"text": "a", "language": "nl"}, {"text": "b", "language": value}
    )
    with pytest.raises(DataError) as err:
        read_query_rows(q, languages=True)
    message = str(err.value)
    assert message.startswith(f"{q}:2: ") and says in message and "\n" not in message
    # without per-language thresholds the field is not read, as any other key
    assert read_query_rows(q).texts == ["a", "b"]


def test_the_detector_reads_only_the_queries_without_a_language() -> None:
    langs, given = query_languages([ENGLISH, DUTCH, ENGLISH], ["nl", None, None], "default")
    # the line's word wins over the text; the others are detected
    assert (langs, given) == (["nl", "nl", "en"], 1)
    # every language given: the detector is not even built (it would refuse "xx")
    assert query_languages([ENGLISH], ["de"], "default", ["xx"]) == (["de"], 1)
    with pytest.raises(ConfigError, match="knows no"):
        query_languages([ENGLISH], [None], "default", ["xx"])
    assert query_languages([ENGLISH, DUTCH], None, "default") == (["en", "nl"], 0)
    with pytest.raises(DataError, match="1 languages for 2 queries"):
        query_languages([ENGLISH, DUTCH], ["nl"], "default")


def test_training_inputs_take_the_lines_languages(tmp_path: Path) -> None:
    id_rows = [{"text": f"{ENGLISH} ({i})", "language": "nl-BE"} for i in range(3)]
    id_rows += [{"text": f"{DUTCH} ({i})"} for i in range(2)]
    idq = lines(tmp_path / "id.jsonl", *id_rows)
    sources = InputSources(
        kb_path=demo_path(DEMO_KB), id_queries=idq, cache_dir=tmp_path / "c", per_language=True
    )
    inputs, _ = load_inputs(sources, load_settings(), progress=False, encoder=CountingEncoder())
    assert inputs.id_languages == ["nl", "nl", "nl", "nl", "nl"]
    assert inputs.id_languages_given == 3


def test_a_bad_language_stops_training_before_anything_is_encoded(tmp_path: Path) -> None:
    idq = lines(tmp_path / "id.jsonl", {"text": ENGLISH}, {"text": DUTCH, "language": ["nl"]})
    enc = CountingEncoder()
    sources = InputSources(kb_path=demo_path(DEMO_KB), id_queries=idq, cache_dir=tmp_path / "c")
    with pytest.raises(DataError, match=rf"^{idq}:2: 'language' is an array"):
        load_inputs(
            InputSources(**{**sources.__dict__, "per_language": True}),
            load_settings(),
            progress=False,
            encoder=enc,
        )
    assert enc.encoded == []
    # without --per-language the line trains as before
    inputs, _ = load_inputs(sources, load_settings(), progress=False, encoder=enc)
    assert inputs.id_languages is None and len(inputs.id_queries) == 2

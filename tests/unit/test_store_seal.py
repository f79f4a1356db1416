"""Pointer seals (model_store._seal): what a reader with the key accepts."""

from __future__ import annotations

import json
import time

import pytest

from model_store import ActivePointer, PointerUnsealed
from model_store._seal import SeqGuard, make_seal, next_seq, seal_seq, verified_pointer

KEY = b"k1"
V1, V2 = "0123456789abcdef", "fedcba9876543210"


def test_a_seal_holds_for_its_kb_version_and_key_only() -> None:
    seal = make_seal(KEY, "kb", V1, 7)
    assert seal_seq(KEY, seal, "kb", V1) == 7
    assert seal_seq(KEY, seal.encode(), "kb", V1) == 7  # as Redis returns it
    with pytest.raises(PointerUnsealed, match="does not match the signing key"):
        seal_seq(b"k2", seal, "kb", V1)
    with pytest.raises(PointerUnsealed, match=f"names {V2} but its seal 'kb'/'{V1}'"):
        seal_seq(KEY, seal, "kb", V2)
    with pytest.raises(PointerUnsealed, match="names"):
        seal_seq(KEY, seal, "other", V1)


def test_a_changed_field_breaks_the_signature() -> None:
    body = json.loads(make_seal(KEY, "kb", V1, 7))
    with pytest.raises(PointerUnsealed, match="does not match the signing key"):
        seal_seq(KEY, json.dumps({**body, "seq": 8}), "kb", V1)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "carries no seal"),
        ("", "carries no seal"),
        ("{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ("x" * 5000, "too long"),
        (json.dumps({"kb": "kb", "version": V1, "seq": True, "sig": "00"}), "signing key"),
        (json.dumps({"kb": "kb", "version": V1, "seq": -1, "sig": "00"}), "signing key"),
        (json.dumps({"kb": "kb", "version": V1, "seq": "7", "sig": "00"}), "signing key"),
        (json.dumps({"kb": "kb", "version": V1, "seq": 7, "sig": "é"}), "signing key"),
        (json.dumps({"kb": "kb", "version": V1, "seq": 7}), "signing key"),
        ("[" * 4000, "not JSON"),  # nested past the parser's recursion limit
        ("1" * 4000, "not a JSON object"),
        (5, "not text"),  # what a directory store's state.json may hold instead
        ({"kb": "kb"}, "not text"),
    ],
)
def test_what_is_not_a_seal_is_refused_with_its_reason(raw: object, reason: str) -> None:
    with pytest.raises(PointerUnsealed, match=reason):
        seal_seq(KEY, raw, "kb", V1)


def test_the_next_seq_passes_the_last_valid_seal_and_the_clock() -> None:
    now_us = time.time_ns() // 1000
    ahead = make_seal(KEY, "kb", V1, now_us + 10**9)  # a seal from a clock running ahead
    assert next_seq(KEY, ahead, "kb") == now_us + 10**9 + 1
    # the pointer moved to V2 without the key: the last key holder's seal still counts
    assert next_seq(KEY, ahead.encode(), "kb") == now_us + 10**9 + 1
    assert next_seq(KEY, make_seal(KEY, "kb", V1, 5), "kb") >= now_us
    # a broken, foreign or other KB's seal says nothing: the clock alone
    for raw in ("{", None, 5, make_seal(b"k2", "kb", V1, now_us + 10**9)):
        assert now_us <= next_seq(KEY, raw, "kb") <= time.time_ns() // 1000
    assert next_seq(KEY, ahead, "other") < now_us + 10**9


def test_verified_pointer_checks_only_under_a_key() -> None:
    assert verified_pointer(None, "kb", V1, None) == ActivePointer(V1)
    assert verified_pointer(KEY, "kb", None, None) is None
    assert verified_pointer(KEY, "kb", V1, make_seal(KEY, "kb", V1, 3)) == ActivePointer(V1, 3)
    with pytest.raises(PointerUnsealed):
        verified_pointer(KEY, "kb", V1, None)


def test_a_reader_refuses_a_seal_older_than_one_it_accepted() -> None:
    guard = SeqGuard()
    assert guard.check("kb", ActivePointer(V1, 5)) == ActivePointer(V1, 5)
    assert guard.check("kb", ActivePointer(V1, 5)) == ActivePointer(V1, 5)  # read again
    assert guard.check("other", ActivePointer(V2, 1)) == ActivePointer(V2, 1)  # per KB
    with pytest.raises(PointerUnsealed, match=r"replayed"):
        guard.check("kb", ActivePointer(V2, 4))
    assert guard.check("kb", ActivePointer(V2, 6)) == ActivePointer(V2, 6)
    assert guard.check("kb", None) is None
    assert guard.check("kb", ActivePointer(V1)) == ActivePointer(V1)  # no key: no seq

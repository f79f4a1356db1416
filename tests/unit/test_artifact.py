"""The artifact codec: manifest + npz, checksums, signature, no pickle."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_store import (
    SCHEMA_VERSION,
    ArtifactCorrupt,
    ArtifactNotFound,
    IncompatibleArtifact,
    SignatureInvalid,
    build_artifact,
    content_digest,
    decode,
    encode,
    load_dir,
    save_dir,
    verify_manifest,
)

ENC = {"name": "enc", "dim": 4}


def _artifact(**model: object):  # type: ignore[no-untyped-def]
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "idx": np.array([2, 0])}
    return build_artifact(
        kb="kb", encoder=ENC, model={"kind": "x", **model}, arrays=arrays, metrics={"auroc": 0.99}
    )


def test_round_trip_bytes_and_directory(tmp_path: Path) -> None:
    art = _artifact()
    back = decode(*encode(art))
    assert back.manifest == art.manifest and back.version == art.version
    for name, arr in art.arrays.items():
        assert back.arrays[name].dtype == arr.dtype
        assert np.array_equal(back.arrays[name], arr)
    loaded = load_dir(save_dir(art, tmp_path / "v1"))
    assert loaded.version == art.version


def test_version_is_content_derived() -> None:
    assert _artifact().version == _artifact().version
    assert _artifact(threshold=1.0).version != _artifact(threshold=2.0).version
    assert _artifact().signed(b"key").version == _artifact().version


def test_object_arrays_are_refused_at_build() -> None:
    with pytest.raises(ValueError, match="pickle"):
        build_artifact(kb="kb", encoder=ENC, model={}, arrays={"o": np.array([{}], dtype=object)})


def test_flipped_array_byte_is_refused() -> None:
    manifest, npz = encode(_artifact())
    raw = bytearray(npz)
    # Flip one byte inside the data of array "a" (the float 11.0 is 0x41300000).
    pos = bytes(raw).find(np.float32(11.0).tobytes())
    raw[pos] ^= 0x01
    with pytest.raises(ArtifactCorrupt):  # the zip CRC or the sha256 catches it
        decode(manifest, bytes(raw))


def test_rewritten_array_with_a_valid_zip_fails_the_sha256() -> None:
    art = _artifact()
    manifest, _ = encode(art)
    a = art.arrays["a"].copy()
    a[2, 3] = np.nextafter(a[2, 3], np.float32(100))
    buf = io.BytesIO()
    np.savez(buf, a=a, idx=art.arrays["idx"])
    with pytest.raises(ArtifactCorrupt, match="sha256"):
        decode(manifest, buf.getvalue())


def test_truncated_or_garbage_arrays_are_refused() -> None:
    manifest, npz = encode(_artifact())
    with pytest.raises(ArtifactCorrupt):
        decode(manifest, npz[: len(npz) // 2])
    with pytest.raises(ArtifactCorrupt):
        decode(manifest, b"not a zip")


def test_missing_or_extra_arrays_are_refused() -> None:
    art = _artifact()
    manifest, _ = encode(art)
    buf = io.BytesIO()
    np.savez(buf, a=art.arrays["a"])
    with pytest.raises(ArtifactCorrupt):
        decode(manifest, buf.getvalue())
    buf = io.BytesIO()
    np.savez(buf, **dict(art.arrays), extra=np.zeros(1))
    with pytest.raises(ArtifactCorrupt):
        decode(manifest, buf.getvalue())


def test_pickled_array_is_never_loaded() -> None:
    art = _artifact()
    doc = json.loads(encode(art)[0])
    doc["arrays"]["a"]["dtype"] = "|O"
    buf = io.BytesIO()
    np.savez(buf, a=np.array([{"boom": 1}, None, None], dtype=object), idx=art.arrays["idx"])
    with pytest.raises(ArtifactCorrupt):
        decode(json.dumps(doc).encode(), buf.getvalue())


def test_manifest_errors() -> None:
    _, npz = encode(_artifact())
    with pytest.raises(ArtifactCorrupt):
        decode(b"{not json", npz)
    with pytest.raises(ArtifactCorrupt):
        decode(b"[]", npz)
    doc = json.loads(encode(_artifact())[0])
    doc["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(IncompatibleArtifact, match="schema"):
        decode(json.dumps(doc).encode(), npz)


def _resealed(doc: dict[str, Any]) -> bytes:
    """The manifest ``doc`` with its content digest recomputed, as a careful forger would."""
    return json.dumps({**doc, "content_sha256": content_digest(doc)}).encode()


def test_manifest_shape_edit_is_refused() -> None:
    manifest, npz = encode(_artifact())
    doc = json.loads(manifest)
    doc["arrays"]["a"]["shape"] = [4, 3]
    with pytest.raises(ArtifactCorrupt, match="content_sha256"):
        decode(json.dumps(doc).encode(), npz)
    # Even with the digest recomputed, the arrays do not match what the manifest declares.
    with pytest.raises(ArtifactCorrupt, match="differs from the manifest"):
        decode(_resealed(doc), npz)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["model"].update(threshold=1e9),
        lambda d: d["metrics"].update(auroc=1.0),
        lambda d: d["encoder"].update(name="other"),
        lambda d: d.update(kb="another-kb"),
    ],
    ids=["threshold", "metrics", "encoder", "kb"],
)
def test_unsigned_manifest_edit_is_refused(edit: Callable[[dict[str, Any]], None]) -> None:
    manifest, npz = encode(_artifact(threshold=0.5))
    doc = json.loads(manifest)
    edit(doc)
    with pytest.raises(ArtifactCorrupt, match="does not match its content_sha256"):
        decode(json.dumps(doc).encode(), npz)
    decode(manifest, npz)  # the untouched one loads


def test_manifest_without_content_digest_is_refused() -> None:
    manifest, npz = encode(_artifact())
    doc = json.loads(manifest)
    del doc["content_sha256"]
    with pytest.raises(ArtifactCorrupt, match="no content_sha256"):
        decode(json.dumps(doc).encode(), npz)
    doc["content_sha256"] = "not-hex"
    with pytest.raises(ArtifactCorrupt, match="no content_sha256"):
        decode(json.dumps(doc).encode(), npz)


def test_publication_keys_leave_the_digest_and_version_alone() -> None:
    art = _artifact()
    stamped = {**art.manifest, "created_at": "2026-12-02T00:00:00Z", "version": art.version}
    assert content_digest(stamped) == art.manifest["content_sha256"]
    assert decode(json.dumps(stamped).encode(), encode(art)[1]).version == art.version
    assert art.signed(b"key").version == art.version


def test_signature() -> None:
    key = b"secret-key"
    manifest, npz = encode(_artifact().signed(key))
    decode(manifest, npz, hmac_key=key)
    with pytest.raises(SignatureInvalid):
        decode(manifest, npz, hmac_key=b"other-key")
    unsigned, _ = encode(_artifact())
    with pytest.raises(SignatureInvalid):
        decode(unsigned, npz, hmac_key=key)
    doc = json.loads(manifest)
    doc["metrics"]["auroc"] = 1.0
    with pytest.raises(SignatureInvalid):
        decode(json.dumps(doc).encode(), npz, hmac_key=key)


def test_encoder_check() -> None:
    manifest, npz = encode(_artifact())
    decode(manifest, npz, expected_encoder=ENC)
    with pytest.raises(IncompatibleArtifact):
        decode(manifest, npz, expected_encoder={"name": "enc", "dim": 8})


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFound):
        load_dir(tmp_path / "nope")


# -- the arrays file is checked against the manifest before numpy inflates it ------------


def _zip_of(members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def test_deflated_arrays_are_refused_before_inflating() -> None:
    # A zip bomb in miniature: 16 MB of zeros that deflate to about 16 kB, declared
    # honestly in the manifest so that only the compression gives it away.
    zeros = np.zeros(4 * 1024 * 1024, dtype=np.float32)
    art = build_artifact(kb="kb", encoder=ENC, model={}, arrays={"w": zeros})
    manifest, _ = encode(art)
    bomb = _zip_of({"w.npy": _npy(zeros)}, zipfile.ZIP_DEFLATED)
    del zeros, art
    assert len(bomb) < 100_000
    tracemalloc.start()  # numpy reports its buffers to tracemalloc too
    try:
        with pytest.raises(ArtifactCorrupt, match="compressed"):
            decode(manifest, bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024  # nowhere near the 16 MB it would inflate to


def test_member_larger_than_the_manifest_allows_is_refused() -> None:
    art = _artifact()
    manifest, _ = encode(art)
    big = np.zeros((300, 4), dtype=np.float32)  # the manifest says (3, 4)
    npz = _zip_of({"a.npy": _npy(big), "idx.npy": _npy(art.arrays["idx"])})
    with pytest.raises(ArtifactCorrupt, match="bytes"):
        decode(manifest, npz)


def test_npy_header_claiming_another_shape_is_refused() -> None:
    # Same byte count as the manifest implies, but the .npy header declares a huge
    # shape, which numpy would try to allocate before noticing the data is short.
    art = _artifact()
    manifest, _ = encode(art)
    honest = _npy(art.arrays["a"])
    lying = honest.replace(b"'shape': (3, 4)", b"'shape': (3000000000, 4)")
    lying = lying[: len(honest)]  # keep the size; the header padding absorbs the digits
    assert len(lying) == len(honest) and b"3000000000" in lying
    npz = _zip_of({"a.npy": lying, "idx.npy": _npy(art.arrays["idx"])})
    with pytest.raises(ArtifactCorrupt, match="header"):
        decode(manifest, npz)


def test_member_not_named_in_the_manifest_is_refused() -> None:
    art = _artifact()
    manifest, _ = encode(art)
    npz = _zip_of({"a.npy": _npy(art.arrays["a"]), "idx.txt": _npy(art.arrays["idx"])})
    with pytest.raises(ArtifactCorrupt, match="do not match"):
        decode(manifest, npz)
    twice = _zip_of({"a.npy": _npy(art.arrays["a"]), "idx.npy": _npy(art.arrays["idx"])})
    # A second member under an existing name (zipfile keeps only the last in its index).
    buf = io.BytesIO(twice)
    with zipfile.ZipFile(buf, "a") as zf, pytest.warns(UserWarning, match="Duplicate"):
        zf.writestr("a.npy", _npy(art.arrays["a"]))
    with pytest.raises(ArtifactCorrupt, match="do not match"):
        decode(manifest, buf.getvalue())


# -- malformed manifests are ArtifactCorrupt, never a TypeError or KeyError ----------------


Change = Callable[[dict[str, Any]], None]


def _edited(change: Change) -> tuple[bytes, bytes]:
    manifest, npz = encode(_artifact())
    doc = json.loads(manifest)
    change(doc)
    return json.dumps(doc).encode(), npz


def _set(path: str, value: object) -> Change:
    *parents, last = path.split(".")

    def change(doc: dict[str, Any]) -> None:
        for p in parents:
            doc = doc[p]
        doc[last] = value

    return change


def _drop(path: str) -> Change:
    *parents, last = path.split(".")

    def change(doc: dict[str, Any]) -> None:
        for p in parents:
            doc = doc[p]
        del doc[last]

    return change


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_set("arrays.a", 5), id="arrays.a=5"),
        pytest.param(_drop("arrays.a.dtype"), id="no-arrays.a.dtype"),
        pytest.param(_set("arrays.a.dtype", 4), id="arrays.a.dtype=4"),
        pytest.param(_set("arrays.a.dtype", "<f3"), id="arrays.a.dtype=<f3"),
        pytest.param(_set("arrays.a.dtype", "=f4"), id="arrays.a.dtype==f4"),
        pytest.param(_set("arrays.a.dtype", "|V8"), id="arrays.a.dtype=|V8"),
        pytest.param(_set("arrays.a.dtype", "<U0"), id="arrays.a.dtype=<U0"),  # 0 bytes, any shape
        pytest.param(_set("arrays.a.shape", "3x4"), id="arrays.a.shape=3x4"),
        pytest.param(_set("arrays.a.shape", [3, -4]), id="arrays.a.shape=[3, -4]"),
        pytest.param(_set("arrays.a.shape", [3, True]), id="arrays.a.shape=[3, True]"),
        pytest.param(_set("arrays.a.sha256", None), id="arrays.a.sha256=None"),
        pytest.param(_set("arrays.a.sha256", "xyz"), id="arrays.a.sha256=xyz"),
        pytest.param(_drop("kb"), id="no-kb"),
        pytest.param(_set("kb", ["kb"]), id="kb=[kb]"),
        pytest.param(_drop("encoder"), id="no-encoder"),
        pytest.param(_set("encoder.dim", "abc"), id="encoder.dim=abc"),
        pytest.param(_set("encoder.name", 7), id="encoder.name=7"),
        pytest.param(_set("model", "x"), id="model=x"),
        pytest.param(_set("signature", "é" * 64), id="signature=non-ascii"),
        pytest.param(_set("signature", 12), id="signature=12"),
        pytest.param(_set("kb", "\ud800"), id="kb=lone-surrogate"),
    ],
)
def test_malformed_manifest_is_corrupt(change: Change) -> None:
    manifest, npz = _edited(change)
    with pytest.raises(ArtifactCorrupt, match="manifest"):
        decode(manifest, npz)
    with pytest.raises(ArtifactCorrupt, match="manifest"):
        verify_manifest(manifest, expected_encoder=ENC)


def test_non_ascii_signature_with_a_key_is_corrupt_not_a_type_error() -> None:
    key = b"secret-key"
    manifest, npz = encode(_artifact().signed(key))
    doc = json.loads(manifest)
    doc["signature"] = "é" * 64
    with pytest.raises(ArtifactCorrupt, match="signature"):
        decode(json.dumps(doc).encode(), npz, hmac_key=key)


def test_deeply_nested_manifest_is_corrupt() -> None:
    _, npz = encode(_artifact())
    with pytest.raises(ArtifactCorrupt):
        decode(b"[" * 100_000, npz)


def test_boolean_schema_version_is_not_version_one() -> None:
    manifest, npz = _edited(_set("schema_version", True))
    with pytest.raises(IncompatibleArtifact, match="schema"):
        decode(manifest, npz)


def test_a_npy_in_front_of_the_archive_is_corrupt_not_a_type_error() -> None:
    # zipfile finds the archive after leading bytes, np.load reads the leading .npy
    manifest, npz = encode(_artifact())
    front = io.BytesIO()
    np.save(front, np.zeros(3))
    with pytest.raises(ArtifactCorrupt, match="not a zip archive"):
        decode(manifest, front.getvalue() + npz)

"""The artifact codec: manifest + npz, checksums, signature, no pickle."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from model_store import (
    SCHEMA_VERSION,
    ArtifactCorrupt,
    ArtifactNotFound,
    IncompatibleArtifact,
    SignatureInvalid,
    build_artifact,
    decode,
    encode,
    load_dir,
    save_dir,
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


def test_manifest_shape_edit_is_refused() -> None:
    manifest, npz = encode(_artifact())
    doc = json.loads(manifest)
    doc["arrays"]["a"]["shape"] = [4, 3]
    with pytest.raises(ArtifactCorrupt):
        decode(json.dumps(doc).encode(), npz)


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

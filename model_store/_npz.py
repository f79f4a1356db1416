"""Reading an artifact's ``.npz`` without trusting it.

``np.load`` inflates whatever an archive holds, and the manifest's per-array sha256 can
only be compared after that, so a small deflated archive could claim gigabytes of memory
before anything refused it. The codec writes uncompressed archives, which makes a much
stricter check possible first: every zip member must be stored (not compressed), named
after an array the already verified manifest lists, and exactly as large as that array's
dtype and shape plus a small ``.npy`` header, whose own dtype and shape must match too.
Only then does numpy read the bytes, with ``allow_pickle=False``; nothing it allocates can
then exceed what the manifest declares or what the archive physically holds.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Mapping
from typing import IO, Any

import numpy as np
import numpy.lib.format as npy

from model_store._errors import ArtifactCorrupt

# A .npy header that numpy writes is 128 bytes for ordinary arrays; a few kB leaves room
# for many dimensions and long dtype strings while keeping an archive's slack tiny.
NPY_HEADER_MAX = 4096
# Generous zip bookkeeping per member (local header, central entry, zip64 extras, data
# descriptor) and per archive (end records); used only to bound what a reader fetches.
_ZIP_MEMBER_OVERHEAD = 512
_ZIP_ARCHIVE_OVERHEAD = 1024
# Errors that zipfile and numpy raise for bytes that are not what they claim to be.
_READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError)


def member_name(array_name: str) -> str:
    """The zip member that ``np.savez`` writes for ``array_name``."""
    return f"{array_name}.npy"


def declared_nbytes(spec: Mapping[str, Any]) -> int:
    """Bytes of the data of one manifest ``arrays`` entry (dtype and shape already checked)."""
    return np.dtype(spec["dtype"]).itemsize * math.prod(spec["shape"])


def max_npz_bytes(declared: Mapping[str, Mapping[str, Any]]) -> int:
    """Upper bound on the size of an honest ``.npz`` holding the ``declared`` arrays."""
    return _ZIP_ARCHIVE_OVERHEAD + sum(
        declared_nbytes(spec) + NPY_HEADER_MAX + _ZIP_MEMBER_OVERHEAD + 2 * len(name.encode())
        for name, spec in declared.items()
    )


def read_arrays(data: bytes, declared: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Check the archive ``data`` against ``declared`` (a verified manifest's ``arrays``),
    then load it; raise :class:`ArtifactCorrupt` on any mismatch, before inflating anything.
    """
    # zipfile finds an archive after leading bytes; np.load goes by the first bytes and
    # would read a .npy put in front as the whole content.
    if not data.startswith(b"PK\x03\x04"):
        raise ArtifactCorrupt("arrays are not a zip archive from its first byte")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            _check_members(zf, declared, len(data))
    except _READ_ERRORS as exc:
        raise ArtifactCorrupt(f"arrays cannot be read: {exc}") from exc
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in declared}
    except (*_READ_ERRORS, KeyError) as exc:
        raise ArtifactCorrupt(f"arrays cannot be read: {exc}") from exc


def _check_members(
    zf: zipfile.ZipFile, declared: Mapping[str, Mapping[str, Any]], archive_bytes: int
) -> None:
    infos = zf.infolist()
    wanted = {member_name(name): name for name in declared}
    names = [info.filename for info in infos]
    # Duplicates matter: zipfile indexes only the last member of a name, np.load too.
    if len(names) != len(set(names)) or set(names) != set(wanted):
        raise ArtifactCorrupt(
            f"arrays {sorted(names)} do not match the manifest's {sorted(wanted)}"
        )
    stored = 0
    for info in infos:
        name = wanted[info.filename]
        if info.compress_type != zipfile.ZIP_STORED:
            raise ArtifactCorrupt(
                f"array {name!r} is compressed; artifacts are written uncompressed"
            )
        if info.flag_bits & 0x1:
            raise ArtifactCorrupt(f"array {name!r} is encrypted")
        nbytes = declared_nbytes(declared[name])
        slack = info.file_size - nbytes
        if info.compress_size != info.file_size or not 0 <= slack <= NPY_HEADER_MAX:
            raise ArtifactCorrupt(
                f"array {name!r} takes {info.file_size} bytes in the archive; "
                f"the manifest implies {nbytes} plus a header"
            )
        stored += info.compress_size
    # Stored members cannot together hold more than the archive unless they overlap.
    if stored > archive_bytes:
        raise ArtifactCorrupt(f"archive members claim {stored} bytes of a {archive_bytes}")
    for info in infos:
        name = wanted[info.filename]
        with zf.open(info) as f:
            _check_header(f, name, declared[name], info.file_size)


def _check_header(f: IO[bytes], name: str, spec: Mapping[str, Any], file_size: int) -> None:
    # numpy allocates the array its header describes before reading the data, so the
    # header must agree with the manifest, not merely the member's size.
    version = npy.read_magic(f)
    if version == (1, 0):
        shape, _fortran, dtype = npy.read_array_header_1_0(f, max_header_size=NPY_HEADER_MAX)
    elif version == (2, 0):
        shape, _fortran, dtype = npy.read_array_header_2_0(f, max_header_size=NPY_HEADER_MAX)
    else:
        raise ArtifactCorrupt(f"array {name!r} has an unsupported .npy version {version}")
    if (
        dtype.str != spec["dtype"]
        or list(shape) != list(spec["shape"])
        or f.tell() + declared_nbytes(spec) != file_size
    ):
        raise ArtifactCorrupt(f"array {name!r}: its .npy header differs from the manifest")

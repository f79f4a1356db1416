"""Input files a user names: a device, a directory or a socket is refused in one line
before anything reads it; a pipe is read as a file where the reader can take one."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from sidecar._input_files import input_file
from sidecar.cli import main
from sidecar.errors import DataError
from sidecar.training import read_kb
from sidecar.training._train_inputs import load_npy


def test_a_regular_file_and_a_pipe_are_accepted(tmp_path: Path) -> None:
    f = tmp_path / "f.jsonl"
    f.write_text("{}\n")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert input_file(f, "a file", missing="gone") == f
    assert input_file(str(fifo), "a file", missing="gone") == fifo


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: Path("/dev/zero"), "device"),
        (lambda p: p, "directory"),
        (lambda p: (os.mkfifo(p / "pipe"), p / "pipe")[1], "pipe"),
    ],
)
def test_what_cannot_be_read_as_a_file_is_named(
    tmp_path: Path, make: Callable[[Path], Path], kind: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(DataError, match=rf"^{path} is a {kind}, expected a thing$"):
        input_file(path, "a thing", missing="gone", pipes=False)


def test_a_socket_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(DataError, match="is a socket, expected"):
            input_file(path, "a file", missing="gone")


def test_nothing_there_gives_the_callers_message(tmp_path: Path) -> None:
    for path in (tmp_path / "none", tmp_path / "none" / "deeper"):
        with pytest.raises(DataError, match=r"^gone$"):
            input_file(path, "a file", missing="gone")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match=r"^gone$"):  # a file where a folder should be
        input_file(tmp_path / "file" / "x", "a file", missing="gone")


def test_a_kb_through_a_pipe_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "kb"
    os.mkfifo(fifo)

    def write() -> None:  # the writer, as the shell's process substitution would be
        with open(fifo, "w") as fh:
            fh.write('{"id": "a", "text": "opening hours"}\n')

    writer = threading.Thread(target=write)
    writer.start()
    try:
        docs = read_kb(fifo)
    finally:
        writer.join(timeout=30)
    assert [(d.id, d.text) for d in docs] == [("a", "opening hours")]


def test_embeddings_must_be_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "e.npy"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"is a pipe, expected a \.npy file \(KB embeddings\)"):
        load_npy(fifo, "KB embeddings")
    real = tmp_path / "r.npy"
    np.save(real, np.ones((2, 3), dtype=np.float32))
    assert load_npy(real, "KB embeddings").shape == (2, 3)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "--kb", "/dev/zero", "--id-queries", "/dev/zero", "--out", "o"], "a JSONL"),
        (["eval-report", "/dev/zero"], "a `sidecar eval` JSON file"),
        (["explain", "-q", "q", "-p", "contains:x", "--sources", "/dev/zero"], "sources"),
    ],
)
def test_a_device_on_the_command_line_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
    args: list[str],
    words: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_error_line(CliRunner().invoke(main, args))
    assert "/dev/zero is a device, expected" in line and words in line, line

"""The `read-file` and `write-file` nodes: round trips, JSON content, append, atomic replace."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import scheduler
from worker.nodes import files
from worker.nodes.files import ReadFileNode, WriteFileNode


def run(cls: type, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    node = cls()
    node.params = params
    store: dict[str, Any] = {}
    return node._run(store), store


def test_write_then_read_round_trip(tmp_path: Path) -> None:
    target = tmp_path / "note.txt"
    action, out = run(WriteFileNode, {"path": str(target), "content": "héllo\r\nwörld"})
    assert action == "default"
    assert out == {"path": str(target), "bytes": len("héllo\r\nwörld".encode())}
    action, out = run(ReadFileNode, {"path": str(target)})
    assert action == "default"
    assert out == {"content": "héllo\r\nwörld", "path": str(target)}  # newlines kept verbatim


def test_write_creates_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.txt"
    run(WriteFileNode, {"path": str(target), "content": "deep"})
    assert target.read_text() == "deep"


def test_non_string_content_is_written_as_json(tmp_path: Path) -> None:
    target = tmp_path / "data.json"
    content = {"a": [1, 2], "name": "zoë", "ok": True}
    run(WriteFileNode, {"path": str(target), "content": content})
    assert json.loads(target.read_text(encoding="utf-8")) == content


def test_append(tmp_path: Path) -> None:
    target = tmp_path / "log.txt"
    run(WriteFileNode, {"path": str(target), "content": "a\n"})
    _, out = run(WriteFileNode, {"path": str(target), "content": "bb\n", "append": True})
    run(WriteFileNode, {"path": str(target), "content": "c\n", "append": True})
    assert out["bytes"] == 3
    assert target.read_text() == "a\nbb\nc\n"


def test_replace_is_atomic_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "x.txt"
    target.write_text("old")
    target.chmod(0o600)
    run(WriteFileNode, {"path": str(target), "content": "new"})
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["x.txt"]  # no temp file left behind


def test_failed_replace_leaves_the_old_file_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "x.txt"
    target.write_text("old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        run(WriteFileNode, {"path": str(target), "content": "new"})
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.txt"]


def test_encodings(tmp_path: Path) -> None:
    target = tmp_path / "latin.txt"
    _, out = run(WriteFileNode, {"path": str(target), "content": "café", "encoding": "latin-1"})
    assert target.read_bytes() == b"caf\xe9"
    assert out["bytes"] == 4
    _, out = run(ReadFileNode, {"path": str(target), "encoding": "latin-1"})
    assert out["content"] == "café"


def test_content_not_encodable_is_a_value_error_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "x.txt"
    with pytest.raises(ValueError, match="write-file: param 'content'"):
        run(WriteFileNode, {"path": str(target), "content": "café", "encoding": "ascii"})
    assert not target.exists()


def test_relative_paths_are_written_back_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _, out = run(WriteFileNode, {"path": "rel.txt", "content": "r"})
    assert out["path"] == str(tmp_path / "rel.txt")
    _, out = run(ReadFileNode, {"path": "rel.txt"})
    assert out["path"] == str(tmp_path / "rel.txt")


def test_read_missing_file_raises_with_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=r"read-file: no such file: .*nope\.txt"):
        run(ReadFileNode, {"path": str(missing)})


@pytest.mark.parametrize(
    ("cls", "params", "message"),
    [
        (ReadFileNode, {}, "read-file: param 'path' is required"),
        (ReadFileNode, {"path": 3}, "read-file: param 'path' must be a string"),
        (ReadFileNode, {"path": "x", "encoding": "klingon"}, "read-file: param 'encoding' is not a known"),
        (WriteFileNode, {"content": "x"}, "write-file: param 'path' is required"),
        (WriteFileNode, {"path": "x"}, "write-file: param 'content' is required"),
        (WriteFileNode, {"path": "x", "content": "x", "append": "yes"}, "write-file: param 'append' must be"),
        (WriteFileNode, {"path": "x", "content": "x", "encoding": 8}, "write-file: param 'encoding' must be"),
    ],
)
def test_bad_params_raise_value_error(cls: type, params: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        run(cls, params)
    assert os.listdir(tmp_path) == []


def test_end_to_end_write_then_read(tmp_path: Path) -> None:
    workflow = {
        "nodes": [
            {"id": "w", "type": "write-file", "params": {"path": "${dir}/out/report.json", "content": "${data}"}},
            {"id": "r", "type": "read-file", "params": {"path": "${w.path}"}},
        ]
    }
    data = {"rows": [1, 2, 3]}
    result = scheduler.run(workflow, {"dir": str(tmp_path), "data": data})
    assert result.status == "success"
    assert result.shared["w"]["path"] == str(tmp_path / "out" / "report.json")
    assert json.loads(result.shared["r"]["content"]) == data


def test_end_to_end_missing_file_propagates(tmp_path: Path) -> None:
    workflow = {"nodes": [{"id": "r", "type": "read-file", "params": {"path": str(tmp_path / "gone.txt")}}]}
    with pytest.raises(FileNotFoundError, match=r"gone\.txt"):
        scheduler.run(workflow)

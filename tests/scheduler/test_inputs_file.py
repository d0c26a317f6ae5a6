"""`--inputs-file` for cluster runs: JSON read as a stream straight into the store's codec bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ir import snapshot
from ir.errors import ValidationError
from ir.limits import MAX_DEPTH
from scheduler.inputs_file import read_encoded


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "inputs.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    "inputs",
    [
        {},
        {"items": list(range(1000)), "name": "é ☃", "flag": True, "none": None, "ratio": 0.1},
        {"nested": {"a": [1, {"b": [], "c": {}}, [[2.5, "x"]]], "": -7}, "empty": []},
        {"edges": [-(2**63), 2**64 - 1, 1e300]},
        {"huge": 2**70, "also": [1, 2**80]},  # beyond 64 bits: the stream parser refuses, the slow path encodes
    ],
)
def test_each_top_level_value_decodes_to_what_json_loads_gives(tmp_path: Path, inputs: dict[str, Any]) -> None:
    encoded = read_encoded(write(tmp_path, json.dumps(inputs)))
    assert {key: snapshot.decode(value) for key, value in encoded.items()} == inputs


def test_nesting_at_the_limit_passes_and_one_more_level_is_one_clear_error(tmp_path: Path) -> None:
    inner = MAX_DEPTH  # each value may nest as deep as an --input value
    ok = read_encoded(write(tmp_path, '{"a": ' + "[" * inner + "]" * inner + "}"))
    assert list(ok) == ["a"]
    with pytest.raises(ValidationError, match=rf"inputs.json: nested deeper than {MAX_DEPTH} levels"):
        read_encoded(write(tmp_path, '{"a": ' + "[" * (inner + 1) + "]" * (inner + 1) + "}"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a JSON object, got list"),
        ('"x"', "expected a JSON object, got str"),
        ('{"a": 1,\n "b": }', "invalid JSON at line 2, column 7: Expecting value"),
        ('{"a": 1} trailing', "invalid JSON at line 1, column 10: Extra data"),
        ("", "invalid JSON at line 1, column 1: Expecting value"),
        ('{"n": ' + "9" * 5000 + "}", "Exceeds the limit (4300 digits)"),
        (b'{"a": "\xff"}', "not UTF-8 text"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, text: str | bytes, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        read_encoded(write(tmp_path, text))
    assert str(caught.value).startswith(f"--inputs-file {tmp_path / 'inputs.json'}: ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"--inputs-file .*nope.json: file not found"):
        read_encoded(tmp_path / "nope.json")

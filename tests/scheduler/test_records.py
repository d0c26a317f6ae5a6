"""Dataset-job record files (`--items FILE`): jsonl, csv and json read lazily, bad records named by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from itertools import count, islice
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ir.errors import ValidationError
from ir.limits import MAX_DEPTH
from scheduler import records
from scheduler.records import BadRecord, read_records, record_format, windows

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files are named relative to the working directory, as a user gives them."""
    monkeypatch.chdir(tmp_path)


def write(name: str, content: str | bytes) -> str:
    Path(name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return name


def error_of(source: Any, fmt: str | None = None, *, skip_bad: bool = False, **cap: int) -> str:
    with pytest.raises(ValidationError) as caught:
        list(read_records(source, fmt, skip_bad=skip_bad, **cap))
    message = str(caught.value)
    assert "\n" not in message  # every problem is one line
    return message


def jsonl(values: list[Any]) -> str:
    return "".join(json.dumps(value) + "\n" for value in values)


# --- the format ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a.jsonl", "jsonl"), ("a.ndjson", "jsonl"), ("A.JSONL", "jsonl"), ("d/a.csv", "csv"), ("a.json", "json")],
)
def test_the_format_is_told_by_the_extension(name: str, expected: str) -> None:
    assert record_format(name) == expected
    assert record_format(Path(name)) == expected


def test_an_explicit_format_wins_over_the_extension_and_is_checked() -> None:
    assert record_format("items.txt", "csv") == "csv"
    assert record_format("items.json", "jsonl") == "jsonl"
    assert record_format("items.json", "JSONL") == "jsonl"
    with pytest.raises(ValidationError, match=r"^--format 'xml': unknown record format \(use jsonl, csv or json\)$"):
        record_format("items.json", "xml")


def test_an_unknown_extension_names_the_file_and_the_format_option() -> None:
    for name in ("items.txt", "items", "data/items.json.gz"):
        with pytest.raises(ValidationError) as caught:
            record_format(name)
        assert str(caught.value).startswith(f"{name}: cannot tell the record format")
        assert "--format jsonl, csv or json" in str(caught.value)


def test_read_records_uses_the_explicit_format() -> None:
    write("items.txt", "1\n2\n")
    assert list(read_records("items.txt", "jsonl")) == [1, 2]
    assert "cannot tell the record format" in error_of("items.txt")


# --- jsonl -----------------------------------------------------------------------------------------------


def test_jsonl_gives_every_json_value_in_file_order() -> None:
    values = [{"id": 1, "name": "é ☃"}, [1, 2.5], "text", 7, -0.25, None, True, {"big": 2**80, "neg": -(2**70)}]
    write("items.jsonl", jsonl(values))
    assert list(read_records("items.jsonl")) == values
    got = list(read_records(Path("items.jsonl")))
    assert [type(v) for v in got] == [type(v) for v in values]  # 7 stays an int, -0.25 a float


@pytest.mark.parametrize("cap", [records.MAX_RECORD_BYTES, records.CHUNK_BYTES + 100, 700])
def test_jsonl_lines_cut_by_the_reads_blocks_are_whole_records_and_a_long_one_over_the_cap_is_bad(cap: int) -> None:
    """The reader takes CHUNK_BYTES at a time: lines of every length across its block boundaries read as the
    records they are, each with its line number; a line over the cap is a bad record wherever it falls."""
    values: list[Any] = []
    for i in range(3000):  # short and long lines, some crossing a block boundary, one longer than a block
        values.append({"i": i, "pad": "x" * (i % 97 if i % 500 else 5 * i if i < 2500 else 600)})
    values.insert(1500, {"long": "y" * (records.CHUNK_BYTES + 10)})
    write("items.jsonl", jsonl(values) + '{"last": "no line break"}')
    values.append({"last": "no line break"})
    got = list(read_records("items.jsonl", skip_bad=True, max_record_bytes=cap))
    sizes = [len(json.dumps(value)) for value in values]
    assert len(got) == len(values)
    for line, (value, size, record) in enumerate(zip(values, sizes, got, strict=True), 1):
        if size > cap:
            assert record == BadRecord(
                line, f"items.jsonl line {line}: record is {size} bytes, over --max-record-bytes {cap}"
            )
        else:
            assert record == value


def test_jsonl_blank_lines_at_the_end_are_not_records() -> None:
    write("items.jsonl", '{"a": 1}\n{"a": 2}\r\n{"a": 3}\n\n  \n\t\r\n')
    assert list(read_records("items.jsonl")) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_a_blank_jsonl_line_between_records_is_refused_or_a_failed_record_keeping_index_and_line_together() -> None:
    """A record's index is always its line less one: a blank line is named by its line, never skipped."""
    write("items.jsonl", '{"a": 1}\n\n   \r\n{"a": 2}\n{"a": 3}')  # the last line has no newline
    assert error_of("items.jsonl") == "items.jsonl line 2: a blank line, expected one JSON value per line"
    got = list(read_records("items.jsonl", skip_bad=True))
    assert got == [
        {"a": 1},
        BadRecord(2, "items.jsonl line 2: a blank line, expected one JSON value per line"),
        BadRecord(3, "items.jsonl line 3: a blank line, expected one JSON value per line"),
        {"a": 2},
        {"a": 3},
    ]


def test_a_jsonl_line_that_is_not_json_is_named_by_its_line() -> None:
    lines = [json.dumps({"id": i}) for i in range(1, 57)]  # lines 1 to 56
    lines.append('{"id": 123 "x": 1}')  # line 57
    write("items.jsonl", "\n".join(lines) + "\n")
    assert error_of("items.jsonl") == "items.jsonl line 57: not JSON (Expecting ',' delimiter, column 12)"


def test_skip_bad_yields_a_bad_record_in_place_so_later_indexes_stay_positions() -> None:
    write("items.jsonl", '{"i": 0}\n{"i": 1}\n{"i": \n{"i": 3}\n[1, 2\n{"i": 5}\n')
    got = list(read_records("items.jsonl", skip_bad=True))
    assert len(got) == 6
    assert got[0] == {"i": 0} and got[1] == {"i": 1} and got[3] == {"i": 3} and got[5] == {"i": 5}
    assert got[2] == BadRecord(3, "items.jsonl line 3: not JSON (Expecting value, column 7)")
    assert isinstance(got[4], BadRecord) and got[4].line == 5
    assert got[4].error.startswith("items.jsonl line 5: not JSON (")


def test_without_skip_bad_the_good_records_before_a_bad_one_are_given_first() -> None:
    write("items.jsonl", "1\n2\nnope\n4\n")
    reader = read_records("items.jsonl")
    assert next(reader) == 1 and next(reader) == 2  # lazy: the bad line is not reached yet
    with pytest.raises(ValidationError, match=r"^items\.jsonl line 3: not JSON \(Expecting value, column 1\)$"):
        next(reader)


def test_a_jsonl_line_that_is_not_utf8_is_named_by_its_line() -> None:
    write("items.jsonl", b'"ok"\n"caf\xe9"\n"ok"\n')
    assert error_of("items.jsonl") == "items.jsonl line 2: not UTF-8 (byte 0xe9 at column 5)"
    got = list(read_records("items.jsonl", skip_bad=True))
    assert got[0] == "ok" and got[2] == "ok" and got[1].line == 2


def test_jsonl_allows_a_byte_order_mark_and_big_integers() -> None:
    write("items.jsonl", b'\xef\xbb\xbf{"n": 123456789012345678901234567890}\n[-18446744073709551617]\n')
    assert list(read_records("items.jsonl")) == [{"n": 123456789012345678901234567890}, [-18446744073709551617]]


def test_a_jsonl_record_nested_too_deep_is_a_bad_record_not_a_recursion_error() -> None:
    ok, deep, huge = MAX_DEPTH, MAX_DEPTH + 1, 100_000
    write("items.jsonl", "[" * ok + "]" * ok + "\n" + "[" * deep + "]" * deep + "\n" + "{" * huge + "\n1\n")
    assert error_of("items.jsonl") == f"items.jsonl line 2: nested deeper than {MAX_DEPTH} levels"
    got = list(read_records("items.jsonl", skip_bad=True))
    assert [type(r) for r in got] == [list, BadRecord, BadRecord, int]
    assert [got[1].line, got[2].line] == [2, 3]


def test_a_line_separator_inside_a_jsonl_string_does_not_split_the_record() -> None:
    write("items.jsonl", json.dumps({"t": "a\u2028b\x85c"}, ensure_ascii=False) + "\n2\n")
    assert list(read_records("items.jsonl")) == [{"t": "a\u2028b\x85c"}, 2]


# --- csv -------------------------------------------------------------------------------------------------


def test_csv_rows_become_dicts_of_strings_keyed_by_the_header() -> None:
    write("items.csv", 'id,name,score\n1,Ann,0.5\n2,"Bob, Jr.",\n\n3,"say ""hi""",7\n')
    assert list(read_records("items.csv")) == [
        {"id": "1", "name": "Ann", "score": "0.5"},
        {"id": "2", "name": "Bob, Jr.", "score": ""},
        {"id": "3", "name": 'say "hi"', "score": "7"},
    ]


def test_a_csv_row_with_the_wrong_number_of_fields_is_a_bad_record() -> None:
    write("items.csv", "a,b,c\n1,2,3\n" + "\n" * 9 + "1,2,3,4\n5\n6,7,8\n")
    assert error_of("items.csv") == "items.csv line 12: 4 fields, the header has 3"
    got = list(read_records("items.csv", skip_bad=True))
    assert got == [
        {"a": "1", "b": "2", "c": "3"},
        BadRecord(12, "items.csv line 12: 4 fields, the header has 3"),
        BadRecord(13, "items.csv line 13: 1 field, the header has 3"),
        {"a": "6", "b": "7", "c": "8"},
    ]


def test_a_quoted_csv_field_may_hold_newlines_and_lines_are_counted_from_where_a_record_starts() -> None:
    write("items.csv", 'id,text\n1,"one\ntwo\r\nthree"\n2,plain\n3,"x\ny",extra\n4,"last"\n')
    got = list(read_records("items.csv", skip_bad=True))
    assert got[0] == {"id": "1", "text": "one\ntwo\r\nthree"}
    assert got[1] == {"id": "2", "text": "plain"}
    assert got[2] == BadRecord(6, "items.csv line 6: 3 fields, the header has 2")
    assert got[3] == {"id": "4", "text": "last"}


def test_a_csv_header_may_span_lines_and_carriage_returns_end_lines() -> None:
    write("items.csv", 'id,"long\nname"\r1,2\r\r3,4\r')
    assert list(read_records("items.csv")) == [{"id": "1", "long\nname": "2"}, {"id": "3", "long\nname": "4"}]


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ("id,,name", "items.csv line 1, column 2: empty header name"),
        ("id,name, ", "items.csv line 1, column 3: empty header name"),
        ("id,name,id", "items.csv line 1, column 3: header name 'id' repeats column 1"),
    ],
)
def test_a_bad_csv_header_names_the_file_line_and_column(header: str, problem: str) -> None:
    write("items.csv", header + "\n1,2,3\n")
    assert error_of("items.csv") == problem
    assert error_of("items.csv", skip_bad=True) == problem  # no record can be read without a header


def test_csv_blank_lines_before_the_header_are_skipped() -> None:
    write("items.csv", "\n\nid\n1\n")
    assert list(read_records("items.csv")) == [{"id": "1"}]
    write("items.csv", "\n\nid,id\n")
    assert error_of("items.csv") == "items.csv line 3, column 2: header name 'id' repeats column 1"


def test_a_csv_quote_never_closed_is_a_bad_record_where_it_starts() -> None:
    write("items.csv", 'id,text\n1,ok\n2,"never closed\n3,ok\n')
    assert error_of("items.csv") == "items.csv line 3: not CSV (unexpected end of data)"
    assert next(read_records("items.csv", skip_bad=True)) == {"id": "1", "text": "ok"}


def test_a_csv_line_that_is_not_utf8_is_named_by_its_line_and_a_byte_order_mark_is_dropped() -> None:
    write("items.csv", b"\xef\xbb\xbfid,name\n1,caf\xe9\n2,ok\n")
    assert error_of("items.csv") == "items.csv line 2: not UTF-8 (byte 0xe9 at column 6)"
    got = list(read_records("items.csv", skip_bad=True))
    assert got == [BadRecord(2, "items.csv line 2: not UTF-8 (byte 0xe9 at column 6)"), {"id": "2", "name": "ok"}]


def test_a_csv_file_without_rows_has_no_records() -> None:
    write("items.csv", "")
    assert list(read_records("items.csv")) == []
    write("items.csv", "id,name\n")
    assert list(read_records("items.csv")) == []


# --- json ------------------------------------------------------------------------------------------------


def test_json_gives_the_arrays_items_in_order() -> None:
    values = [{"id": 1, "tags": ["a"]}, 2, 2.5, "x", None, False, [], {"nested": {"deep": [1, {"x": -3}]}}]
    write("items.json", json.dumps(values, indent=2))
    got = list(read_records("items.json"))
    assert got == values
    assert type(got[1]) is int and type(got[2]) is float  # never Decimal
    write("items.json", " \n[]\n")
    assert list(read_records("items.json")) == []


def test_json_integers_beyond_64_bits_are_read_exactly_after_many_records() -> None:
    values = [{"id": i, "pad": "x" * 50} for i in range(5000)] + [{"big": 2**64}, -(2**100), 3]  # past a chunk
    write("items.json", json.dumps(values))
    assert list(read_records("items.json")) == values


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        *[('{"a": 1}', "object"), ('"x"', "string"), ("12", "number"), ("-1", "number"), ("true", "boolean")],
        *[("null", "null"), ("", "an empty file"), (" \n\t", "an empty file"), ("\ufeff", "an empty file")],
    ],
)
def test_json_that_is_not_an_array_is_one_clear_error(content: str, kind: str) -> None:
    write("items.json", content)
    assert error_of("items.json") == f"items.json: expected a JSON array of records, got {kind}"


def test_invalid_json_is_named_by_line_even_far_into_the_file() -> None:
    lines = ["["] + [json.dumps({"id": i, "pad": "y" * 40}) + "," for i in range(1, 5000)]
    lines[4321] = '{"id": 4321 "pad": 1},'  # line 4322, well past the first chunks
    write("items.json", "\n".join(lines) + "\n1]\n")
    assert Path("items.json").stat().st_size > 4 * records.CHUNK_BYTES
    message = error_of("items.json")
    assert message.startswith("items.json line 4322, column ")
    assert message.endswith(": invalid JSON (after key and value, inside map, I expect ',' or '}')")


def test_json_errors_name_the_line_with_a_short_reason() -> None:
    write("items.json", '[\n  {"a": 1},\n  {"a": 2}\n  {"a": 3}\n]')
    assert (
        error_of("items.json") == "items.json line 4, column 3: invalid JSON (after array element, I expect ',' or ']')"
    )
    write("items.json", "[1, 2]\n[3]\n")
    assert error_of("items.json") == "items.json line 2, column 1: invalid JSON (trailing garbage)"
    write("items.json", b'[\n"caf\xe9"]')
    assert error_of("items.json").startswith("items.json line 2, column ")
    write("items.json", '[{"a": 1},\n {"a": 2}\n')
    assert error_of("items.json") == "items.json: invalid JSON: the file ends inside the array"


def test_skip_bad_cannot_skip_a_json_syntax_error() -> None:
    write("items.json", '[{"a": 1}, {"a" 2}, {"a": 3}]')
    assert "invalid JSON" in error_of("items.json", skip_bad=True)
    reader = read_records("items.json", skip_bad=True)
    assert next(reader) == {"a": 1}
    with pytest.raises(ValidationError):
        next(reader)


def test_a_json_record_nested_too_deep_is_refused_without_building_it() -> None:
    ok = MAX_DEPTH
    write("items.json", "[1,\n" + "[" * ok + "]" * ok + "]")
    assert list(read_records("items.json")) == [1, nest([], ok - 1)]
    write("items.json", "[1,\n " + "[" * (ok + 1) + "]" * (ok + 1) + "]")
    assert error_of("items.json") == f"items.json line 2, column {ok + 2}: a record nested deeper than {ok} levels"
    # a few hundred KB of brackets: ijson's C parser alone would take gigabytes (memory grows with depth^2)
    write("items.json", "[" + "[" * 300_000 + "]" * 300_000 + "]")
    assert error_of("items.json") == f"items.json line 1, column {ok + 2}: a record nested deeper than {ok} levels"


# The nesting check follows strings and escapes across chunk boundaries: tried with tiny chunks.
TRICKY_TEXT = st.text(alphabet='[]{}"\\x\n\u00e9,', max_size=12)
TRICKY_VALUE = st.recursive(
    st.none() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=12,
)


def nest(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(TRICKY_VALUE, max_size=4), chunk=st.integers(1, 9), indent=st.sampled_from([None, 0]))
def test_json_nesting_check_is_exact_across_chunk_boundaries(
    values: list[Any], chunk: int, indent: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "CHUNK_BYTES", chunk)
    at_limit = [nest(v, MAX_DEPTH - depth_of(v)) for v in values]  # each record exactly MAX_DEPTH deep
    write("items.json", json.dumps(at_limit, indent=indent, ensure_ascii=False))
    assert list(read_records("items.json")) == at_limit
    if values:
        too_deep = [*at_limit[:-1], [at_limit[-1]]]
        write("items.json", json.dumps(too_deep, indent=indent, ensure_ascii=False))
        assert error_of("items.json").endswith(f": a record nested deeper than {MAX_DEPTH} levels")


# --- memory stays flat -----------------------------------------------------------------------------------

MEASURE = """
import resource, sys
from scheduler.records import read_records
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
seen = sum(1 for _ in read_records(sys.argv[1]))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(seen, grown * 1024)  # ru_maxrss is in KiB on Linux
"""


def write_big(name: str, target_bytes: int) -> int:
    """A file of about `target_bytes` of records; returns how many records."""
    fmt = record_format(name)
    with open(name, "wb") as f:
        written = f.write({"jsonl": b"", "json": b"[\n", "csv": b"id,text,score\n"}[fmt])
        for number in count():
            if written >= target_bytes:
                break
            text = f"record {number} " + "é" * 40 + "x" * 150
            if fmt == "csv":
                line = f'{number},"{text}",{number / 2}\n'
            else:
                line = json.dumps({"id": number, "text": text, "score": number / 2, "tags": ["a", "b"]}) + "\n"
                line = ("," if fmt == "json" and number else "") + line
            written += f.write(line.encode())
        f.write(b"]\n" if fmt == "json" else b"")
    return number


@pytest.mark.parametrize("name", ["big.jsonl", "big.json", "big.csv"])
@pytest.mark.processes
def test_memory_stays_flat_as_the_file_grows(name: str) -> None:
    size = 50 * 1024 * 1024
    expected = write_big(name, size)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, name], capture_output=True, text=True, env=env, check=True, timeout=240
    ).stdout.split()
    seen, grown = int(out[0]), int(out[1])
    assert seen == expected
    # holding the records would take several times the file's size; one record at a time takes a buffer
    assert grown < size / 10, f"peak RSS grew by {grown / 2**20:.1f} MiB reading a {size / 2**20:.0f} MiB file"


# --- records over the cap (--max-record-bytes) -------------------------------------------------------------


def write_long_line(name: str, number: int, size: int, *, before: str = "", after: str = "") -> None:
    """A file whose line `number` is one JSON string of exactly `size` bytes, written a MiB at a time."""
    lines = before or "".join(json.dumps({"i": i}) + "\n" for i in range(number - 1))
    with open(name, "w") as f:
        f.write(lines + '"')
        left = size - 2
        while left:
            left -= f.write("x" * min(left, 1 << 20))
        f.write('"\n' + (after or json.dumps({"i": number}) + "\n"))


def test_a_jsonl_line_over_the_default_cap_is_one_error_naming_file_line_and_size() -> None:
    write_long_line("items.jsonl", 3, 20 * 1024 * 1024)
    assert records.MAX_RECORD_BYTES == 16 * 1024 * 1024
    assert error_of("items.jsonl") == "items.jsonl line 3: record is 20971520 bytes, over --max-record-bytes 16777216"
    got = list(read_records("items.jsonl", skip_bad=True))
    assert got[:2] == [{"i": 0}, {"i": 1}] and got[3] == {"i": 3}
    assert got[2] == BadRecord(3, "items.jsonl line 3: record is 20971520 bytes, over --max-record-bytes 16777216")


def test_a_record_of_exactly_the_cap_is_read_and_one_byte_more_is_a_bad_record() -> None:
    write("items.jsonl", '"' + "a" * 998 + '"\n' + '"' + "b" * 999 + '"\n{"c": 3}\r\n"' + "d" * 998 + '"')
    got = list(read_records("items.jsonl", skip_bad=True, max_record_bytes=1000))
    assert got[0] == "a" * 998 and got[2] == {"c": 3} and got[3] == "d" * 998
    assert got[1] == BadRecord(2, "items.jsonl line 2: record is 1001 bytes, over --max-record-bytes 1000")
    assert error_of("items.jsonl", max_record_bytes=1000).startswith("items.jsonl line 2: record is 1001 bytes")
    assert error_of("items.jsonl", max_record_bytes=0) == "--max-record-bytes: must be 1 or more, got 0"


def test_a_csv_row_over_the_cap_is_a_bad_record_and_a_long_field_under_it_is_read() -> None:
    long = "é" * 100_000  # 200,000 bytes: over csv's own default field limit (131,072), under the cap
    write("items.csv", f'id,text\n1,{long}\n2,"{"y" * 1500}"\r\n3,"two\nlines"\n4,ok\n')
    assert list(read_records("items.csv")) == [
        {"id": "1", "text": long}, {"id": "2", "text": "y" * 1500}, {"id": "3", "text": "two\nlines"},
        {"id": "4", "text": "ok"},
    ]  # fmt: skip
    got = list(read_records("items.csv", skip_bad=True, max_record_bytes=1000))
    assert got[0] == BadRecord(2, "items.csv line 2: record is 200002 bytes, over --max-record-bytes 1000")
    assert got[1] == BadRecord(3, "items.csv line 3: record is 1504 bytes, over --max-record-bytes 1000")
    assert got[2:] == [{"id": "3", "text": "two\nlines"}, {"id": "4", "text": "ok"}]  # line numbers still right
    with pytest.raises(ValidationError, match=r"^items\.csv line 1: record is 1007 bytes"):
        write("items.csv", "h" * 1007 + "\n1\n")
        list(read_records("items.csv", skip_bad=True, max_record_bytes=1000))  # a header over the cap: the file


def test_a_json_item_over_the_cap_is_a_bad_record_and_one_too_large_to_parse_stops_the_file() -> None:
    write("items.json", json.dumps([1, "x" * 1500, {"c": 3}]))
    got = list(read_records("items.json", skip_bad=True, max_record_bytes=1000))
    assert got[0] == 1 and got[2] == {"c": 3}
    assert got[1] == BadRecord(
        1, "items.json after line 1, column 1: record 1 is 1502 bytes, over --max-record-bytes 1000"
    )
    assert error_of("items.json", max_record_bytes=1000).endswith(
        "record 1 is 1502 bytes, over --max-record-bytes 1000"
    )
    write("items.json", json.dumps([1, "x" * (records.CHUNK_BYTES * 4), 3]))  # the parser would have to hold it
    message = error_of("items.json", skip_bad=True, max_record_bytes=1000)
    assert message.startswith("items.json after line 1, column ") and "over --max-record-bytes 1000" in message
    assert message.endswith("(a json file stops there)")


LONG_LINE = """
import resource, sys
from scheduler.records import read_records
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
got = list(read_records(sys.argv[1], skip_bad=True))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(got[0], got[2], got[1].error, grown * 1024)  # ru_maxrss is in KiB on Linux
"""


@pytest.mark.processes
def test_skipping_a_200_mb_line_holds_at_most_the_cap_of_it() -> None:
    write_long_line("items.jsonl", 2, 200 * 1024 * 1024)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", LONG_LINE, "items.jsonl"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=240,
    ).stdout
    assert "line 2: record is 209715200 bytes, over --max-record-bytes 16777216" in out
    assert out.startswith("{'i': 0} {'i': 2} ")
    grown = int(out.split()[-1])
    # the cap (16 MiB: 15.4 MiB measured) and read buffers; reading the line whole takes 400 MiB (measured)
    assert grown < 24 * 2**20, f"peak RSS grew by {grown / 2**20:.1f} MiB skipping a 200 MiB line"


# --- files that cannot be read ---------------------------------------------------------------------------


def test_a_missing_file_is_one_error_naming_the_path_as_given_at_once() -> None:
    with pytest.raises(ValidationError, match=r"^data/items\.jsonl: file not found$"):
        read_records("data/items.jsonl")  # raised when called, not when first iterated
    with pytest.raises(ValidationError, match=r"^\./items\.csv: file not found$"):
        read_records("./items.csv")


def test_a_directory_is_one_error_naming_the_path() -> None:
    os.mkdir("items.json")
    with pytest.raises(ValidationError, match=r"^items\.json: is a directory, not a file$"):
        read_records("items.json")


def test_a_missing_file_or_a_directory_says_so_before_its_name_is_asked_for_a_format() -> None:
    os.mkdir("items")
    assert error_of("items") == "items: is a directory, not a file"
    assert error_of("items.txt") == "items.txt: file not found"


def through_a_pipe(content: bytes, fmt: str) -> tuple[list[Any] | None, str | None]:
    """`read_records` on a pipe (`--items <(zcat items.gz)`): a file that cannot be read twice."""
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(content)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        return list(read_records(f"/dev/fd/{read_end}", fmt)), None
    except ValidationError as exc:
        return None, str(exc)
    finally:
        writer.join()
        os.close(read_end)


def test_records_stream_from_a_pipe_and_a_json_error_there_names_where_reading_stopped() -> None:
    assert through_a_pipe(b"1\n2\n\n", "jsonl") == ([1, 2], None)
    assert through_a_pipe(b"id\n1\n", "csv") == ([{"id": "1"}], None)
    assert through_a_pipe(b"[1, 2]", "json") == ([1, 2], None)
    got, error = through_a_pipe(b"[1,\n2,\n3 4]", "json")
    assert got is None and error is not None
    assert error.endswith(": invalid JSON (after array element, I expect ',' or ']')")
    assert " after line 1, column 1: " in error  # the chunk that failed starts there: it cannot be read again


# --- the Python API and windows --------------------------------------------------------------------------


def test_an_iterable_source_is_yielded_as_it_is_and_lazily() -> None:
    marker = object()
    assert list(read_records([{"a": 1}, marker, "x"], "csv")) == [{"a": 1}, marker, "x"]
    endless = read_records(count(), "json")
    assert list(islice(endless, 3)) == [0, 1, 2]

    def once() -> Iterator[int]:
        yield 1
        raise AssertionError("read past what was asked")

    assert next(read_records(once())) == 1


def test_windows_are_consecutive_lists_of_at_most_size_records() -> None:
    assert list(windows(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(windows(range(6), 3)) == [[0, 1, 2], [3, 4, 5]]
    assert list(windows([], 3)) == []
    assert list(windows(range(3), 1)) == [[0], [1], [2]]
    assert list(islice(windows(count(), 2), 2)) == [[0, 1], [2, 3]]  # lazy: an endless source is fine
    with pytest.raises(ValueError, match="at least 1"):
        list(windows(range(3), 0))


def test_windows_of_a_file_keep_bad_records_in_place() -> None:
    write("items.jsonl", "1\n2\nbad\n4\n5\n")
    got = list(windows(read_records("items.jsonl", skip_bad=True), 2))
    assert [len(w) for w in got] == [2, 2, 1]
    assert got[0] == [1, 2] and got[1][1] == 4 and got[2] == [5]
    assert got[1][0] == BadRecord(3, "items.jsonl line 3: not JSON (Expecting value, column 1)")

"""Functions for examples/continue_errors.json: per-record checks where some records fail.

A record fails in one of two ways, both collected by `error_handling: "continue"`:
raising (the item's result is None and its error has an `exception_type`), or returning a string that
starts with "Error:" (the item's result keeps the namespace with that string).
"""

from __future__ import annotations

from typing import Any


def check_record(record: Any) -> Any:
    """Validate one `{"name": str, "age": int}` record and return it normalized."""
    if not isinstance(record, dict):
        raise TypeError(f"record must be an object, got {type(record).__name__}")
    name = record.get("name")
    if not isinstance(name, str) or not name.strip():
        return "Error: name is missing"
    age = record.get("age")
    if isinstance(age, bool) or not isinstance(age, int):
        raise ValueError(f"age of {name!r} must be an integer, got {age!r}")
    if not 0 <= age <= 150:
        raise ValueError(f"age of {name!r} out of range: {age}")
    return {"name": name.strip().title(), "age": age}


def summarize(results: list[Any]) -> dict[str, Any]:
    """The valid records' names and mean age, from a batch's `results`."""
    valid = []
    for entry in results:
        result = entry.get("result") if isinstance(entry, dict) else None
        if isinstance(result, dict):
            valid.append(result)
    mean_age = round(sum(r["age"] for r in valid) / len(valid), 2) if valid else None
    return {"valid": len(valid), "names": [r["name"] for r in valid], "mean_age": mean_age}

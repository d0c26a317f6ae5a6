"""Functions for examples/word_counts.json, called by the `python` node type.

Each function takes the node's params as keyword arguments; its return value becomes the node's `result`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def list_files(folder: str, pattern: str = "*.txt") -> list[str]:
    """The text files in `folder`, as sorted paths (relative when `folder` is)."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"folder not found: {folder}")
    return sorted(str(path) for path in root.glob(pattern) if path.is_file())


def count_words(path: str) -> dict[str, Any]:
    """Words and lines of one file (words are whitespace-separated)."""
    text = Path(path).read_text(encoding="utf-8")
    return {"path": path, "words": len(text.split()), "lines": len(text.splitlines())}


def total(counts: list[Any]) -> int:
    """Sum the words over a batch's `results` (each `{"result": {"words": n, ...}}`; failed items are None)."""
    words = 0
    for entry in counts:
        if isinstance(entry, dict):
            result = entry.get("result", entry)
            if isinstance(result, dict):
                words += int(result.get("words", 0))
    return words

"""What a model call cost, from the prices the user keeps: CHORDFLOW_LLM_PRICES names a JSON file (or holds the JSON
itself) mapping a model to its USD per million tokens, `{"openai/gpt-4o-mini": {"input": 0.15, "output": 0.6}}`
(an optional `"batch"` rate is read by provider batches). A model is looked up as written, then by the provider's
own name for it; a model without a price costs nothing known, and its calls report tokens only."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from ir.errors import SameForEveryItem
from worker import settings

VARIABLE = "CHORDFLOW_LLM_PRICES"


def table() -> dict[str, dict[str, float]]:
    """The user's prices (empty without CHORDFLOW_LLM_PRICES); read before a call is paid, so a bad file costs none."""
    source = settings.get("llm_prices")
    return _table(source) if source else {}


def cost(written: str, name: str, input_tokens: int | None, output_tokens: int | None) -> float | None:
    """USD of a call of `written` (the provider's `name` for it) that billed these tokens; None when unpriced."""
    known = table()
    price = known.get(written) or known.get(name)
    if price is None:
        return None
    return ((input_tokens or 0) * price["input"] + (output_tokens or 0) * price["output"]) / 1_000_000


@cache
def _table(source: str) -> dict[str, dict[str, float]]:
    """The prices, read once per process and value; a bad file stops the batch once (SameForEveryItem)."""
    try:
        text = source if source.lstrip().startswith("{") else Path(source).read_text()
        raw = json.loads(text)
    except (OSError, ValueError) as exc:
        raise SameForEveryItem(f"{VARIABLE}: cannot read the prices: {exc}") from None
    if not isinstance(raw, dict):
        raise SameForEveryItem(f"{VARIABLE}: expected a JSON object of model -> {{input, output}}")
    return {str(model): _price(model, entry) for model, entry in raw.items()}


def _price(model: str, entry: Any) -> dict[str, float]:
    ok = isinstance(entry, dict) and all(_rate(entry.get(key)) for key in ("input", "output"))
    if not ok:
        raise SameForEveryItem(
            f'{VARIABLE}: model {model!r}: expected {{"input": USD per 1M tokens, "output": ...}}, got {entry!r}'
        )
    return {key: float(value) for key, value in entry.items() if key in ("input", "output", "batch")}


def _rate(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

"""What a model call cost, from the prices the user keeps: CHORDFLOW_LLM_PRICES names a JSON file (or holds the JSON
itself) mapping a model to its USD per million tokens, `{"openai/gpt-4o-mini": {"input": 0.15, "output": 0.6}}`
An optional `"batch"` is what a provider batch's answers cost (worker/llm/provider_batches.py): a fraction of those
rates (`0.5`), or rates of its own (`{"input": 0.075, "output": 0.3}`); without it, half the rates, as OpenAI and
Anthropic charge. A model is looked up as written, then by the provider's own name for it; a model without a price
costs nothing known, and its calls report tokens only."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from ir.errors import SameForEveryItem
from worker import settings

VARIABLE = "CHORDFLOW_LLM_PRICES"
#: A provider batch's price, as a fraction of the model's, when the prices say none.
BATCH_FRACTION = 0.5


def table() -> dict[str, dict[str, Any]]:
    """The user's prices (empty without CHORDFLOW_LLM_PRICES); read before a call is paid, so a bad file costs none."""
    source = settings.get("llm_prices")
    return _table(source) if source else {}


def cost(
    written: str, name: str, input_tokens: int | None, output_tokens: int | None, *, batch: bool = False
) -> float | None:
    """USD of a call of `written` (the provider's `name` for it) that billed these tokens, answered in a provider
    batch when `batch`; None when unpriced."""
    known = table()
    price = known.get(written) or known.get(name)
    if price is None:
        return None
    rates = (price["input"], price["output"])
    if batch:
        own = price.get("batch", BATCH_FRACTION)
        rates = (own["input"], own["output"]) if isinstance(own, dict) else (rates[0] * own, rates[1] * own)
    return ((input_tokens or 0) * rates[0] + (output_tokens or 0) * rates[1]) / 1_000_000


@cache
def _table(source: str) -> dict[str, dict[str, Any]]:
    """The prices, read once per process and value; a bad file stops the batch once (SameForEveryItem)."""
    try:
        text = source if source.lstrip().startswith("{") else Path(source).read_text()
        raw = json.loads(text)
    except (OSError, ValueError) as exc:
        raise SameForEveryItem(f"{VARIABLE}: cannot read the prices: {exc}") from None
    if not isinstance(raw, dict):
        raise SameForEveryItem(f"{VARIABLE}: expected a JSON object of model -> {{input, output}}")
    return {str(model): _price(model, entry) for model, entry in raw.items()}


def _price(model: str, entry: Any) -> dict[str, Any]:
    ok = isinstance(entry, dict) and _rates(entry)
    batch = entry.get("batch") if isinstance(entry, dict) else None
    if not ok or not (batch is None or _rate(batch) or (isinstance(batch, dict) and _rates(batch))):
        raise SameForEveryItem(
            f'{VARIABLE}: model {model!r}: expected {{"input": USD per 1M tokens, "output": ..., optionally "batch": '
            f'a fraction or {{"input", "output"}}}}, got {entry!r}'
        )
    price: dict[str, Any] = {key: float(entry[key]) for key in ("input", "output")}
    if batch is not None:
        price["batch"] = {k: float(batch[k]) for k in ("input", "output")} if isinstance(batch, dict) else float(batch)
    return price


def _rates(entry: dict[str, Any]) -> bool:
    return all(_rate(entry.get(key)) for key in ("input", "output"))


def _rate(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

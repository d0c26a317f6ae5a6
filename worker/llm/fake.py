"""The offline model, answered only when a workflow names it: `"model": "fake"` (or CHORDFLOW_LLM_MODEL=fake).

Its answer is a function of (model, system, prompt), so tests and resumed runs can compare; its token counts are
words (whitespace-separated): input = words of system + prompt, output = words of the answer.
With a `schema` it answers the JSON of `data(schema, its text answer)`: a deterministic object valid for simple
schemas (see `data`), so offline examples and tests of structured output work without a provider.
`fake-throttled:N` is a test aid: it answers Throttled (Retry-After RETRY_AFTER seconds) to the first N calls of
each (model, system, prompt) in this process, then like `fake`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from ir.errors import Throttled
from worker import settings

FAKE = "fake"
THROTTLED = "fake-throttled:"
#: Seconds the throttled fake asks to wait: short, so tests stay fast, and fixed, so they stay deterministic.
RETRY_AFTER = 0.05

_throttled_calls: dict[tuple[str, str | None, str], int] = {}
_throttled_lock = threading.Lock()


def is_fake(model: str | None) -> bool:
    """Whether `model` names the offline fake ("fake", "fake-throttled:N")."""
    return model == FAKE or (model or "").startswith(THROTTLED)


def offline(model: str) -> bool:
    """Whether calls of `model` get the fake: it is named, or CHORDFLOW_LLM_MODEL=fake makes every call offline."""
    return is_fake(model) or settings.get("llm_model") == FAKE


def well_formed(model: str) -> bool:
    """False for a fake-throttled:N model name whose N is not a whole number (0 or more)."""
    return not model.startswith(THROTTLED) or model[len(THROTTLED) :].isdigit()


def response(model: str | None, system: str | None, prompt: str) -> str:
    """The same inputs always give the same answer."""
    digest = hashlib.sha256(json.dumps([model, system, prompt]).encode("utf-8")).hexdigest()[:10]
    return f"fake:{digest}: {prompt[:40]}"


def tokens(system: str | None, prompt: str, answer: str) -> tuple[int, int]:
    """(input, output) tokens the fake reports: whitespace-separated words, so tests can predict them."""
    return len((system or "").split()) + len(prompt.split()), len(answer.split())


def data(schema: dict[str, Any], text: str) -> Any:
    """A value of `schema` made from `text`, the same for the same inputs. Supported: `type` object (every property
    filled), string (`text`, cut to `maxLength`, padded to `minLength`), integer and number (the words of `text`,
    within `minimum`/`maximum`), boolean, null, array (`items`, `minItems` of them, at least one unless `maxItems`
    is 0), `enum` (one value, picked by `text`), `const`, and the first choice of `anyOf`/`oneOf`. Other keywords
    (`pattern`, `format`, `allOf`, `$ref`, ...) are not followed: an answer the schema refuses then fails its item
    with SchemaError, as a real model's would."""
    digest = int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][digest % len(schema["enum"])]
    for choice in ("anyOf", "oneOf"):
        if schema.get(choice):
            return data(schema[choice][0], text)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {name: data(part, text) for name, part in (schema.get("properties") or {}).items()}
    if kind == "array":
        count = min(max(schema.get("minItems", 0), 1), schema.get("maxItems", 2**31))
        return [data(schema.get("items") or {}, text) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -(2**31)) + 1)
        high = schema.get("maximum", schema.get("exclusiveMaximum", 2**31) - 1)
        return min(max(len(text.split()), low), high)
    if kind == "boolean":
        return digest % 2 == 0
    if kind == "null":
        return None
    return text[: schema.get("maxLength", len(text))].ljust(schema.get("minLength", 0), ".")


def answer(
    model: str, system: str | None, prompt: str, max_wait: float, schema: dict[str, Any] | None = None
) -> tuple[str, int, int]:
    """(text, input tokens, output tokens), after the throttles a `fake-throttled:N` model owes; with `schema`, the
    text is the JSON of `data`."""
    if model.startswith(THROTTLED):
        limit = int(model[len(THROTTLED) :])
        with _throttled_lock:
            seen = _throttled_calls[(model, system, prompt)] = _throttled_calls.get((model, system, prompt), 0) + 1
        if seen <= limit:
            raise Throttled(
                f"fake model {model}: rate limited (call {seen} of the first {limit})",
                retry_after=RETRY_AFTER,
                max_wait=max_wait,
            )
    text = response(model, system, prompt)
    if schema is not None:
        text = json.dumps(data(schema, text))
    return (text, *tokens(system, prompt, text))

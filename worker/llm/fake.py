"""The offline model, answered only when a workflow names it: `"model": "fake"` (or CHORDFLOW_LLM_MODEL=fake).

Its answer is a function of (model, system, prompt), so tests and resumed runs can compare; its token counts are
words (whitespace-separated): input = words of system + prompt, output = words of the answer.
`fake-throttled:N` is a test aid: it answers Throttled (Retry-After RETRY_AFTER seconds) to the first N calls of
each (model, system, prompt) in this process, then like `fake`.
"""

from __future__ import annotations

import hashlib
import json
import threading

from ir.errors import Throttled

FAKE = "fake"
THROTTLED = "fake-throttled:"
#: Seconds the throttled fake asks to wait: short, so tests stay fast, and fixed, so they stay deterministic.
RETRY_AFTER = 0.05

_throttled_calls: dict[tuple[str, str | None, str], int] = {}
_throttled_lock = threading.Lock()


def is_fake(model: str | None) -> bool:
    """Whether `model` names the offline fake ("fake", "fake-throttled:N")."""
    return model == FAKE or (model or "").startswith(THROTTLED)


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


def answer(model: str, system: str | None, prompt: str, max_wait: float) -> tuple[str, int, int]:
    """(text, input tokens, output tokens), after the throttles a `fake-throttled:N` model owes."""
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
    return (text, *tokens(system, prompt, text))
